"""The one console entry point: ``inceptionn <subcommand>``.

Each folder registers its own subcommands through a ``register(subparsers)`` function in its
``cli.py``; this file only wires them together and turns user mistakes into one clear line.

Start-up stays fast (``--help``, ``--version``, ``stats``): the ``cli.py`` modules import nothing
heavy (numpy, pyroute2, cffi, torch) at module level; a subcommand whose options need a heavy
module to be described adds them through ``Parser.defer``, so they are built only when that
subcommand is chosen.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from . import __version__
from .errors import UserError

# Modules whose register(subparsers) adds top-level subcommands, in --help order.
COMMAND_MODULES = [
    "inceptionn.demo",           # demo
    "inceptionn.bench.cli",      # bench tiers, ...
    "inceptionn.kernel_tc.cli",  # link, testbed
    "inceptionn.daemon.cli",     # nicd, stats
    "inceptionn.shim.cli",       # run, mpirun
    "inceptionn.train.cli",      # train
]

_RST_LITERAL = re.compile(r"``(.+?)``")
_INVALID_TYPE = re.compile(r"invalid (\w+) value:")
_TYPE_WORDS = {"int": "a whole number", "float": "a number"}


class Parser(argparse.ArgumentParser):
    """argparse with the project's error style, inherited by every subparser: a mistake is one
    line ``inceptionn: error: MESSAGE (see inceptionn SUBCOMMAND --help)``, exit code 2, no usage
    dump, and leftover arguments are reported by the subcommand that was given them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deferred = []

    def add_argument(self, *args, **kwargs):
        # -j is short for --json on every subcommand, as in iproute2
        if "--json" in args and "-j" not in args and "-j" not in self._option_string_actions:
            args = ("-j", *args)
        return super().add_argument(*args, **kwargs)

    def defer(self, fill) -> None:
        """Call ``fill(self)`` to add this parser's arguments only when it is used (parsing or
        help), so modules those arguments need are not imported for other subcommands."""
        self._deferred.append(fill)

    def _fill(self) -> None:
        while self._deferred:
            self._deferred.pop(0)(self)

    def parse_known_args(self, args=None, namespace=None):
        self._fill()
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            # Here, not in the top-level parser: the message names this subcommand.
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def format_help(self) -> str:
        self._fill()
        # Descriptions reuse module docstrings; a terminal shows ``x`` as noise.
        return _RST_LITERAL.sub(r"\1", super().format_help())

    def format_usage(self) -> str:
        self._fill()
        return super().format_usage()

    def error(self, message: str):
        # "invalid int value: 'x'" names a Python type (or a helper function) instead of saying
        # what was expected
        message = _INVALID_TYPE.sub(lambda m: f"expected {_TYPE_WORDS.get(m.group(1), 'another value')}, got",
                                    message)
        if message.endswith("expected one argument"):
            # argparse takes "-5mbit" for an option; the = form passes it as a value
            message += " (for a value starting with '-', write --option=VALUE)"
        print(f"inceptionn: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> Parser:
    parser = Parser(
        prog="inceptionn",
        description="In-network gradient compression for commodity Linux hosts (INCEPTIONN, MICRO 2018).",
    )
    parser.add_argument("--version", action="version", version=f"inceptionn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # subparsers are Parser too
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that folder has no commands yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"inceptionn: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inceptionn: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head and the like
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
