"""What a job's ranks need in their environment for the MPI_Allreduce library, for any launcher.

The one place that computes it: ``inceptionn env`` prints it (for srun, sbatch, mpiexec.hydra or
a launcher of your own) and ``inceptionn mpirun`` passes it with ``-x``. The library is built
once per MPI ABI (setup.py): OpenMPI's (handles are pointers) and the MPICH family's (integers:
MPICH, Intel MPI, MVAPICH, Cray MPICH). Which one a job needs is read off the program (the libmpi
it links, or mpi4py's for a Python program) or given with ``--mpi``; the library itself refuses,
in one line, to run in a program of the other kind (collective/pmpi_abi.c).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from inceptionn import limits
from inceptionn.errors import UserError

from inceptionn.daemon.settings import DEFAULT_SOCKET as DEFAULT_NICD_SOCKET

from inceptionn.shim.run import preload_library

LIBRARIES = {"openmpi": "inceptionn.collective._pmpi_allreduce",
             "mpich": "inceptionn.collective._pmpi_allreduce_mpich"}
BUILT_WITH = {"openmpi": "OpenMPI's mpicc.openmpi or mpicc (libopenmpi-dev)",
              "mpich": "MPICH's mpicc.mpich (libmpich-dev)"}
FAMILY_NAME = {"openmpi": "OpenMPI", "mpich": "the MPICH ABI"}
MODES = ("auto", "nic", "app")


@functools.cache
def codecs() -> tuple[str, ...]:
    """The codecs the library runs, the first its default: the codec table's
    (codecs_c/codec_table.h) with a ring codec in C, as collective/pmpi_allreduce.c reads it.
    Imported here, so that --help imports nothing heavy."""
    from inceptionn.codecs import table
    return tuple(n for n in table.names() if table.traits(n)["c_app"])


@functools.cache
def nic_codecs() -> tuple[str, ...]:
    """Those the soft NIC runs."""
    from inceptionn.codecs import table
    return tuple(n for n in codecs() if table.traits(n)["c_nic"])

DEFAULT_MIN_COUNT = 65536            # collective/pmpi_allreduce.h INC_MPI_DEFAULT_MIN_COUNT
DEFAULT_ERROR_BOUND = limits.DEFAULT_ERROR_BOUND   # nicd's default --error-bound

# sonames: OpenMPI 3-5 keep libmpi.so.40; the MPICH ABI is libmpi.so.12 / libmpich*.so.12
_SONAMES = ((re.compile(r"libmpi\.so\.40$"), "openmpi"), (re.compile(r"lib(mpi|mpich\w*)\.so\.12$"), "mpich"))
_ANY_MPI = re.compile(r"lib(mpi|mpich\w*)\.so(\.\d+)*$")
_PYTHON = re.compile(r"python[0-9.]*$")


@dataclass
class Allreduce:
    """The --allreduce-* options (shared by inceptionn env and inceptionn mpirun)."""
    mode: str = "auto"
    min_count: int = DEFAULT_MIN_COUNT
    error_bound: int = DEFAULT_ERROR_BOUND
    error_feedback: bool | None = None   # None: the codec's wants_error_feedback (inceptionn's measured:
                                         # docs/collectives.md, "Error feedback's default, measured")
    nicd_socket: str | None = None     # nic mode: the soft NIC's stats socket (%h: the host's name)
    codec: str | None = None           # None: the library's default (codecs()[0])
    headroom: int = 0                  # bits of precision the scaled wire gives up for ratio (collective.Group's)


def check_mode(v: str) -> str:
    if v not in MODES:
        raise UserError(f"bad --allreduce-mode {v!r}: use auto, nic or app")
    return v


def check_codec(v: str | None) -> str:
    """A codec the library runs (None: its default)."""
    from inceptionn.codecs import table
    names = codecs()
    if v is None:
        return names[0]
    if v in table.names() and v not in names:
        raise UserError(f"--allreduce-codec {v}: the {v} codec runs through the Python API only (collective.Group, "
                        f"the DDP hook), not in the MPI library; use {', '.join(names[:-1])} or {names[-1]}")
    if v not in names:
        raise UserError(f"bad --allreduce-codec {v!r}: use {', '.join(names[:-1])} or {names[-1]}")
    return v


def error_feedback_default(codec: str) -> bool:
    """What the codec's traits ask for, as in collective.Group (never its name)."""
    from inceptionn.codecs import get_codec
    return bool(get_codec(codec).wants_error_feedback)

CHOICES = ("auto", "ring", "mpi")


def check_choose(v: str) -> str:
    if v not in CHOICES:
        raise UserError(f"bad --allreduce-choose {v!r}: use auto, ring or mpi")
    return v


def with_choice(settings: dict, env: dict[str, str], choose: str) -> tuple[dict, dict[str, str]]:
    """The library's settings and variables with its path choice (INCEPTIONN_MPI_CHOOSE, passed
    when not auto, the library's default); for inceptionn mpirun and inceptionn env."""
    choose = check_choose(choose)
    return {**settings, "choose": choose}, ({**env, "INCEPTIONN_MPI_CHOOSE": choose} if choose != "auto" else env)



def check_min_count(v: str) -> int:
    if not re.fullmatch(r"[0-9]{1,10}", v) or not 1 <= int(v) <= 2**31 - 1:
        raise UserError(f"bad --allreduce-min-count {v!r}: a number of values, 1..2147483647")
    return int(v)


def check_error_bound(v: str) -> int:
    lo, hi = limits.ERROR_BOUND_MIN, limits.ERROR_BOUND_MAX
    if not re.fullmatch(r"-[0-9]{1,2}", v) or not lo <= int(v) <= hi:
        raise UserError(f"bad --allreduce-error-bound {v!r}: use {lo}..{hi} (nicd --error-bound)")
    return int(v)


def check_headroom(h) -> int:
    if problem := limits.headroom_problem(h):
        raise UserError(f"bad headroom: {problem}")
    return h


def check_headroom_arg(v: str) -> int:
    """--allreduce-headroom's text as a headroom."""
    if not re.fullmatch(r"[0-9]{1,3}", v):
        raise UserError(f"bad --allreduce-headroom {v!r}: {limits.headroom_problem(v)}")
    h = int(v)
    if problem := limits.headroom_problem(h):
        raise UserError(f"bad --allreduce-headroom {v!r}: {problem}")
    return h


def check_nicd_socket(v: str) -> str:
    if not v.startswith("/") or len(v) > 100 or "\n" in v:
        raise UserError(f"bad --allreduce-nicd-socket {v[:40]!r}: an absolute path under 100 bytes (%h: the host's name)")
    return v


def check_iface(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.:/-]{1,64}", v):
        raise UserError(f"bad --iface {v!r}: an interface name or a network like 198.18.0.0/24")
    return v


def library(family: str) -> str:
    return preload_library(LIBRARIES[family], f"the MPI_Allreduce library for {FAMILY_NAME[family]} "
                                              f"(built when {BUILT_WITH[family]} is there at build time)")


# --- which MPI a program runs ----------------------------------------------------------------------

def _linked(path: str) -> list[str]:
    """The file names of the shared libraries ``path`` loads (ldd)."""
    try:
        out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"cannot read the libraries of {path}: {exc}") from None
    return [line.split()[0].rsplit("/", 1)[-1] for line in out.splitlines() if line.split()]


def _interpreter(exe: str) -> str | None:
    """The Python interpreter that runs ``exe``: itself, or its #! line's; None if not Python."""
    if _PYTHON.match(os.path.basename(exe)):
        return exe
    try:
        with open(exe, "rb") as f:
            first = f.readline(256).decode("utf-8", "replace")
    except OSError:
        return None
    if first.startswith("#!"):
        words = first[2:].split()
        if words and os.path.basename(words[0]) == "env":
            words = [w for w in words[1:] if not w.startswith("-")]
        if words and _PYTHON.match(os.path.basename(words[0])):
            return shutil.which(words[0]) or words[0]
    return None


def program_mpi(argv: list[str]) -> tuple[str | None, str]:
    """(family, what was read): family "openmpi" or "mpich", or None when nothing tells (not here,
    a shell script, a program without MPI, Python without mpi4py). A libmpi of neither ABI is an
    error."""
    exe = shutil.which(argv[0])
    if not exe:
        return None, f"{argv[0]} (not found on this host)"
    python = _interpreter(exe)
    if python:
        try:
            r = subprocess.run([python, "-c", "import mpi4py.MPI as m; print(m.__file__)"], capture_output=True,
                               text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None, f"{argv[0]} (Python: cannot start it)"
        if r.returncode != 0 or not r.stdout.strip():
            return None, f"{argv[0]} (Python without mpi4py)"
        target = r.stdout.strip().splitlines()[-1]
        what = f"{argv[0]} (mpi4py at {target})"
    else:
        with open(exe, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None, f"{argv[0]} (not a binary)"
        target, what = exe, argv[0]
    for name in _linked(target):
        for pattern, family in _SONAMES:
            if pattern.match(name):
                return family, what
    for name in _linked(target):
        if _ANY_MPI.match(name):
            raise UserError(f"{what} runs {name}, neither OpenMPI (libmpi.so.40) nor the MPICH ABI (libmpi.so.12, "
                            "libmpich.so.12): the MPI_Allreduce library supports only those")
    return None, f"{what} (links no MPI library)"


# --- the environment -------------------------------------------------------------------------------

def allreduce_env(a: Allreduce, family: str, nic_running: bool, iface: str | None,
                  log: bool) -> tuple[dict, dict[str, str]]:
    """The MPI_Allreduce library's settings (for reports) and the variables that carry them to
    the ranks; ``nic_running``: whether the soft NIC runs on every host checked (mode auto)."""
    a = dataclasses.replace(a, codec=check_codec(a.codec))
    if a.mode == "nic" and a.codec not in nic_codecs():
        raise UserError(f"--allreduce-mode nic runs only the {' or '.join(nic_codecs())} codec (the soft NIC's): --allreduce-codec "
                        f"{a.codec} needs --allreduce-mode app (or auto)")
    lib = library(family)
    # auto: nic only where the soft NICs can run the codec
    mode = a.mode if a.mode != "auto" else ("nic" if nic_running and a.codec in nic_codecs() else "app")
    feedback = error_feedback_default(a.codec) if a.error_feedback is None else a.error_feedback
    env = {"INCEPTIONN_MPI_MODE": mode, "INCEPTIONN_MPI_CODEC": a.codec, "INCEPTIONN_MPI_MIN_COUNT": str(a.min_count),
           "INCEPTIONN_MPI_ERROR_BOUND": str(a.error_bound)}
    if iface:
        env["INCEPTIONN_MPI_IFACE"] = iface
    env["INCEPTIONN_MPI_ERROR_FEEDBACK"] = "1" if feedback else "0"
    env["INCEPTIONN_MPI_HEADROOM"] = str(check_headroom(a.headroom))
    if a.nicd_socket:
        env["INCEPTIONN_MPI_NICD_SOCKET"] = a.nicd_socket
    if log:
        env["INCEPTIONN_MPI_LOG"] = "1"
    settings = {"library": lib, "mpi": family, "mode": mode, "requested_mode": a.mode, "codec": a.codec,
                "min_count": a.min_count, "error_bound": a.error_bound, "error_feedback": feedback,
                "headroom": a.headroom, "iface": iface, "log": log, "nicd_socket": a.nicd_socket or DEFAULT_NICD_SOCKET}
    return settings, env


def with_library(rank_env: dict[str, str], lib: str, base: dict | None = None) -> dict[str, str]:
    """``rank_env`` with ``lib`` last in LD_PRELOAD: after the tagging library when there is one
    (it must see connect() first), else after what the user preloads already."""
    base = os.environ if base is None else base
    libs = rank_env.get("LD_PRELOAD", "").split() or base.get("LD_PRELOAD", "").replace(":", " ").split()
    return {**rank_env, "LD_PRELOAD": " ".join([*[p for p in libs if p != lib], lib])}


# --- inceptionn env ---------------------------------------------------------------------------------

FORMATS = ("srun", "shell", "hydra")


def render(env: dict[str, str], fmt: str) -> str:
    """``env`` for a launcher: srun (``--export=ALL,$(...)``), hydra (``-genv`` pairs) or shell
    (export lines, for a batch script's ``eval``). LD_PRELOAD's list is written with ':' so the
    first two survive the shell's word splitting."""
    env = {k: (v.replace(" ", ":") if k == "LD_PRELOAD" else v) for k, v in env.items()}
    if fmt == "shell":
        import shlex
        return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    bad = next((f"{k}={v}" for k, v in env.items() if re.search(r"[\s,'\"$`\\]", v)), None)
    if bad:
        raise UserError(f"{bad!r} cannot be written for {fmt} (a space, comma or quote in it): use --format shell")
    if fmt == "srun":
        return ",".join(f"{k}={v}" for k, v in env.items())
    return " ".join(f"-genv {k} {v}" for k, v in env.items())


def run_env(args) -> int:
    import json
    import sys
    if not args.compress_allreduce:
        raise UserError("nothing to print: give --compress-allreduce (see inceptionn env --help)")
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    family = args.mpi
    if command:
        found, what = program_mpi(command)
        if found is None and family is None:
            raise UserError(f"cannot tell which MPI {what} runs: give --mpi openmpi or --mpi mpich")
        if found and family and found != family:
            raise UserError(f"{what} runs {FAMILY_NAME[found]}, not --mpi {family}")
        family = family or found
    elif family is None:
        raise UserError("which MPI does the job run? give --mpi openmpi or --mpi mpich, or the program after -- "
                        "to read it from")
    feedback = True if args.allreduce_error_feedback else False if args.no_allreduce_error_feedback else None
    a = Allreduce(check_mode(args.allreduce_mode), check_min_count(args.allreduce_min_count),
                  check_error_bound(args.allreduce_error_bound), feedback,
                  check_nicd_socket(args.allreduce_nicd_socket) if args.allreduce_nicd_socket else None,
                  check_codec(args.allreduce_codec), check_headroom_arg(args.allreduce_headroom))
    iface = check_iface(args.iface) if args.iface else None
    nic = False
    if a.mode == "auto" and a.codec in nic_codecs():   # only this host can be checked; the job's hosts may differ
        from inceptionn.daemon.rules import nic_status
        nic = nic_status()["running"]
    settings, env = allreduce_env(a, family, nic, iface, args.log)
    settings, env = with_choice(settings, env, args.allreduce_choose)
    env = with_library(env, settings["library"])   # after what the caller preloads already
    if args.json:
        print(json.dumps({"mpi": family, "allreduce": settings, "env": env}, indent=2))
        return 0
    if a.mode == "auto" and a.codec not in nic_codecs():
        print(f"inceptionn env: {FAMILY_NAME[family]}, mode app (auto: the soft NIC runs only the {' or '.join(nic_codecs())} codec, "
              f"{a.codec} runs in the ranks)", file=sys.stderr)
    elif a.mode == "auto":
        print(f"inceptionn env: {FAMILY_NAME[family]}, mode {settings['mode']} (auto: the soft NIC "
              f"{'runs' if nic else 'does not run'} on this host; the job's hosts are not checked)", file=sys.stderr)
    print(render(env, args.format))
    return 0
