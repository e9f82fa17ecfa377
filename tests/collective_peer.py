"""One rank of a collective run inside a testbed host (tests/test_collective_testbed.py).

Runs the same gradient through each collective in turn (plain ring, codec-in-collective ring,
soft-NIC ring, soft-NIC WA), reading this host's soft NIC counters around each one, with
barriers so every rank's traffic of a phase is finished before any daemon is read. Saves the
results, the counter deltas, the sockets' ToS and the group's stats to OUT/rank<r>.npz.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from inceptionn.codecs import get_codec
from inceptionn.daemon.stats import read as read_stats
from inceptionn.collective import FileStore, Group

COUNTERS = ("egress_packets", "egress_compressed", "egress_orig_bytes", "egress_wire_bytes", "egress_raw_bytes",
            "egress_raw_view_pending",
            "ingress_restored", "ingress_orig_bytes", "drop_crc", "drop_header", "drop_checksum", "drop_decode",
            "drop_malformed", "drop_too_big")


def data(rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng([11, rank])
    # gradient-like: mostly small, a few large values per bucket
    return (rng.standard_normal(n) * 0.01 * np.exp2(rng.integers(-3, 2, n))).astype(np.float32)


def counters(sock: str | None) -> dict:
    if not sock:
        return dict.fromkeys(COUNTERS, 0)
    c = read_stats(sock)["counters"]
    return {k: int(c.get(k, 0)) for k in COUNTERS}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--bind", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--nicd-socket")
    p.add_argument("--error-bound", type=int, default=-10)
    p.add_argument("--phases", default="raw,app,nic,wa")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    codec = get_codec("inceptionn", error_bound=a.error_bound)
    x = data(a.rank, a.n)
    out, deltas, times = {}, {}, {}
    with Group(a.rank, a.world, FileStore(a.store, timeout=120), bind_addr=a.bind, codec=codec, timeout=120) as g:
        for phase in a.phases.split(","):
            g.barrier()
            before = counters(a.nicd_socket)
            t = time.perf_counter()
            for _ in range(a.repeat):
                if phase == "wa":
                    r = g.wa_step(x, (lambda s: (s * np.float32(-0.1)).astype(np.float32)) if a.rank == 0 else None,
                                  compress="nic", error_feedback=False)
                else:
                    mode = None if phase == "raw" else phase
                    r = g.allreduce(x, compress=mode, error_feedback=False if mode else None)
            times[phase] = (time.perf_counter() - t) / a.repeat
            g.barrier()
            after = counters(a.nicd_socket)
            out[phase] = r
            deltas[phase] = {k: after[k] - before[k] for k in COUNTERS}
        conns = g.connections()
        stats = g.stats.as_dict()
    np.savez(os.path.join(a.out, f"rank{a.rank}.npz"), **out)
    with open(os.path.join(a.out, f"rank{a.rank}.json"), "w") as f:
        json.dump({"deltas": deltas, "conns": conns, "stats": stats, "times": times}, f)


if __name__ == "__main__":
    main()
