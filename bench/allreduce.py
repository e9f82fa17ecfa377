"""``inceptionn bench allreduce``: our ring against the allreduces people use, on the same links.

For every link rate a fresh testbed of ``--hosts`` hosts (every link shaped in both directions)
runs the soft NIC on every host, and each rank reduces real gradient values (the HDC model's
gradients captured from training, tiled to the size asked) with, side by side in rounds:

  ring      our INCEPTIONN ring, plain float32 on untagged sockets (no compression)
  ring-gso  the same ring on tagged sockets: the soft NICs compress both legs (INC+C) in their
            default mode, gso (super-packets in, MTU-sized compressed packets out)
  gloo      torch.distributed's gloo allreduce (needs torch)
  gloo-fp16 what a PyTorch user adds instead: gloo as DistributedDataParallel runs it with torch's
  gloo-bf16 own fp16_compress_hook / bf16_compress_hook (ddp_comm_hooks.default_hooks) on each
            25 MiB bucket: the gradient crosses as 16-bit values
  mpi       MPI_Allreduce through mpi4py, launched with inceptionn mpirun (OpenMPI defaults)

and on request (--impls): mpi-nic and mpi-app, the same unmodified mpi4py program under
inceptionn mpirun --compress-allreduce (collective/pmpi_allreduce.c), the library's ring on tagged
sockets that the soft NICs compress, or with the codec in the library and no daemon involved;
ring-app (the same ring compressing inside the collective, the codec
in the application on untagged sockets: no daemon, so the NIC path's overhead shows beside it;
ring-app+thc, +3lc, +terngrad, +fft: another codec there),
ring-nic (ring-gso with the soft NICs restarted per packet, nicd --no-gso), ring-gso-v2 (ring-gso
without trains, nicd --no-trains: wire format v2's super-packets beside v3), ring-notag (the
compressing ring's computation on untagged sockets: the cost of the application side alone), wa
and wa-nic (the worker-aggregator exchange, plain or compressed).

``--sweep`` measures instead where the MPI_Allreduce library starts to pay (its default
threshold): mpi, mpi-nic and mpi-app on ``--counts`` values (default 1K to 1M), the library
taking every count, milliseconds per call and the count from which it is faster.

Reported: median seconds per allreduce [min-max over all reps], speedups of the soft NIC ring
(ring-gso, else ring-nic) over gloo and MPI, and the error of one compressed reduction (NMSE
against the float64 sum); for the compressing rings, the compression ratio at the error bound
as they run (wire format v2) beside the rings' before issue 29 (v1), ``compression``. Then the
paper's Fig. 15: exchange time of ring-nic and of the worker-aggregator baseline (wa-nic: the
gradient leg tagged, weights returned raw) from 2 to 8 hosts, both per packet: the same NIC path
under both exchanges, as in the paper.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager

import numpy as np

from ..daemon.launch import nicd, read_stats
from ..codecs.blockscale import MAX_HEADROOM
from ..limits import DEFAULT_ERROR_BOUND, headroom_problem
from ..errors import UserError
from ..kernel_tc.testbed import Testbed
from ..kernel_tc.units import format_rate, parse_rate
from .allreduce_peer import HOOK_IMPLS

HELP = "ring allreduce with and without the soft NIC against gloo, DDP's fp16/bf16 hooks and OpenMPI, 2 to 8 hosts"
IMPLS = ("ring", "ring-gso", "gloo", "gloo-fp16", "gloo-bf16", "mpi")   # the default comparison: the daemons' default, gso
GLOO_IMPLS = ("gloo", "gloo-fp16", "gloo-bf16")      # torch.distributed over gloo (need torch)
HOOKS = tuple(HOOK_IMPLS)                            # DDP's 16-bit compress hooks
EXTRA_IMPLS = ("ring-app", "ring-nic", "ring-gso-v2", "ring-notag", "wa", "wa-nic", "mpi-nic", "mpi-app")  # on request
MPI_IMPLS = ("mpi", "mpi-nic", "mpi-app")            # launched with inceptionn mpirun
# the daemons' settings per allreduce: gso mode (their default) with trains (wire format v3, the default) or
# without (v2 super-packets); per packet for the others
NICD_MODES = {"ring-gso": {"gso": True}, "mpi-nic": {"gso": True}, "ring-gso-v2": {"gso": True, "trains": False}}
SCALE_IMPLS = ("ring-nic", "wa-nic")
RING_COMPRESSED = ("ring-app", "ring-nic", "ring-gso", "ring-gso-v2", "mpi-nic", "mpi-app")   # the compressing ring, wire format v2
CHUNK_VALUES = 65536     # the ring's pipeline chunk: Group's default chunk_bytes / 4, the library's INCEPTIONN_MPI_CHUNK
GLOO_PORT = 29511
PEER = [sys.executable, "-m", "inceptionn.bench.allreduce_peer"]
HEADROOM_IMPLS = ("ring-app", "ring-nic", "ring-gso", "ring-gso-v2", "ring-notag")   # the Group's rings take --headroom


CODEC_IMPLS = ("ring-app",)    # ring-app+CODEC: another codec inside the collective (default inceptionn)


def split_label(label: str) -> tuple[str, int]:
    """A row's label -> (impl, headroom): ``ring-app/h2`` is ring-app at headroom 2,
    ``ring-app+thc`` ring-app with the THC codec (``label_codec``)."""
    impl, _, h = label.partition("/h")
    return impl.partition("+")[0], int(h) if h else 0


def label_codec(label: str) -> str:
    """The codec a row's ring runs: ``ring-app+thc`` -> thc; inceptionn where none is named."""
    return label.partition("/h")[0].partition("+")[2] or "inceptionn"


def expand_headrooms(impls: list[str], headrooms: list[int]) -> list[str]:
    """Each compressing ring once per headroom (label ``impl/hN`` beside h=0's plain name)."""
    out = []
    for i in impls:
        out += [i if h == 0 else f"{i}/h{h}" for h in headrooms] if i in HEADROOM_IMPLS else [i]
    return out


def log(msg: str) -> None:
    print(f"[bench allreduce] {msg}", file=sys.stderr, flush=True)


def write_inputs(workdir: str, world: int, nbytes: int, captures: list[np.ndarray]) -> None:
    """grad<r>.npy for every rank (real gradients, a different rotation per rank) and exact.npy."""
    n = nbytes // 4
    pool = np.concatenate(captures)
    exact = np.zeros(n, dtype=np.float64)
    for r in range(world):
        start = (r * pool.size // world) % pool.size
        idx = (start + np.arange(n)) % pool.size
        g = pool[idx]
        np.save(os.path.join(workdir, f"grad{r}.npy"), g)
        exact += g
    np.save(os.path.join(workdir, "exact.npy"), exact)


def json_objects(text: str) -> list[dict]:
    """Every JSON object in ``text``: mpirun forwards the ranks' output, and two ranks' lines
    can end up on one line."""
    dec, objs, i = json.JSONDecoder(), [], text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            objs.append(obj)
        i = text.find("{", end)
    return objs


def run_impl(tb: Testbed, label: str, world: int, workdir: str, reps: int, timeout: float,
             error_bound: int, counts: list[int] | None = None) -> dict:
    """One run of ``impl``: seconds per rep (the slowest rank's) and the NMSE of one reduction;
    with ``counts`` (MPI only) seconds per rep for each count instead, the library taking every
    count (--allreduce-min-count 1)."""
    impl, headroom = split_label(label)
    hosts = tb.hosts[:world]
    store = os.path.join(workdir, "store")
    shutil.rmtree(store, ignore_errors=True)
    if impl in MPI_IMPLS:
        wrapper = ["--tag", "none"] if impl == "mpi" else \
            ["--compress-allreduce", "--allreduce-mode", impl[4:], "--allreduce-error-bound", str(error_bound)]
        if counts and impl != "mpi":
            wrapper += ["--allreduce-min-count", "1"]
        argv = [sys.executable, "-m", "inceptionn", "mpirun", *wrapper, "--testbed", tb.name,
                "-np", str(world), "--", *PEER, impl, "0", str(world), workdir, str(reps),
                "--error-bound", str(error_bound)] + (["--counts", ",".join(map(str, counts))] if counts else [])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise UserError(f"mpi run failed: {r.stderr.strip()[-500:]}")
        outs = json_objects(r.stdout)
    else:
        env = dict(os.environ, GLOO_SOCKET_IFNAME=hosts[0].ifname)
        procs = [h.popen(PEER + [impl, str(rank), str(world), workdir, str(reps),
                                 "--master", f"{hosts[0].ip}:{GLOO_PORT}", "--error-bound", str(error_bound),
                                 "--headroom", str(headroom), "--codec", label_codec(label)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for rank, h in enumerate(hosts)]
        outs, errors = [], []
        deadline = time.monotonic() + timeout
        try:
            for p in procs:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if p.returncode != 0:
                    errors.append(err.strip()[-500:])
                outs += json_objects(out)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if errors:
            raise UserError(f"{impl} run failed: {errors[0]}")
    if counts:   # rank 0 reports for all
        if len(outs) != 1 or not outs[0].get("same"):
            raise UserError(f"{impl}: " + ("ranks ended with different results" if outs else "no result"))
        return {"sweep": outs[0]["sweep"]}
    if len(outs) != world:
        raise UserError(f"{impl}: expected {world} results, got {len(outs)}")
    crcs = {o["crc"] for o in outs}
    if len(crcs) != 1:
        raise UserError(f"{impl}: ranks ended with different results")
    # One rep takes as long as its slowest rank.
    per_rep = [max(o["seconds"][i] for o in outs) for i in range(reps)]
    nmse = next(o["nmse"] for o in outs if o["rank"] == 0)
    got = {"seconds": per_rep, "nmse": nmse}
    if all("first_call_bytes" in o for o in outs):   # our ring: what all ranks sent in the first call
        got["first_call_bytes"] = {p: sum(o["first_call_bytes"][p] for o in outs) for p in outs[0]["first_call_bytes"]}
    return got


class _RankFiles:
    """Rank r's values [a, b) from the benchmark's grad<r>.npy, for bench scale's simulator."""

    def __init__(self, workdir: str, world: int):
        self.x = [np.load(os.path.join(workdir, f"grad{r}.npy"), mmap_mode="r") for r in range(world)]
        self.n = self.x[0].size

    def __call__(self, r: int, a: int, b: int) -> np.ndarray:
        return self.x[r][a:b]


def compression(workdir: str, world: int, error_bound: int, headrooms=(0,)) -> dict:
    """The compressing ring's compression on the inputs in ``workdir``, one call at ``error_bound``:
    ``v2`` the ring as it runs (wire format v2: a power of two per block of 256 values at every
    hop) and ``v1`` the ring before issue 29 (one power of two per 65,536 values, agreed so that
    N x max|x| < 1), both through bench scale's simulator (v1's transform exists only there).
    Each: the float32 bytes every link carries over the codec bytes sent for them (exponent
    floats included, frame and packet headers not), NMSE against the float64 sum, and for v2 the
    exponents' share of the codec bytes, the codec bytes and the payloads (app mode frames each
    behind a 4-byte length)."""
    from ..codecs.blockscale import BLOCK_VALUES
    from .scale import run_one
    x, ref = _RankFiles(workdir, world), np.load(os.path.join(workdir, "exact.npy"))
    out = {}
    for key, variant, h in [("v2", "after", 0), ("v1", "before", 0)] + [(f"v2/h{h}", "after", h) for h in headrooms if h]:
        row = run_one(x, world, "inceptionn", variant, error_bound=error_bound, chunk=CHUNK_VALUES,
                      block=BLOCK_VALUES, ref=ref, seed=0, headroom=h)
        out[key] = {k: row[k] for k in ("ratio", "nmse", "codec_bytes", "payloads", "exponent_share")}
    del out["v1"]["exponent_share"]
    out["float32_bytes"] = 4 * x.n * 2 * (world - 1)     # every value crosses 2(N-1) links over the ring
    return out


@contextmanager
def bench_testbed(rate: str, hosts: int, mtu: int, error_bound: int):
    """A testbed of its own, a scratch directory, and ``daemons(**settings)`` / ``nic_counters()`` for
    the soft NIC on every host."""
    # a name of its own per run: benchmarks started side by side (or one left behind) do not collide
    with Testbed(hosts=hosts, rate=rate, mtu=mtu, name=f"bar{os.getpid()}") as tb, ExitStack() as stack, \
            tempfile.TemporaryDirectory(prefix="inceptionn-bar-") as tmp:
        mode = [None]  # the daemons' settings, None: not running

        def daemons(**settings) -> None:
            """The soft NIC on every host (daemon.launch.nicd's gso and trains), restarted when an
            allreduce needs other settings."""
            if mode[0] != settings:
                stack.close()
                for h in tb.hosts:
                    stack.enter_context(nicd(h, os.path.join(tmp, f"{h.name}.sock"), error_bound, **settings))
                mode[0] = settings

        def nic_counters() -> dict:
            """Packets all daemons sent compressed, and super-packets among what they took."""
            c = [read_stats(os.path.join(tmp, f"{h.name}.sock")) for h in tb.hosts]
            return {k: sum(x[k] for x in c) for k in ("egress_compressed", "gso_super_packets", "egress_trains")}
        yield tb, tmp, daemons, nic_counters


def measure(rate: str, sizes: list[int], impls: list[str], world: int, scale_hosts: list[int],
            scale_size: int, rounds: int, reps: int, mtu: int, error_bound: int,
            captures: list[np.ndarray], headrooms=(0,)) -> dict:
    rate_bps = parse_rate(rate)
    hosts = max([world, *scale_hosts])
    res = {"rate": format_rate(rate_bps), "mtu": mtu, "world": world, "sizes": {}, "scaling": {}, "compression": {}}
    with bench_testbed(rate, hosts, mtu, error_bound) as (tb, tmp, daemons, nic_counters):
        jobs = [(size, world, impls, "sizes") for size in sizes]
        jobs += [(scale_size, n, SCALE_IMPLS, "scaling") for n in scale_hosts]
        for size, n, which, section in jobs:
            workdir = os.path.join(tmp, f"{section}-{size}-{n}")
            os.makedirs(workdir)
            write_inputs(workdir, n, size * 2**20, captures)
            if section == "sizes" and {split_label(i)[0] for i in which} & set(RING_COMPRESSED):
                log(f"{size} MiB x {n} hosts: the compressing ring's ratio, wire format v2 and v1, simulated ...")
                res["compression"][str(size)] = compression(workdir, n, error_bound, headrooms)
            # the raw transfer time of 2(N-1)/N of the data, doubled, plus slack
            timeout = 120 + 8 * (reps + 1) * 2 * size * 2**20 * 8 / rate_bps * (2 if n > 4 else 1)
            row = {impl: {"seconds": [], "nmse": None} for impl in which}
            for r in range(rounds):
                for impl in which:
                    log(f"{res['rate']} {size} MiB x {n} hosts round {r + 1}/{rounds}: {impl} ...")
                    daemons(**NICD_MODES.get(split_label(impl)[0], {"gso": False}))
                    c0 = nic_counters()
                    got = run_impl(tb, impl, n, workdir, reps, timeout, error_bound)
                    row[impl]["seconds"] += got["seconds"]
                    row[impl]["nmse"] = got["nmse"]
                    if "first_call_bytes" in got:
                        row[impl]["first_call_bytes"] = got["first_call_bytes"]
                    for k, v in nic_counters().items():  # what the soft NICs did for it
                        row[impl][k] = row[impl].get(k, 0) + v - c0[k]
            for impl, v in row.items():
                v["median"] = statistics.median(v["seconds"])
                v["min"], v["max"] = min(v["seconds"]), max(v["seconds"])
            key = str(size) if section == "sizes" else str(n)
            res[section][key] = row
            shutil.rmtree(workdir, ignore_errors=True)
    return res


SWEEP_COUNTS = (1024, 4096, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)
SWEEP_REPS = 10


def measure_sweep(rate: str, counts: list[int], impls: list[str], world: int, rounds: int, reps: int,
                  mtu: int, error_bound: int, captures: list[np.ndarray]) -> dict:
    """Seconds per MPI_Allreduce of each count, stock MPI against the library taking every count,
    and per library mode the crossover: the smallest count from which it is faster (median) at
    every larger count measured (None: never)."""
    rate_bps = parse_rate(rate)
    res = {"rate": format_rate(rate_bps), "mtu": mtu, "world": world, "counts": {}, "crossover": {}}
    with bench_testbed(rate, world, mtu, error_bound) as (tb, tmp, daemons, _):
        workdir = os.path.join(tmp, "sweep")
        os.makedirs(workdir)
        write_inputs(workdir, world, max(counts) * 4, captures)
        # the raw transfer time of 2(N-1)/N of every count, times 8, plus slack for the launches
        timeout = 120 + 8 * (reps + 1) * sum(2 * c * 4 * 8 for c in counts) / rate_bps
        seconds = {impl: {c: [] for c in counts} for impl in impls}
        for r in range(rounds):
            for impl in impls:
                log(f"{res['rate']} sweep of {len(counts)} counts x {world} hosts round {r + 1}/{rounds}: {impl} ...")
                daemons(**NICD_MODES.get(impl, {"gso": False}))
                got = run_impl(tb, impl, world, workdir, reps, timeout, error_bound, counts)
                for c in counts:
                    seconds[impl][c] += got["sweep"][str(c)]
    for c in counts:
        res["counts"][str(c)] = {impl: {"median": statistics.median(v[c]), "min": min(v[c]), "max": max(v[c]),
                                        "seconds": v[c]} for impl, v in seconds.items()}
    if "mpi" in impls:
        for impl in impls:
            if impl == "mpi":
                continue
            faster = [res["counts"][str(c)][impl]["median"] < res["counts"][str(c)]["mpi"]["median"] for c in counts]
            from_here = [c for i, c in enumerate(counts) if all(faster[i:])]
            res["crossover"][impl] = from_here[0] if from_here else None
    return res


def print_sweep(r: dict) -> None:
    print(f"Threshold sweep: MPI_Allreduce of COUNT float32 values (real HDC gradients, HDC on {r['dataset']}), "
          f"error bound 2^{r['error_bound']}, MTU {r['mtu']}; the library takes every count; milliseconds per "
          f"call (slowest rank), median [min-max] of {r['rounds']} rounds x {r['reps']} reps")
    impls = r["impls"]
    for link in r["links"]:
        print(f"\n{link['rate']}, {link['world']} hosts")
        print(f"{'count':>8} {'KiB':>6}  " + "  ".join(f"{i:>24}" for i in impls)
              + "".join(f"  {i + ' vs mpi':>14}" for i in impls if i != "mpi" and "mpi" in impls))
        for count, row in link["counts"].items():
            cells = [f"{row[i]['median'] * 1e3:8.2f} [{row[i]['min'] * 1e3:.2f}-{row[i]['max'] * 1e3:.2f}]" for i in impls]
            sp = [f"{row['mpi']['median'] / row[i]['median']:13.2f}x" for i in impls if i != "mpi" and "mpi" in impls]
            print(f"{count:>8} {int(count) * 4 // 1024:>6}  " + "  ".join(f"{c:>24}" for c in cells)
                  + "".join(f"  {x:>14}" for x in sp))
        for impl, c in link["crossover"].items():
            print(f"{impl}: faster than MPI_Allreduce from {c} values on" if c else
                  f"{impl}: not faster than MPI_Allreduce at the largest count")


def measured_ratio(c: dict, app: dict | None) -> float | None:
    """ring-app's first call, measured: float32 bytes over the bytes its frames took on the wire."""
    if not app or "first_call_bytes" not in app:
        return None
    return c["float32_bytes"] / app["first_call_bytes"]["data"]


def compression_line(c: dict, bound: int, app: dict | None) -> str:
    v2, v1 = c["v2"], c["v1"]
    line = (f"compression at 2^{bound}, simulated on these inputs (float32 over codec bytes): "
            f"{v2['ratio']:.2f}x (NMSE {v2['nmse']:.2e}; exponents {100 * v2['exponent_share']:.1f}% of the wire), "
            f"before #29 (wire format v1) {v1['ratio']:.2f}x (NMSE {v1['nmse']:.2e})")
    m = measured_ratio(c, app)
    line += f"; ring-app measured {m:.2f}x with its frame lengths" if m else ""
    hs = [f"h={k[4:]} {v['ratio']:.2f}x (NMSE {v['nmse']:.2e})" for k, v in c.items() if k.startswith("v2/h")]
    return line + ("; at headroom " + ", ".join(hs) if hs else "")


def print_report(r: dict) -> None:
    print(f"Allreduce of real gradient values (HDC on {r['dataset']}, tiled), float32 sum, "
          f"error bound 2^{r['error_bound']}, MTU {r['mtu']}; seconds per allreduce, median "
          f"[min-max] of {r['rounds']} rounds x {r['reps']} reps")
    for link in r["links"]:
        print(f"\n{link['rate']}, {link['world']} hosts")
        lead = next((i for i in ("ring-gso", "ring-nic") if i in r["impls"]), "ring-gso")
        print(f"{'MiB':>5}  " + "  ".join(f"{i:>22}" for i in r["impls"]) + f"  {lead} vs gloo / mpi   NMSE")
        for size, row in link["sizes"].items():
            cells = [f"{row[i]['median']:8.3f} [{row[i]['min']:.2f}-{row[i]['max']:.2f}]" for i in r["impls"]]
            nic = row.get(lead, {}).get("median")
            sp = [f"{row[b]['median'] / nic:5.2f}x" if nic and b in row else "   - " for b in ("gloo", "mpi")]
            nmse = row.get(lead, {}).get("nmse")
            nmse = f"{nmse:.2e}" if nmse is not None else "-"
            print(f"{size:>5}  " + "  ".join(f"{c:>22}" for c in cells) + f"  {sp[0]} / {sp[1]}         {nmse}")
            lossy = [f"{i} {row[i]['nmse']:.2e}" for i in r["impls"] if row[i]["nmse"] and i != lead]
            if lossy:   # the float32 paths' error is zero or rounding
                print(f"{'':>5}  NMSE of one reduction: " + ", ".join(lossy))
            ours = [i for i in row if split_label(i)[0] in RING_COMPRESSED]
            for peer in ("gloo",) + HOOKS:  # every compressing ring against gloo and DDP's hooks
                vs = [f"{i} {row[peer]['median'] / row[i]['median']:.2f}x" for i in ours] if peer in row else []
                if vs:
                    print(f"{'':>5}  faster than {peer}: " + ", ".join(vs))
            if size in link.get("compression", {}):
                print(f"{'':>5}  " + compression_line(link["compression"][size], r["error_bound"], row.get("ring-app")))
            if "mpi" in row:  # the unmodified MPI program with the library against OpenMPI alone
                vs = [f"{i} {row['mpi']['median'] / row[i]['median']:.2f}x (NMSE {row[i]['nmse']:.2e})"
                      for i in ("mpi-nic", "mpi-app") if i in row]
                if vs:
                    print(f"{'':>5}  faster than MPI_Allreduce: " + ", ".join(vs))
        if link["scaling"]:
            print(f"\nExchange time from {min(map(int, link['scaling']))} to "
                  f"{max(map(int, link['scaling']))} hosts ({r['scale_size']} MiB, paper's Fig. 15)")
            print(f"{'hosts':>5}  {'ring-nic':>22}  {'wa-nic':>22}  WA / ring")
            for n, row in link["scaling"].items():
                a, b = row["ring-nic"], row["wa-nic"]
                print(f"{n:>5}  {a['median']:8.3f} [{a['min']:.2f}-{a['max']:.2f}]  "
                      f"{b['median']:8.3f} [{b['min']:.2f}-{b['max']:.2f}]  {b['median'] / a['median']:6.2f}x")
    print("\nring = our ring, untagged (no compression); ring-gso = the same ring on tagged sockets "
          "through the soft NICs (INC+C) in their default mode, gso with trains; ring-gso-v2 = the same without trains "
          "(nicd --no-trains); ring-nic = the same per packet (nicd --no-gso); "
          "ring-app = the same ring compressing in the collective (no daemon; ring-app+CODEC another codec there); mpi-nic / mpi-app = MPI_Allreduce "
          "of the unmodified mpi4py program through the library of `inceptionn mpirun --compress-allreduce`, soft "
          "NICs / codec in the library; gloo-fp16 / gloo-bf16 = gloo with DDP's fp16 / bf16 compress hook (torch's "
          "own) per 25 MiB bucket, NMSE of the mean they return times the ranks; wa-nic = worker-aggregator, gradient leg compressed. "
          "Compression: what every compressing ring (ring-*, mpi-nic, mpi-app) puts through the codec in one call, "
          "wire format v2 (a power of two per 256 values at every hop) beside v1 (one per 65,536 values scaled for "
          "N x max, the rings before issue 29), through bench scale's simulator; the soft NICs add their packet "
          "headers. "
          "Target: the soft NIC ring at least 3x faster than both gloo and OpenMPI at 100 Mbit.")


def _csv(text: str, what: str, conv=str) -> list:
    try:
        items = [conv(t.strip()) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UserError(f"--{what}: cannot parse {text!r}") from None
    return items


def run(args) -> int:
    from ..train.gradients import capture_gradients

    impls = _csv(args.impls or ",".join(MPI_IMPLS if args.sweep else IMPLS), "impls")
    for i in impls:
        base, _, codec = i.partition("+")
        if base not in IMPLS + EXTRA_IMPLS:
            raise UserError(f"--impls: unknown {i!r}; choose from {', '.join(IMPLS + EXTRA_IMPLS)}, "
                            f"or {'/'.join(CODEC_IMPLS)}+CODEC")
        if codec:
            from ..codecs import available_codecs

            if base not in CODEC_IMPLS or codec not in available_codecs():
                raise UserError(f"--impls {i}: a codec goes after {', '.join(CODEC_IMPLS)} only, one of "
                                f"{', '.join(available_codecs())}")
    headrooms = _csv(args.headroom, "headroom", int)
    if not headrooms or any(headroom_problem(h) for h in headrooms) or len(set(headrooms)) != len(headrooms):
        raise UserError(f"--headroom: distinct integers in 0..{MAX_HEADROOM} (bits of precision the scaling gives up)")
    if headrooms != [0] and args.sweep:
        raise UserError("--headroom goes with the size runs, not --sweep")
    impls = expand_headrooms(impls, headrooms)
    if args.sweep and set(impls) - set(MPI_IMPLS):
        raise UserError(f"--sweep measures MPI_Allreduce only: --impls from {', '.join(MPI_IMPLS)}")
    counts = _csv(args.counts, "counts", int) if args.counts else list(SWEEP_COUNTS)
    if args.counts and not args.sweep:
        raise UserError("--counts goes with --sweep")
    if any(not 1 <= c <= 2**31 - 1 for c in counts):
        raise UserError("--counts: numbers of values, 1..2147483647")
    reps = args.reps if args.reps is not None else (SWEEP_REPS if args.sweep else 3)
    if set(GLOO_IMPLS) & set(impls):
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UserError(f"{', '.join(i for i in impls if i in GLOO_IMPLS)} need PyTorch: pip install "
                            "'inceptionn[torch]' (or drop them from --impls)") from None
    if set(MPI_IMPLS) & set(impls) and shutil.which("mpirun") is None:
        raise UserError("mpi needs OpenMPI's mpirun (Debian: openmpi-bin), or drop mpi from --impls")
    rates = _csv(args.rates, "rates")
    for rate in rates:
        parse_rate(rate)
    sizes = _csv(args.sizes, "sizes", int)
    scale_hosts = _csv(args.scale_hosts, "scale-hosts", int) if args.scale_hosts else []
    if any(s <= 0 for s in sizes) or args.scale_size <= 0:
        raise UserError("sizes must be positive MiB")
    if args.hosts < 2 or any(n < 2 for n in scale_hosts) or max([args.hosts, *scale_hosts]) > 16:
        raise UserError("hosts must be between 2 and 16")
    if args.rounds < 1 or reps < 1:
        raise UserError("--rounds and --reps must be at least 1")
    log(f"capturing real gradients (HDC on {args.data or 'digits'}) ...")
    captures = capture_gradients(8, data=args.data, seed=args.seed)
    report = {"dataset": args.data or "digits", "error_bound": args.error_bound, "mtu": args.mtu,
              "rounds": args.rounds, "reps": reps, "impls": impls, "scale_size": args.scale_size,
              "links": []}
    if args.sweep:
        report["counts"] = counts
    for i, rate in enumerate(rates):
        if args.sweep:
            link = measure_sweep(rate, counts, impls, args.hosts, args.rounds, reps, args.mtu, args.error_bound,
                                 list(captures))
        else:
            link = measure(rate, sizes, impls, args.hosts, scale_hosts if i == 0 else [], args.scale_size,
                           args.rounds, reps, args.mtu, args.error_bound, list(captures), headrooms)
        report["links"].append(link)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        (print_sweep if args.sweep else print_report)(report)
    return 0


def add_arguments(p) -> None:
    p.add_argument("--rates", default="100mbit,1gbit", help="comma-separated link rates (default 100mbit,1gbit)")
    p.add_argument("--sizes", default="10,100", help="gradient sizes in MiB (default 10,100)")
    p.add_argument("--impls", help=f"which allreduces (default {','.join(IMPLS)}); on request also "
                   f"{','.join(EXTRA_IMPLS)}, and ring-app+CODEC for another codec in ring-app; with --sweep: from "
                   f"{','.join(MPI_IMPLS)} (default all three)")
    p.add_argument("--hosts", type=int, default=4, help="hosts for the size sweep (default 4)")
    p.add_argument("--scale-hosts", default="2,4,8",
                   help="host counts for the scalability sweep at the first rate ('' to skip; default 2,4,8)")
    p.add_argument("--scale-size", type=int, default=25, help="MiB for the scalability sweep (default 25)")
    p.add_argument("--rounds", type=int, default=1, help="rounds, each running every allreduce in turn (default 1)")
    p.add_argument("--reps", type=int, help=f"timed allreduces per run, after one warm-up (default 3; {SWEEP_REPS} "
                   "per count with --sweep)")
    p.add_argument("--sweep", action="store_true",
                   help="instead of --sizes: MPI_Allreduce of --counts values, stock MPI against the library "
                        "(mpi-app, mpi-nic) taking every count, and the count from which the library is faster")
    p.add_argument("--counts", help="with --sweep: numbers of float32 values (default "
                   f"{','.join(map(str, SWEEP_COUNTS))})")
    p.add_argument("--mtu", type=int, default=9000, help="link MTU (default 9000)")
    p.add_argument("--error-bound", type=int, default=DEFAULT_ERROR_BOUND, help=f"soft NIC error bound exponent (default {DEFAULT_ERROR_BOUND})")
    p.add_argument("--headroom", default="0", help="comma-separated headrooms h of the Group's compressing rings "
                   f"({', '.join(HEADROOM_IMPLS)}): each block's max scaled into [2^(-1-h), 2^-h), h bits of "
                   "precision given up for ratio; each h is a row of its own, ring-app/h2 (default 0)")
    p.add_argument("--data", metavar="PATH", help="MNIST to capture gradients on (default: digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split and the captured gradients (default 0)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)
