"""``inceptionn run`` and ``inceptionn mpirun``: the tagging shim around a program or an MPI job."""
from __future__ import annotations

import argparse

from inceptionn.errors import UserError

from .contract import TOS_TAGGED

RUN_DESCRIPTION = f"""\
Run PROG with the tagging library preloaded (LD_PRELOAD): its TCP sockets that match POLICY
get the gradient ToS ({TOS_TAGGED:#04x} unless tos= says otherwise) before they connect or listen, so the
soft NIC compresses them. Nothing in the program changes; UDP and unix sockets are never
tagged. A bad policy is refused before PROG starts. See docs/shim.md.

policy terms (comma separated; selectors add up):
  all | none                   every TCP socket | only what the program tags itself
  port=N[-M]                   the service port at either end (connect to it, or listen/accept on it)
  rport=N[-M] / lport=N[-M]    only the connecting side / only the listening side
  net=ADDR[/LEN]               peers in that IPv4 or IPv6 network
  tos=V                        the mark, a multiple of 4 (default {TOS_TAGGED:#04x})
  override=keep|allow          keep (default): the tag survives the program's own IP_TOS calls

example:
  inceptionn run --tag port=23000-23099 -- python train.py
"""


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run a program with its gradient sockets tagged (LD_PRELOAD)",
        description=RUN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="inceptionn run [--tag POLICY] [--log DEST] [--print-env] -- PROG ARGS...")
    p.add_argument("--tag", metavar="POLICY", help="what to tag (default: $INCEPTIONN_TAG; one of the two is required)")
    p.add_argument("--log", metavar="DEST",
                   help="log of the library: 1 (tagged sockets, on stderr), 2 (also untagged ones and why), "
                        "/PATH (appended), or LEVEL:/PATH")
    p.add_argument("--print-env", action="store_true",
                   help="print the variables as shell export lines instead of running anything "
                        "(for launchers of your own)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PROG ARGS", help="the program and its arguments")
    p.set_defaults(func=_run)

    m = sub.add_parser(
        # prefix_chars="+": no '-' argument is an option of this parser, so all of them, mpirun's
        # included, reach the wrapper's own parser (shim/mpirun.py) in order
        "mpirun", add_help=False, prefix_chars="+", help="OpenMPI's mpirun with gradient sockets tagged in every rank",
        usage="inceptionn mpirun [--tag POLICY] [--testbed NAME] [options] [mpirun args] -- PROG ARGS...",
        description="Run inceptionn mpirun --help for the options.")
    m.add_argument("rest", nargs=argparse.REMAINDER)
    m.set_defaults(func=_mpirun)


def _run(args) -> int:
    from .run import run
    if args.print_env and args.command and args.command != ["--"]:
        raise UserError("--print-env prints the variables and runs nothing: leave out the program")
    return run(args)


def _mpirun(args) -> int:
    from .mpirun import run
    return run(list(args.rest))
