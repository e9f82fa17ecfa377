"""``inceptionn.mpi.allreduce_comp`` in a real mpi4py job started by a real ``mpirun``.

The job is this file run as a script under mpirun; each rank saves what it got, and the test
compares across ranks and against MPI's own Allreduce.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

N = 50_001

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs OpenMPI's mpirun")


def data(rank: int, n: int = N) -> np.ndarray:
    return (np.random.default_rng([7, rank]).standard_normal(n) * 0.01).astype(np.float32)


def mpi_job(outdir: str) -> None:
    from mpi4py import MPI

    import inceptionn.mpi as im
    from inceptionn.collective import Group

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    x = data(rank)
    out = {}
    out["nic"] = im.allreduce_comp(x)                              # tagged ring, soft-NIC semantics
    out["raw"] = im.allreduce_comp(x, compress=None)
    ref = np.empty_like(x)
    comm.Allreduce(x, ref, op=MPI.SUM)
    out["mpi"] = ref
    m = x[:50_000].reshape(100, 500).copy()
    res = im.allreduce_comp(m, m, compress=None)                   # in place, shape kept
    out["inplace_same_object"] = np.array(res is m)
    out["inplace"] = m
    out["avg"] = im.allreduce_comp(x, compress=None, average=True)
    try:
        im.allreduce_comp(x.astype(np.float64))
        out["refused"] = np.array("")
    except TypeError as e:
        out["refused"] = np.array(str(e))
    out["converted"] = im.allreduce_comp(x.astype(np.float64), compress=None, convert=True)
    try:
        im.init(comm)
        out["init_twice"] = np.array("")
    except ValueError as e:
        out["init_twice"] = np.array(str(e))
    sub = comm.Split(rank % 2, rank)
    out["sub"] = im.allreduce_comp(x, comm=sub, compress=None)
    sub_group = im.group_for(sub)
    assert isinstance(sub_group, Group) and sub_group.world == sub.Get_size()
    sub.Free()                                                     # closes the sub group
    out["sub_closed"] = np.array(sub_group._closed)
    conns = im.group_for().connections()
    out["tos"] = np.array([(c["kind"], c["direction"], c["tos"]) for c in conns], dtype=object)
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), **out)


def test_allreduce_comp_under_mpirun(tmp_path):
    world = 3
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,tcp", INCEPTIONN_BIND_ADDR="127.0.0.1")
    proc = subprocess.run(["mpirun", "-np", str(world), "--oversubscribe", "-x", "INCEPTIONN_BIND_ADDR",
                           sys.executable, __file__, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = [np.load(tmp_path / f"rank{r}.npz", allow_pickle=True) for r in range(world)]
    xs = [data(r) for r in range(world)]
    exact = np.sum(np.array(xs, dtype=np.float64), axis=0)
    for key in ("nic", "raw", "inplace", "avg", "converted"):
        assert all(np.array_equal(res[0][key], r[key]) for r in res), f"{key}: ranks differ"
    assert res[0]["nic"].dtype == np.float32
    # the uncompressed ring equals MPI's allreduce up to float32 summation order
    np.testing.assert_allclose(res[0]["raw"], res[0]["mpi"], rtol=1e-5, atol=1e-8)
    # the compressed one within the codec's bound: N lossy hops, 2^-7 of the scaled values each
    m = max(float(np.abs(x).max()) for x in xs)
    assert np.abs(res[0]["nic"] - exact).max() <= world * 2.0**-7 * 2 * world * m
    assert not np.array_equal(res[0]["nic"], res[0]["raw"]), "compress='nic' should be lossy"
    assert bool(res[0]["inplace_same_object"])
    assert res[0]["inplace"].shape == (100, 500)
    np.testing.assert_allclose(res[0]["inplace"].ravel(), exact[:50_000], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(res[0]["avg"], exact / world, rtol=1e-5, atol=1e-7)
    assert "float32" in str(res[0]["refused"]) and "convert=True" in str(res[0]["refused"])
    assert res[0]["converted"].dtype == np.float64
    assert "already has an inceptionn group" in str(res[0]["init_twice"])
    for r in range(world):
        members = [q for q in range(world) if q % 2 == r % 2]
        want = np.sum(np.array([xs[q] for q in members], dtype=np.float64), axis=0)
        np.testing.assert_allclose(res[r]["sub"], want, rtol=1e-5, atol=1e-7)
        assert bool(res[r]["sub_closed"])
        for kind, direction, tos in res[r]["tos"]:
            assert tos == (0x28 if (kind == "RING_TAGGED" and direction == "out") else 0), (kind, direction, tos)
        assert ("RING_TAGGED", "out", 0x28) in [tuple(t) for t in res[r]["tos"]]


if __name__ == "__main__":
    mpi_job(sys.argv[1])
