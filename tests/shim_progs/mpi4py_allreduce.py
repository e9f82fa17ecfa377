"""A plain mpi4py script that knows nothing of inceptionn: ``comm.Allreduce(MPI.IN_PLACE, grad)``
on a float32 gradient, plus a few calls the MPI_Allreduce library must pass through. Saves
OUTDIR/rankR.npz. With ``--group MODE`` it also runs inceptionn's Python ring (Group) on the
same input, for the one-ring comparison in tests/test_pmpi_allreduce.py.

Usage: mpi4py_allreduce.py OUTDIR N [--group nic|app]
"""
import sys

import numpy as np
from mpi4py import MPI


def main() -> None:
    outdir, n = sys.argv[1], int(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rng = np.random.default_rng([11, rank])
    x = (rng.standard_normal(n) * 0.003).astype(np.float32)
    x[::1000] *= 40                                        # a few large values per bucket
    out = {"input": x.copy()}
    grad = x.copy()
    comm.Allreduce(MPI.IN_PLACE, grad)                     # taken by the library (float32 sum)
    out["inplace"] = grad
    sep = np.empty_like(x)
    comm.Allreduce(x, sep, op=MPI.SUM)
    out["separate"] = sep
    small = x[:100].copy()
    comm.Allreduce(MPI.IN_PLACE, small)                    # below the threshold
    out["small"] = small
    d = x.astype(np.float64)
    comm.Allreduce(MPI.IN_PLACE, d)                        # float64
    out["double"] = d
    mx = np.empty_like(x)
    comm.Allreduce(x, mx, op=MPI.MAX)                      # not a sum
    out["max"] = mx
    if "--group" in sys.argv:
        from inceptionn.collective import Group
        mode = sys.argv[sys.argv.index("--group") + 1]
        with Group.from_mpi(comm, compress=mode) as g:
            out["group"] = g.allreduce(x.copy())
    np.savez(f"{outdir}/rank{rank}.npz", **out)


if __name__ == "__main__":
    main()
