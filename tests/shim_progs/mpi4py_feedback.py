"""A plain mpi4py script for the error-feedback check of tests/test_pmpi_allreduce.py: T calls of
``comm.Allreduce(MPI.IN_PLACE, buf)`` on the same input (INDIR/grad<rank>.npy, a fresh copy each
time), the float64 sum of their results, then one call per extra count (a prefix of the input),
which the library's residual memory must hold within its bound. Saves OUTDIR/rank<R>.npz.

Usage: mpi4py_feedback.py INDIR OUTDIR T [COUNT,COUNT,...]
"""
import sys

import numpy as np
from mpi4py import MPI


def main() -> None:
    indir, outdir, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
    counts = [int(c) for c in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    x = np.load(f"{indir}/grad{rank}.npy")
    total = np.zeros(x.size, np.float64)
    first = None
    for _ in range(calls):
        buf = x.copy()                       # a new array every call, as a training step's gradient
        comm.Allreduce(MPI.IN_PLACE, buf)
        total += buf
        if first is None:
            first = buf
    for c in counts:
        buf = x[:c].copy()
        comm.Allreduce(MPI.IN_PLACE, buf)
    np.savez(f"{outdir}/rank{rank}.npz", first=first, total=total)


if __name__ == "__main__":
    main()
