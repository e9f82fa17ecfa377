"""One rank of ``inceptionn bench allreduce``: times an allreduce (or a WA exchange) of its
gradient file and prints one JSON line. Run by the benchmark inside a testbed host:

    python -m inceptionn.bench.allreduce_peer IMPL RANK WORLD WORKDIR REPS [--master ADDR:PORT]
                                              [--error-bound K] [--headroom H] [--codec NAME]
                                              [--counts N,N,...]

IMPL: ``ring`` (our ring, plain float32, untagged), ``ring-nic`` (our ring on tagged sockets: the
soft NICs compress both legs; ``ring-gso`` the same, the launcher runs the daemons with gso;
``ring-gso-v2`` with gso and no trains),
``ring-app`` (the same ring compressing inside the collective, codec in the application, untagged
sockets, no daemon involved; ``--codec`` another codec than inceptionn), ``wa`` / ``wa-nic`` (the worker-aggregator exchange, plain / gradient leg tagged),
``ring-notag`` (ring-nic's computation, scaling and error feedback, on untagged sockets: the
cost of the application side alone), ``gloo`` (torch.distributed), ``gloo-fp16`` / ``gloo-bf16``
(gloo as DDP runs it with torch's ``fp16_compress_hook`` / ``bf16_compress_hook``: per 25 MiB
bucket, cast to 16 bits, divide by WORLD, allreduce, cast back; the NMSE is of WORLD x that mean), ``mpi`` (MPI_Allreduce through mpi4py; RANK/WORLD come from MPI;
``mpi-nic`` and ``mpi-app`` are the same program, launched with the MPI_Allreduce library).
WORKDIR holds ``grad<rank>.npy`` (this rank's input) and ``exact.npy`` (the float64 sum), and
is the rendezvous directory of the ring. Every rep starts after a barrier and copies the input
first, so each rep reduces the same values. Printed: seconds per rep, the NMSE (rank 0) and CRC of
the first call's result, and for our ring the bytes it sent per plane in that call. ``--counts`` (MPI only, the threshold sweep): one
warm-up and REPS timed allreduces of the first N values of the input for each N, in turn.
"""
from __future__ import annotations

import json
import os
import sys
import time
import zlib

import numpy as np

from ..limits import DEFAULT_ERROR_BOUND


HOOK_IMPLS = {"gloo-fp16": "fp16", "gloo-bf16": "bf16"}   # DDP's hooks: train/torch_hooks.py


def _barrier_fn(impl: str, group=None, dist=None, comm=None):
    if impl.startswith("gloo"):
        return dist.barrier
    if impl.startswith("mpi"):
        return comm.Barrier
    return group.barrier


def main(argv: list[str]) -> int:
    impl, rank, world, workdir, reps = argv[0], int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    master = argv[argv.index("--master") + 1] if "--master" in argv else None
    error_bound = int(argv[argv.index("--error-bound") + 1]) if "--error-bound" in argv else DEFAULT_ERROR_BOUND
    counts = [int(c) for c in argv[argv.index("--counts") + 1].split(",")] if "--counts" in argv else None
    headroom = int(argv[argv.index("--headroom") + 1]) if "--headroom" in argv else 0
    codec_name = argv[argv.index("--codec") + 1] if "--codec" in argv else "inceptionn"
    comm = dist = group = None
    if impl.startswith("mpi"):
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rank, world = comm.Get_rank(), comm.Get_size()
    x = np.load(os.path.join(workdir, f"grad{rank}.npy"))
    buf = np.empty_like(x)

    if impl.startswith("gloo"):
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world)
        t = torch.from_numpy(buf)
        if impl in HOOK_IMPLS:
            from inceptionn.train.torch_hooks import hook_allreduce
            op = hook_allreduce(HOOK_IMPLS[impl], t)
        else:
            op = lambda: dist.all_reduce(t)  # noqa: E731
    elif impl.startswith("mpi"):
        from mpi4py import MPI
        op = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # noqa: E731
    else:
        from inceptionn.codecs import applicable, get_codec
        from inceptionn.collective import FileStore, Group
        compress = {"ring": None, "wa": None, "ring-app": "app"}.get(impl, "nic")
        group = Group(rank, world, FileStore(os.path.join(workdir, "store")), compress=compress,
                      codec=get_codec(codec_name, **applicable(codec_name, error_bound=error_bound)), prefix=f"bench-{impl}",
                      tag=impl != "ring-notag", headroom=headroom)
        if impl in ("wa", "wa-nic"):
            op = lambda: buf.__setitem__(slice(None), group.wa_step(buf, lambda s: s))  # noqa: E731
        else:
            op = lambda: group.allreduce(buf, out=buf)  # noqa: E731
    barrier = _barrier_fn(impl, group, dist, comm)
    if counts:
        return sweep(comm, x, counts, reps, barrier)

    times, out = [], {"impl": impl, "rank": rank, "world": world}
    for rep in range(reps + 1):  # rep 0 warms up: connections, buffers, TCP windows
        np.copyto(buf, x)
        barrier()
        t0 = time.perf_counter()
        op()
        times.append(time.perf_counter() - t0)
        if rep == 0:
            # Error of one reduction of these inputs (later reps carry error feedback from the
            # earlier ones); identical on every rank, which the CRC lets the launcher check.
            out["crc"] = zlib.crc32(buf.tobytes())
            if group is not None:   # the bytes this rank sent in that one call, per plane
                out["first_call_bytes"] = dict(group.stats.last.bytes_sent)
            if rank == 0:
                exact = np.load(os.path.join(workdir, "exact.npy"))
                # wa-nic: update_fn returns the sum itself; the DDP hooks return the mean
                err = buf.astype(np.float64) * (world if impl in HOOK_IMPLS else 1) - exact
                out["nmse"] = float(np.dot(err, err) / max(np.dot(exact, exact), 1e-300))
    barrier()
    out["seconds"] = times[1:]
    if group is not None:
        out["bytes"] = group.stats.as_dict()["total"]
        group.close()
    if dist is not None:
        dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    return 0


def sweep(comm, x: np.ndarray, counts: list[int], reps: int, barrier) -> int:
    """Seconds per MPI_Allreduce of x[:count] for each count (a warm-up first, then reps). Rank 0
    prints one line for all: per rep the slowest rank's time, and whether all ranks ended with
    the same results (long lines of four ranks could interleave in mpirun's output)."""
    from mpi4py import MPI
    times, crc = {}, 0
    for count in counts:
        buf = np.empty(count, np.float32)
        t = []
        for _ in range(reps + 1):
            np.copyto(buf, x[:count])
            barrier()
            t0 = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf)
            t.append(time.perf_counter() - t0)
        times[str(count)] = t[1:]
        crc = zlib.crc32(buf.tobytes(), crc)
    every = comm.gather((times, crc), root=0)
    if comm.Get_rank() == 0:
        out = {"rank": 0, "world": comm.Get_size(), "crc": crc, "same": len({c for _, c in every}) == 1,
               "sweep": {k: [max(t[k][i] for t, _ in every) for i in range(reps)] for k in times}}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
