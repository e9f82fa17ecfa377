"""``inceptionn bench latency``: a standard MPI allreduce latency benchmark under stock OpenMPI and
under the MPI_Allreduce library, side by side on one testbed per link rate.

The program is bench/allreduce_latency.c, the OSU micro-benchmarks' osu_allreduce loop written
out: MPI_Allreduce of float32 MPI_SUM on constant buffers, warm-up calls, then the mean time per
call, averaged over the ranks. Sizes --min-size to --max-size bytes, doubling (default 4 KiB to
4 MiB); OSU's iterations (1000 timed calls after 200 warm-ups up to 8 KiB, 100 after 10 above)
unless --iterations / --warmup say otherwise. mpi is inceptionn mpirun --tag none; library is
the same with --compress-allreduce at its defaults (mode app, or nic with --nic: the soft NIC
runs on every host for both sides; the path chosen per count, docs/mpi-allreduce.md) plus
--library-args. The rounds alternate the two, so both see the same load. Printed per size: the median over the rounds of
each one's mean time per call (microseconds) and mpi / library (above 1: the library is faster).
"""
from __future__ import annotations

HELP = "a standard allreduce latency benchmark (OSU's loop), stock OpenMPI vs the MPI_Allreduce library"

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from inceptionn.errors import UserError

SOURCE = Path(__file__).resolve().with_name("allreduce_latency.c")
LINE = re.compile(r"^size (\d+) avg_us ([0-9.]+) min_us ([0-9.]+) max_us ([0-9.]+)$", re.M)


def add_arguments(p) -> None:
    p.add_argument("--rates", default="100mbit,1gbit", help="link rates, comma-separated (default 100mbit,1gbit)")
    p.add_argument("--hosts", type=int, default=4, help="testbed hosts, one rank each (default 4)")
    p.add_argument("--mtu", type=int, default=1500, help="the links' MTU (default 1500)")
    p.add_argument("--min-size", type=int, default=4096, help="smallest message in bytes (default 4096)")
    p.add_argument("--max-size", type=int, default=4 << 20, help="largest message in bytes (default 4194304)")
    p.add_argument("--iterations", type=int, help="timed calls per size (default OSU's: 1000 up to 8 KiB, 100 above)")
    p.add_argument("--warmup", type=int, help="warm-up calls per size (default OSU's: 200 up to 8 KiB, 10 above)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each side per rate, alternating (default 2)")
    p.add_argument("--library-args", default="", help="more wrapper options for the library side, e.g. "
                   "'--allreduce-choose ring' (default: none)")
    p.add_argument("--nic", action="store_true", help="run the soft NIC on every host (the library: mode nic)")
    p.add_argument("--json", "-j", action="store_true", help="every run's figures as JSON")
    p.set_defaults(func=run)


def build(tmp: str) -> str:
    exe = os.path.join(tmp, "allreduce_latency")
    try:
        r = subprocess.run(["mpicc", "-O2", str(SOURCE), "-o", exe], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise UserError("mpicc not found: bench latency needs OpenMPI's compiler wrapper (libopenmpi-dev)") from None
    if r.returncode != 0:
        raise UserError(f"building {SOURCE.name} failed: {r.stderr.strip()[-500:]}")
    return exe


def run(args) -> int:
    from contextlib import ExitStack

    from inceptionn.daemon.launch import nicd
    from inceptionn.limits import DEFAULT_ERROR_BOUND
    from inceptionn.kernel_tc.testbed import Testbed
    if args.hosts < 2 or args.rounds < 1 or not 4 <= args.min_size <= args.max_size:
        raise UserError("need --hosts >= 2, --rounds >= 1 and 4 <= --min-size <= --max-size")
    it = [str(args.iterations or 1000), str(args.warmup if args.warmup is not None else 200),
          str(args.iterations or 100), str(args.warmup if args.warmup is not None else 10)]
    sides = {"mpi": ["--tag", "none"], "library": ["--compress-allreduce", *shlex.split(args.library_args)]}
    out: dict = {"hosts": args.hosts, "mtu": args.mtu, "library_args": args.library_args, "nic": args.nic, "rates": {}}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        if args.nic:
            sides["library"] += ["--allreduce-nicd-socket", f"{tmp}/%h.sock"]
        for rate in args.rates.split(","):
            runs: dict = {s: [] for s in sides}
            with Testbed(hosts=args.hosts, rate=rate, mtu=args.mtu, name=f"lat{os.getpid()}") as tb, \
                    ExitStack() as daemons:
                for h in tb.hosts if args.nic else []:
                    daemons.enter_context(nicd(h, f"{tmp}/{h.name}.sock", DEFAULT_ERROR_BOUND))
                for rnd in range(args.rounds):
                    for side, wrapper in sides.items():
                        print(f"{rate} round {rnd + 1}/{args.rounds}: {side} ...", file=sys.stderr, flush=True)
                        argv = [sys.executable, "-m", "inceptionn", "mpirun", *wrapper, "--testbed", tb.name,
                                "-np", str(args.hosts), "--", exe, str(args.min_size), str(args.max_size), *it]
                        r = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
                        if r.returncode != 0:
                            raise UserError(f"{side} run failed: {r.stderr.strip()[-500:]}")
                        runs[side].append({int(m[0]): float(m[1]) for m in LINE.findall(r.stdout)})
            out["rates"][rate] = runs
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"MPI_Allreduce latency (OSU's loop, float32 MPI_SUM, constant buffers), {args.hosts} testbed hosts, "
          f"MTU {args.mtu}{', soft NICs on' if args.nic else ''}: mean us per call, median of {args.rounds} round(s); mpi/library above 1: the library "
          f"is faster; library: --compress-allreduce {args.library_args}".rstrip())
    for rate, runs in out["rates"].items():
        print(f"\n{rate}:\n{'bytes':>9} {'mpi':>12} {'library':>12} {'mpi/library':>12}")
        for size in sorted(runs["mpi"][0]):
            m = statistics.median(x[size] for x in runs["mpi"])
            lib = statistics.median(x[size] for x in runs["library"])
            print(f"{size:>9} {m:>12.1f} {lib:>12.1f} {m / lib:>11.2f}x")
    return 0
