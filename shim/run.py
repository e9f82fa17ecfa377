"""``inceptionn run``: start a program with the tagging library preloaded and a policy.

    inceptionn run --tag port=23000-23099 -- python train.py

The policy is checked here first (a clear one-line error), then handed to the library through
INCEPTIONN_TAG, which checks it again as it loads. The program replaces this process (exec), so
signals, standard streams and the exit status are the program's own.
"""
from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

from inceptionn.errors import UserError

from .policy import Policy, check_log, check_policy

PRELOAD_MODULE = "inceptionn.shim._tagpreload"
ENV_POLICY = "INCEPTIONN_TAG"
ENV_LOG = "INCEPTIONN_TAG_LOG"


def preload_library(module: str = PRELOAD_MODULE, what: str = "the tagging library") -> str:
    """Absolute path of a built LD_PRELOAD library (built by the package build as the file of
    an extension module; it is never imported): the tagging library, or with ``module`` another
    (inceptionn.collective._pmpi_allreduce)."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.origin and os.path.isfile(spec.origin):
        return os.path.abspath(spec.origin)
    pkg, _, stem = module.rpartition(".")
    here = Path(__file__).resolve().parent.parent / pkg.split(".", 1)[1].replace(".", "/")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(str(here / f"{stem}{suffix}"))
        if found:
            return found[0]
    raise UserError(f"{what} (inceptionn/{pkg.split('.', 1)[1].replace('.', '/')}/{stem}*.so) is not built: "
                    "reinstall the package (`make`, or `pip install -e .`)")


def preload_env(policy: Policy, log: str | None = None, base: dict | None = None) -> dict[str, str]:
    """The variables that put the library and the policy into a program's environment."""
    base = os.environ if base is None else base
    lib = preload_library()
    # keep what the user preloads already; ours first so it sees connect() before anything else
    others = [p for p in base.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != lib]
    env = {"LD_PRELOAD": " ".join([lib, *others]), ENV_POLICY: policy.canonical}
    if log:
        env[ENV_LOG] = check_log(log)
    return env


def policy_arg(text: str | None, command: str) -> Policy:
    """--tag, or INCEPTIONN_TAG from the environment; one of them is required."""
    if text is None:
        text = os.environ.get(ENV_POLICY)
    if text is None:
        raise UserError(f"{command} needs --tag POLICY (for example --tag port=23000-23099; "
                        "--tag none to tag only what the program tags itself); see docs/shim.md")
    return check_policy(text)


def split_command(rest: list[str], command: str) -> list[str]:
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise UserError(f"no program given: inceptionn {command} [options] -- PROG ARGS...")
    return rest


def find_program(name: str, path: str | None = None) -> str:
    if os.sep in name:
        if not (os.path.isfile(name) and os.access(name, os.X_OK)):
            raise UserError(f"cannot run {name}: no such executable file")
        return name
    found = shutil.which(name, path=path)
    if not found:
        raise UserError(f"cannot run {name}: not found on PATH")
    return found


def run(args) -> int:
    policy = policy_arg(args.tag, "run")
    added = preload_env(policy, args.log)
    if args.print_env:
        for key, value in added.items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    argv = split_command(list(args.command), "run")
    env = dict(os.environ)
    env.update(added)
    exe = find_program(argv[0], env.get("PATH"))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(exe, argv, env)
    except OSError as exc:
        raise UserError(f"cannot run {argv[0]}: {exc.strerror}") from None
    return 127  # not reached
