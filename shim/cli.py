"""``inceptionn run``, ``inceptionn mpirun`` and ``inceptionn env``: the tagging shim around a program
or an MPI job, and the MPI_Allreduce library's environment for any launcher."""
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

    e = sub.add_parser(
        "env", help="print the environment that puts the MPI_Allreduce library into a job, for any launcher",
        description=ENV_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="inceptionn env --compress-allreduce [--mpi openmpi|mpich] [options] [--format F | --json] "
              "[-- PROG ARGS]")
    e.defer(_add_env_arguments)  # the headroom's range in its help loads the codecs (numpy)
    e.set_defaults(func=_env)


def _add_env_arguments(e) -> None:
    from inceptionn import limits
    from inceptionn.collective.pmpi_env import DEFAULT_ERROR_BOUND, DEFAULT_MIN_COUNT, FORMATS
    e.add_argument("--compress-allreduce", action="store_true",
                   help="the MPI_Allreduce library (docs/mpi-allreduce.md); required")
    e.add_argument("--mpi", choices=("openmpi", "mpich"),
                   help="the job's MPI: openmpi, or mpich for the MPICH ABI (MPICH, Intel MPI, MVAPICH, Cray "
                        "MPICH); default: read from PROG")
    e.add_argument("--allreduce-mode", default="auto", metavar="M",
                   help="nic (the soft NICs compress), app (the codec in the ranks) or auto "
                        "(default: nic when the soft NIC runs on this host, which is all that is checked)")
    e.add_argument("--allreduce-codec", metavar="NAME",
                   help="inceptionn (default), or thc, 3lc or terngrad (app mode only), at the Python codecs' "
                        "defaults; fft runs through the Python API only")
    e.add_argument("--allreduce-min-count", default=str(DEFAULT_MIN_COUNT), metavar="N",
                   help=f"smallest count taken (default {DEFAULT_MIN_COUNT} values)")
    e.add_argument("--allreduce-error-bound", default=str(DEFAULT_ERROR_BOUND), metavar="K",
                   help=f"the codec's error bound 2^K, {limits.ERROR_BOUND_MIN}..{limits.ERROR_BOUND_MAX} "
                        f"(default {DEFAULT_ERROR_BOUND}; with nic: the daemons' --error-bound)")
    e.add_argument("--allreduce-headroom", default="0", metavar="H",
                   help="bits of precision each scaled block gives up for a higher ratio (codecs that scale: "
                        f"inceptionn), 0 (default, the most precise) to {limits.MAX_HEADROOM}; the same on "
                        "every rank (docs/collectives.md, 'Headroom')")
    ef = e.add_mutually_exclusive_group()
    ef.add_argument("--allreduce-error-feedback", action="store_true",
                    help="carry what the codec lost in a call into the next call of the same count on the same "
                         "communicator (default: what the codec asks for: on, off for terngrad)")
    ef.add_argument("--no-allreduce-error-feedback", action="store_true",
                    help="do not: every call compressed on its own")
    e.add_argument("--allreduce-nicd-socket", metavar="PATH",
                   help="nic mode: the soft NIC's stats socket on every host (%%h: the host's name; default "
                        "nicd's); the ranks run the bound the daemon runs")
    e.add_argument("--allreduce-choose", default="auto", metavar="C",
                   help="auto (default: per communicator and count class, the ring or MPI's own allreduce, "
                        "whichever its first calls measured faster), ring or mpi (always that one)")
    e.add_argument("--iface", metavar="IF|CIDR",
                   help="the ring's network: an interface name or a.b.c.d/len (default: each rank's first "
                        "non-loopback IPv4 address)")
    e.add_argument("--log", action="store_true", help="the library's lines on every rank's stderr")
    e.add_argument("--format", choices=FORMATS, default="srun",
                   help="srun: NAME=VALUE,... for srun --export=ALL,$(...) (default); hydra: -genv NAME VALUE "
                        "pairs for mpiexec.hydra; shell: export lines for eval in a batch script")
    e.add_argument("--json", action="store_true", help="the settings and the variables as JSON")
    e.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PROG ARGS",
                   help="the job's program: which MPI it runs is read from it (its libmpi, or mpi4py's)")


ENV_DESCRIPTION = """\
Print the variables that put the MPI_Allreduce library and its settings into every rank of a job
started by any launcher: LD_PRELOAD (the build for the job's MPI: OpenMPI's or the MPICH ABI's)
and INCEPTIONN_MPI_*. Nothing runs; the program after -- is only read (which MPI it links).
See docs/launchers.md.

examples:
  srun --mpi=pmix --export=ALL,$(inceptionn env --compress-allreduce -- ./train) ./train
  mpiexec.hydra $(inceptionn env --compress-allreduce --mpi mpich --format hydra) -n 4 ./train
  eval "$(inceptionn env --compress-allreduce --mpi mpich --format shell)"   # in an sbatch script
"""


def _env(args) -> int:
    from inceptionn.collective.pmpi_env import run_env
    return run_env(args)


def _run(args) -> int:
    from .run import run
    if args.print_env and args.command and args.command != ["--"]:
        raise UserError("--print-env prints the variables and runs nothing: leave out the program")
    return run(args)


def _mpirun(args) -> int:
    from .mpirun import run
    return run(list(args.rest))
