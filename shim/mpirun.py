"""``inceptionn mpirun``: OpenMPI's mpirun with the tagging library in every rank.

    inceptionn mpirun --tag port=23000-23099 --testbed tb -np 4 -- ./train

What it adds to the real mpirun:

- ``-x LD_PRELOAD=<library> -x INCEPTIONN_TAG=<policy>`` (and the log setting): the ranks get
  the library and the policy; mpirun and the orted daemons never do (their out-of-band sockets
  can never be tagged).
- MCA parameters: the ob1 PML over the TCP BTL (no UCX or OFI, whose sockets nobody pinned),
  the BTL's listening ports pinned to ``--btl-ports`` (IPv4 and IPv6), interface selection
  (``--iface``, the testbed's network by default). Whatever the user passes with --mca wins.
- The contract check: only gradient sockets may be tagged, never MPI's. The policy must use
  port selectors (or ``none``), and its ports must not overlap the BTL's; a policy overlapping
  the ephemeral port range (where MPI's unpinned listeners, such as the PMIx server on
  127.0.0.1, get their ports) draws a warning.
- Root: OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) when run as root.
- ``--testbed NAME``: one slot per testbed host (``--slots``), mpirun itself runs in the first
  host, ranks yield when idle if the testbed holds more ranks than this machine has cores, and an rsh agent (rsh_agent.py) enters each host's network namespace with its own UTS
  namespace and host name. No /etc/hosts entry is needed: hosts are given by address.
- Before launch, one line per host on stderr: whether the soft NIC (nicd) runs there, read from
  its netfilter rules and the bound NFQUEUE queues of that host's namespace.
- ``--compress-allreduce``: the MPI_Allreduce library (collective/pmpi_allreduce.c) preloaded
  too, with its settings (INCEPTIONN_MPI_*): float32 sums of unmodified programs go through the
  INCEPTIONN ring, compressed by the soft NICs ("nic") or in the library ("app").
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from inceptionn.collective import pmpi_env
from inceptionn.collective.pmpi_env import DEFAULT_ERROR_BOUND, DEFAULT_MIN_COUNT
from inceptionn.limits import ERROR_BOUND_MAX, ERROR_BOUND_MIN
from inceptionn.daemon import rules
from inceptionn.daemon.settings import DEFAULT_SOCKET as DEFAULT_NICD_SOCKET
from inceptionn.errors import UserError

from .contract import TOS_SCALED, TOS_TAGGED
from .policy import Policy, check_log
from .run import ENV_LOG, ENV_POLICY, policy_arg, preload_env

DEFAULT_BTL_PORTS = (61000, 61099)   # above the default ephemeral range (32768-60999)

# wrapper option -> takes a value
OPTIONS = {"--tag": True, "--log": True, "--testbed": True, "--slots": True, "--iface": True,
           "--btl-ports": True, "--mpirun": True, "--dry-run": False, "--json": False,
           "--compress-allreduce": False, "--allreduce-mode": True, "--allreduce-min-count": True,
           "--allreduce-choose": True,
           "--allreduce-error-bound": True, "--allreduce-error-feedback": False, "--no-allreduce-error-feedback": False,
           "--allreduce-nicd-socket": True, "--allreduce-codec": True, "--allreduce-headroom": True}
SHORT = {"-j": "--json"}             # as in every other subcommand; mpirun has no -j
HOST_ARGS = {"-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile", "--machinefile",
             "-default-hostfile", "--default-hostfile"}

USAGE = ("inceptionn mpirun [--tag POLICY] [--compress-allreduce] [--testbed NAME] [options] [mpirun args] "
         "-- PROG ARGS...")
HELP = f"""usage: {USAGE}

Run OpenMPI's mpirun with the tagging library preloaded into every rank, so the job's gradient
sockets carry ToS {TOS_SCALED:#04x} and MPI's own sockets do not (see docs/shim.md): the soft NIC scales
each packet of raw gradients by a power of two (tos={TOS_TAGGED:#04x} in the policy for senders that scale
their own values and predict the receiver's decode: the paper's codec).

wrapper options (anywhere before the --; everything else before it goes to mpirun):
  --tag POLICY        what to tag (default: $INCEPTIONN_TAG): port selectors only, e.g.
                      port=23000-23099, or none (only what the program tags itself); optional
                      with --compress-allreduce
  --log DEST          the library's log in every rank: 1 (tagged sockets, stderr), 2 (also
                      untagged ones and why), /PATH (appended), or LEVEL:/PATH; with
                      --compress-allreduce also the MPI_Allreduce library's lines (stderr)
  --compress-allreduce
                      preload the MPI_Allreduce library: the program's float32 MPI_SUM
                      allreduces of at least --allreduce-min-count values run the INCEPTIONN
                      ring, compressed (docs/mpi-allreduce.md); everything else is MPI's own.
                      OpenMPI programs only: for MPICH, srun or sbatch, `inceptionn env`
                      prints the same environment (docs/launchers.md)
  --allreduce-mode M  nic (ring sockets tagged: the soft NICs compress), app (the codec in
                      the ranks, no daemon needed) or auto (default: nic when every host's
                      soft NIC runs, else app)
  --allreduce-codec NAME
                      inceptionn (default), or thc, 3lc or terngrad (app mode only; auto
                      then picks app), at the Python codecs' defaults; fft runs through the
                      Python API only
  --allreduce-min-count N
                      smallest count taken (default {DEFAULT_MIN_COUNT} values)
  --allreduce-error-bound K
                      the codec's error bound 2^K, {ERROR_BOUND_MIN}..{ERROR_BOUND_MAX} (default {DEFAULT_ERROR_BOUND}; with nic it
                      must be the daemons' --error-bound)
  --allreduce-headroom H
                      bits of precision each scaled block gives up for a higher ratio (codecs
                      that scale: inceptionn), 0 (default, the most precise) up to the
                      scaling's maximum (`inceptionn env --help` says it; docs/collectives.md,
                      "Headroom")
  --allreduce-error-feedback, --no-allreduce-error-feedback
                      add what the codec lost in a call to the next call of the same count on
                      the same communicator, or not (default: what the codec asks for: on,
                      off for terngrad; docs/mpi-allreduce.md)
  --allreduce-nicd-socket PATH
                      nic mode: the soft NIC's stats socket on every host (%h: the host's
                      name; default nicd's, {DEFAULT_NICD_SOCKET}); the ranks run the bound
                      the daemon runs, and a rank that cannot read it turns the library off
  --allreduce-choose C
                      auto (default): per communicator and count class, the ring or MPI's
                      own allreduce, whichever its first calls measured faster (re-measured
                      rarely); ring: always the ring; mpi: always MPI's own
  --testbed NAME      launch on the hosts of testbed NAME (`inceptionn testbed up`)
  --slots N           ranks per testbed host (default 1)
  --iface IF|CIDR     network for MPI's TCP traffic (btl/oob_tcp_if_include; default with
                      --testbed: the testbed's network)
  --btl-ports LO-HI   ports of MPI's TCP BTL listeners (default {DEFAULT_BTL_PORTS[0]}-{DEFAULT_BTL_PORTS[1]}); must
                      not overlap the tag policy
  --mpirun PATH       the real mpirun (default: mpirun on PATH)
  --dry-run           print the soft NIC report and the command, launch nothing
  --json, -j          with --dry-run: print them as JSON
  -h, --help          this help

Before launching, prints one line per host on stderr: whether the soft NIC runs there.
Without --testbed only this host is checked.

example:
  inceptionn mpirun --tag port=23000-23099 --testbed tb -np 4 -- ./train --epochs 3
"""


@dataclass
class Options:
    tag: str | None = None
    log: str | None = None
    testbed: str | None = None
    slots: int = 1
    iface: str | None = None
    btl_ports: tuple[int, int] = DEFAULT_BTL_PORTS
    mpirun: str | None = None
    dry_run: bool = False
    json: bool = False
    help: bool = False
    mpirun_args: list[str] = field(default_factory=list)
    program: list[str] = field(default_factory=list)
    compress_allreduce: bool = False
    allreduce_mode: str = "auto"
    allreduce_choose: str = "auto"
    allreduce_min_count: int = DEFAULT_MIN_COUNT
    allreduce_error_bound: int = DEFAULT_ERROR_BOUND
    allreduce_error_feedback: bool | None = None    # None: the codec's default
    allreduce_nicd_socket: str | None = None
    allreduce_codec: str | None = None       # None: the library's default
    allreduce_headroom: int = 0


def parse_args(rest: list[str]) -> Options:
    """Split ``[wrapper options and mpirun args] -- PROG ARGS`` (wrapper options are only ever
    recognised by their exact names, which mpirun does not use)."""
    opts = Options()
    if "--" in rest:
        cut = rest.index("--")
        before, opts.program = rest[:cut], rest[cut + 1:]
    else:
        before = rest
    values: dict[str, str | bool] = {}
    i = 0
    while i < len(before):
        arg = before[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (SHORT.get(arg, arg), "", "")
        if arg in ("-h", "--help"):
            opts.help = True
        elif name in OPTIONS:
            if name in values:
                raise UserError(f"{name} given twice")
            if OPTIONS[name]:
                if not eq:
                    i += 1
                    if i == len(before):
                        raise UserError(f"{name} needs a value (see inceptionn mpirun --help)")
                    value = before[i]
                values[name] = value
            else:
                if eq:
                    raise UserError(f"{name} takes no value")
                values[name] = True
        else:
            opts.mpirun_args.append(arg)
        i += 1
    if opts.help:
        return opts
    if "--" not in rest:
        raise UserError(f"put -- before the program: {USAGE}")
    if not opts.program:
        raise UserError(f"no program after --: {USAGE}")
    opts.tag = values.get("--tag")
    opts.log = check_log(values["--log"]) if "--log" in values else None
    opts.testbed = values.get("--testbed")
    opts.iface = values.get("--iface")
    opts.mpirun = values.get("--mpirun")
    opts.dry_run = bool(values.get("--dry-run"))
    opts.json = bool(values.get("--json"))
    if opts.json and not opts.dry_run:
        raise UserError("--json goes with --dry-run (a running job's output is the program's own)")
    if "--slots" in values:
        if not re.fullmatch(r"[0-9]{1,4}", values["--slots"]) or int(values["--slots"]) < 1:
            raise UserError(f"bad --slots {values['--slots']!r}: a number of ranks per host, at least 1")
        opts.slots = int(values["--slots"])
        if not opts.testbed:
            raise UserError("--slots goes with --testbed (elsewhere, give slots to mpirun: --host a:2,b:2)")
    if "--btl-ports" in values:
        opts.btl_ports = _port_range(values["--btl-ports"], "--btl-ports")
    opts.compress_allreduce = bool(values.get("--compress-allreduce"))
    allreduce_opts = [o for o in OPTIONS if o.startswith(("--allreduce-", "--no-allreduce-")) and o in values]
    if allreduce_opts and not opts.compress_allreduce:
        raise UserError(f"{allreduce_opts[0]} goes with --compress-allreduce")
    if "--allreduce-mode" in values:
        opts.allreduce_mode = pmpi_env.check_mode(values["--allreduce-mode"])
    if values.get("--allreduce-error-feedback") and values.get("--no-allreduce-error-feedback"):
        raise UserError("--allreduce-error-feedback and --no-allreduce-error-feedback: give one")
    opts.allreduce_error_feedback = (True if values.get("--allreduce-error-feedback") else
                                     False if values.get("--no-allreduce-error-feedback") else None)
    if "--allreduce-codec" in values:
        opts.allreduce_codec = pmpi_env.check_codec(values["--allreduce-codec"])   # nic + codec: allreduce_env
    if "--allreduce-min-count" in values:
        opts.allreduce_min_count = pmpi_env.check_min_count(values["--allreduce-min-count"])
    if "--allreduce-error-bound" in values:
        opts.allreduce_error_bound = pmpi_env.check_error_bound(values["--allreduce-error-bound"])
    if "--allreduce-nicd-socket" in values:
        opts.allreduce_nicd_socket = pmpi_env.check_nicd_socket(values["--allreduce-nicd-socket"])
    if "--allreduce-choose" in values:
        opts.allreduce_choose = pmpi_env.check_choose(values["--allreduce-choose"])
    if "--allreduce-headroom" in values:
        opts.allreduce_headroom = pmpi_env.check_headroom_arg(values["--allreduce-headroom"])
    if opts.iface is not None:
        pmpi_env.check_iface(opts.iface)
    return opts


def _port_range(text: str, what: str) -> tuple[int, int]:
    m = re.fullmatch(r"([0-9]{1,5})-([0-9]{1,5})", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)) <= 65535:
        raise UserError(f"bad {what} {text!r}: use LO-HI with 1 <= LO <= HI <= 65535")
    return int(m.group(1)), int(m.group(2))


def _user_mca(args: list[str]) -> dict[str, str]:
    """MCA parameters the user passes to mpirun (--mca/-mca/--gmca/-gmca NAME VALUE)."""
    found = {}
    for i, arg in enumerate(args):
        if arg in ("--mca", "-mca", "--gmca", "-gmca") and i + 2 < len(args):
            found[args[i + 1]] = args[i + 2]
    return found


def _exported(args: list[str]) -> set[str]:
    """Names of the variables the user exports with -x."""
    names = set()
    for i, arg in enumerate(args):
        if arg in ("-x", "--x") and i + 1 < len(args):
            names.add(args[i + 1].split("=", 1)[0])
    return names


# --- the contract ---------------------------------------------------------------------------------

def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def check_contract(policy: Policy, btl_ports: tuple[int, int]) -> None:
    """Refuse a policy that would tag MPI's own sockets."""
    if policy.selects_all:
        raise UserError("--tag all would tag MPI's own TCP sockets too (its BTL connections carry "
                        "headers that lossy compression destroys): tag the gradient sockets by port "
                        "(port=, lport=, rport=) or use none and tag them in the program")
    if policy.nets():
        raise UserError("--tag net= would tag MPI's own TCP sockets to those peers too: under mpirun, "
                        "tag the gradient sockets by port (port=, lport=, rport=) or use none")
    for term, lo, hi in _port_terms(policy):
        if _overlap((lo, hi), btl_ports):
            raise UserError(f"tag policy {term} overlaps the ports of MPI's TCP BTL "
                            f"({btl_ports[0]}-{btl_ports[1]}): MPI's own sockets would be tagged; use "
                            "other gradient ports, or move MPI's with --btl-ports LO-HI")


def ephemeral_warnings(policy: Policy, ephemeral: dict[str, tuple[int, int]]) -> list[str]:
    """Warnings for port selectors inside a host's ephemeral port range."""
    warnings = []
    for term, lo, hi in _port_terms(policy):
        for where, eph in ephemeral.items():
            if _overlap((lo, hi), eph):
                warnings.append(f"tag policy {term} overlaps the ephemeral port range "
                                f"{eph[0]}-{eph[1]} of {where}: a socket listening on port 0 (such "
                                "as OpenMPI's PMIx server on 127.0.0.1) may get a port in it and "
                                f"be tagged; gradient ports below {eph[0]} are safe")
    return warnings


def _port_terms(policy: Policy):
    for kind, lo, hi in policy.port_ranges():
        yield (f"{kind}={lo}" if lo == hi else f"{kind}={lo}-{hi}"), lo, hi


# --- the command -----------------------------------------------------------------------------------

def _real_mpirun(path: str | None) -> str:
    exe = shutil.which(path or "mpirun")
    if not exe:
        raise UserError(f"{path or 'mpirun'} not found (OpenMPI: apt-get install openmpi-bin)")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"cannot run {exe} --version: {exc}") from None
    if "Open MPI" not in out:
        first = (out.strip().splitlines() or ["no version output"])[0]
        raise UserError(f"{exe} is not OpenMPI's mpirun ({first}); this wrapper drives OpenMPI")
    return exe


@dataclass
class Plan:
    policy: Policy | None            # None: no tagging library (--compress-allreduce alone)
    argv: list[str]                  # what runs (mpirun, or the namespace prefix and mpirun)
    mpirun_argv: list[str]
    env: dict[str, str]              # added to this environment
    hosts: list[dict]
    warnings: list[str]
    testbed: str | None
    tmpdir: str | None = None
    allreduce: dict | None = None    # the MPI_Allreduce library and its settings

    def to_dict(self) -> dict:
        return {"testbed": self.testbed, "policy": self.policy.canonical if self.policy else None,
                "allreduce": self.allreduce, "hosts": self.hosts,
                "warnings": self.warnings, "env": self.env, "mpirun": self.mpirun_argv, "argv": self.argv}


def plan(opts: Options, materialize: bool = True) -> Plan:
    """Everything about the launch; with materialize, also the rsh agent's files (the caller
    removes Plan.tmpdir)."""
    if opts.compress_allreduce and opts.tag is None and os.environ.get(ENV_POLICY) is None:
        policy = None                # the library's ring tags its own sockets: no policy needed
    else:
        policy = policy_arg(opts.tag, "mpirun")
    user_mca = _user_mca(opts.mpirun_args)
    exported = _exported(opts.mpirun_args)
    clash = exported & {"LD_PRELOAD", ENV_POLICY, ENV_LOG}
    clash |= {n for n in exported if n.startswith("INCEPTIONN_MPI_")} if opts.compress_allreduce else set()
    if clash:
        raise UserError(f"do not pass -x {sorted(clash)[0]}: the wrapper sets it (use --tag, --log and the "
                        "--allreduce-* options)")
    btl = opts.btl_ports
    for family in ("v4", "v6"):   # what the BTL will use, the user's --mca values included
        try:
            lo = int(user_mca.get(f"btl_tcp_port_min_{family}", btl[0]))
            n = int(user_mca.get(f"btl_tcp_port_range_{family}", btl[1] - btl[0] + 1))
        except ValueError:
            raise UserError(f"btl_tcp_port_min_{family} and btl_tcp_port_range_{family} must be numbers") from None
        if policy is not None:
            check_contract(policy, (lo, min(lo + n - 1, 65535)))
    mpirun = _real_mpirun(opts.mpirun)

    testbed = None
    hosts: list[dict] = []
    if opts.testbed:
        from inceptionn.kernel_tc.testbed import Testbed
        testbed = Testbed.attach(opts.testbed)
        if not testbed.hosts or any(h.ip is None for h in testbed.hosts):
            raise UserError(f"testbed {opts.testbed!r} has hosts without an address; recreate it")
        targets = testbed.hosts
    else:
        targets = [None]
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(rules.nic_status, targets))
    for h, st in zip(targets, statuses):
        name = h.name if h else socket.gethostname()
        hosts.append({"name": name, "address": h.ip if h else None, "netns": h.netns if h else None,
                      "nic": st})
    ephemeral = {}
    for entry in hosts:
        eph = entry["nic"].get("ephemeral_ports")
        if eph:
            ephemeral.setdefault(tuple(eph), entry["name"])
    warnings = ephemeral_warnings(policy, {f"host {w}": r for r, w in ephemeral.items()}) if policy else []
    if user_mca.get("pml", "ob1") != "ob1":
        warnings.append(f"pml {user_mca['pml']}: its TCP sockets are not pinned to --btl-ports, so a "
                        "port policy may catch them")

    mca = [("pml", "ob1"), ("btl", "tcp,vader,self"),
           ("btl_tcp_port_min_v4", str(btl[0])), ("btl_tcp_port_range_v4", str(btl[1] - btl[0] + 1)),
           ("btl_tcp_port_min_v6", str(btl[0])), ("btl_tcp_port_range_v6", str(btl[1] - btl[0] + 1))]
    iface = opts.iface or (str(testbed.network) if testbed else None)
    if iface:
        mca += [("btl_tcp_if_include", iface), ("oob_tcp_if_include", iface)]
    tmpdir = None
    env: dict[str, str] = {}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rank_env = preload_env(policy, opts.log) if policy else {}
    allreduce = None
    if opts.compress_allreduce:
        allreduce, extra = allreduce_settings(opts, hosts, iface)
        allreduce, extra = pmpi_env.with_choice(allreduce, extra, opts.allreduce_choose)
        if not all(h["nic"]["running"] for h in hosts) and allreduce["mode"] == "nic":
            warnings.append("--allreduce-mode nic but the soft NIC does not run on every host: the ring's "
                            "tagged packets leave those hosts uncompressed (results are the same)")
        rank_env = pmpi_env.with_library({**rank_env, **extra}, allreduce["library"])
    host_args: list[str] = []
    if testbed:
        tmpdir = tempfile.mkdtemp(prefix="inceptionn-mpirun-") if materialize else None
        agent = Path(tmpdir or "/tmp/inceptionn-mpirun-XXXXXX") / "rsh-agent"
        hostmap = agent.with_name("hosts.json")
        if materialize:
            entries = {}
            for h in testbed.hosts:
                prefix = h.command([], hostname=h.name)
                entries[h.ip] = entries[h.name] = prefix
            hostmap.write_text(json.dumps(entries, indent=1))
            script = Path(__file__).resolve().with_name("rsh_agent.py")
            agent.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I {shlex.quote(str(script))} \"$@\"\n")
            agent.chmod(0o755)
        env["INCEPTIONN_RSH_MAP"] = str(hostmap)
        mca += [("plm_rsh_agent", str(agent)), ("plm_rsh_no_tree_spawn", "1")]
        if not HOST_ARGS & set(opts.mpirun_args):
            host_args = ["--host", ",".join(f"{h.ip}:{opts.slots}" for h in testbed.hosts)]
        # Testbed hosts share this machine's cores, but mpirun sees one slot per host and lets
        # every rank busy-poll: with more ranks than cores they starve each other (mpi4py's
        # test_io on 2 hosts of 2 cores: 234 s busy-polling, 96 s yielding).
        if len(testbed.hosts) * opts.slots > len(os.sched_getaffinity(0)):
            mca.append(("mpi_yield_when_idle", "1"))
    mpirun_argv = [mpirun]
    for name, value in mca:
        if name not in user_mca:
            mpirun_argv += ["--mca", name, value]
    for key, value in rank_env.items():
        mpirun_argv += ["-x", f"{key}={value}"]
    mpirun_argv += host_args + opts.mpirun_args + opts.program
    argv = testbed.hosts[0].command(mpirun_argv, hostname=testbed.hosts[0].name) if testbed else mpirun_argv
    return Plan(policy=policy, argv=argv, mpirun_argv=mpirun_argv, env=env, hosts=hosts,
                warnings=warnings, testbed=testbed.name if testbed else None, tmpdir=tmpdir, allreduce=allreduce)


def allreduce_settings(opts: Options, hosts: list[dict], iface: str | None) -> tuple[dict, dict[str, str]]:
    """The MPI_Allreduce library's settings (for the report) and the variables that carry them:
    OpenMPI's build (this is OpenMPI's mpirun); a program that visibly runs another MPI is refused."""
    family, what = pmpi_env.program_mpi(opts.program)
    if family not in (None, "openmpi"):
        raise UserError(f"{what} runs {pmpi_env.FAMILY_NAME[family]}, and inceptionn mpirun drives OpenMPI's mpirun: "
                        "launch it with its own launcher and `inceptionn env --compress-allreduce --mpi mpich` "
                        "(docs/launchers.md)")
    a = pmpi_env.Allreduce(opts.allreduce_mode, opts.allreduce_min_count, opts.allreduce_error_bound,
                         opts.allreduce_error_feedback, opts.allreduce_nicd_socket, opts.allreduce_codec,
                         opts.allreduce_headroom)
    return pmpi_env.allreduce_env(a, "openmpi", bool(hosts) and all(h["nic"]["running"] for h in hosts), iface,
                                bool(opts.log))


def report_lines(p: Plan) -> list[str]:
    where = f"testbed {p.testbed}, {len(p.hosts)} host(s)" if p.testbed else "this host only (others are not checked)"
    what = f"tag policy {p.policy.canonical}" if p.policy else "no tag policy"
    if p.allreduce:
        a = p.allreduce
        from inceptionn.codecs import codec_class   # a codec that runs at the error bound: the bound
        codec = f"error bound 2^{a['error_bound']}" if codec_class(a["codec"]).wants_scaling else f"codec {a['codec']}"
        what += (f"; MPI_Allreduce compressed (mode {a['mode']}, float32 sums of >= {a['min_count']} values, "
                 f"{codec}{', error feedback' if a['error_feedback'] else ''})")
    if p.allreduce and p.allreduce["choose"] != "auto":
        path = "on the ring" if p.allreduce["choose"] == "ring" else "by MPI's own"
        what += f"; every such call {path} (--allreduce-choose {p.allreduce['choose']})"
    lines = [f"inceptionn mpirun: {where}; {what}"]
    width = max(len(h["name"]) for h in p.hosts)
    for h in p.hosts:
        addr = f" {h['address']:<15}" if h["address"] else ""
        lines.append(f"  {h['name']:<{width}}{addr}  {h['nic']['detail']}")
    lines += [f"inceptionn: warning: {w}" for w in p.warnings]
    return lines


def run(rest: list[str]) -> int:
    opts = parse_args(rest)
    if opts.help:
        print(HELP, end="")
        return 0
    p = plan(opts, materialize=not opts.dry_run)
    try:
        if opts.dry_run:
            if opts.json:
                print(json.dumps(p.to_dict(), indent=2))
            else:
                print("\n".join(report_lines(p)))
                env = [f"{k}={shlex.quote(v)}" for k, v in p.env.items()]
                print(" ".join(["env", *env] if env else []) + (" " if env else "")
                      + " ".join(shlex.quote(a) for a in p.argv))
            return 0
        print("\n".join(report_lines(p)), file=sys.stderr, flush=True)
        return _launch(p)
    finally:
        if p.tmpdir:
            shutil.rmtree(p.tmpdir, ignore_errors=True)


def _launch(p: Plan) -> int:
    env = dict(os.environ)
    env.update(p.env)
    try:
        proc = subprocess.Popen(p.argv, env=env)
    except OSError as exc:
        raise UserError(f"cannot start {p.argv[0]}: {exc.strerror}") from None
    # mpirun tears the job down on a signal and exits: wait for that. Ctrl-C reaches mpirun
    # from the terminal already (same process group), and a second SIGINT would make it skip
    # its cleanup, so SIGINT is not passed on; SIGTERM and SIGHUP, sent to us alone, are.
    forward = lambda sig, frame: proc.send_signal(sig)  # noqa: E731
    old = {signal.SIGINT: signal.signal(signal.SIGINT, lambda sig, frame: None)}
    old.update({s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)})
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc if rc >= 0 else 128 - rc
