"""The one console entry point: ``inceptionn <subcommand>``.

Each folder registers its own subcommands through a ``register(subparsers)`` function in its
``cli.py``; this file only wires them together and turns user mistakes into one clear line.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import UserError

# Modules whose register(subparsers) adds top-level subcommands, in --help order.
COMMAND_MODULES = [
    "inceptionn.demo",           # demo
    "inceptionn.bench.cli",      # bench codec, ...
    "inceptionn.kernel_tc.cli",  # link, testbed
    "inceptionn.daemon.cli",     # nicd, stats
    "inceptionn.shim.cli",       # run, mpirun
    "inceptionn.train.cli",      # train
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inceptionn",
        description="In-network gradient compression for commodity Linux hosts (INCEPTIONN, MICRO 2018).",
    )
    parser.add_argument("--version", action="version", version=f"inceptionn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
