"""A plain mpi4py script for the MPI_Allreduce library's choice between its ring and MPI's own
(tests/test_pmpi_choice.py): CALLS calls of ``comm.Allreduce(MPI.IN_PLACE, x)`` on N random
float32 values at full precision (a fresh input per call, seeded by rank and call); the first
KEEP (default all) saved: OUTDIR/rankR.npz with input{i} and result{i}.

Usage: mpi4py_choice.py OUTDIR N CALLS [KEEP]
"""
import sys

import numpy as np
from mpi4py import MPI


def main() -> None:
    outdir, n, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    keep = int(sys.argv[4]) if len(sys.argv) > 4 else calls
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    out = {}
    for i in range(calls):
        x = np.random.default_rng([23, rank, i]).standard_normal(n).astype(np.float32)
        if i < keep:
            out[f"input{i}"] = x.copy()
        comm.Allreduce(MPI.IN_PLACE, x)
        if i < keep:
            out[f"result{i}"] = x
    np.savez(f"{outdir}/rank{rank}.npz", **out)


if __name__ == "__main__":
    main()
