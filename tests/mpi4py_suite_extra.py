"""Not part of mpi4py: tests/test_mpi4py_suite.py copies this module, as
test_allreduce_inceptionn.py, next to mpi4py's own (unchanged) test modules, so that the same
processes that run mpi4py's suite also make float32 MPI_SUM allreduces above the library's
default threshold. mpi4py's suite makes none (its largest count is in the tens), so without this
module the library would only ever pass calls through. Discovery is alphabetical: this runs
early, and the ring it sets up on COMM_WORLD stays open through the rest of the suite, until
MPI_Finalize.

The check is the one of tests/test_pmpi_allreduce.py (check_taken): every rank ends bit-identical,
within N * 2^-7 * 2N * max|x| of the exact sum.
"""
import numpy as np

import mpiunittest as unittest
from mpi4py import MPI

COUNT = 3 * 65536 + 5          # above the default threshold, not a multiple of the chunk


class TestInceptionnAllreduce(unittest.TestCase):
    def check(self, comm, inplace):
        size, rank = comm.Get_size(), comm.Get_rank()
        x = np.random.default_rng(1000 + rank).standard_normal(COUNT).astype(np.float32)
        inputs = comm.allgather(x)              # pickled: no MPI_Allreduce
        if inplace:
            out = x.copy()
            comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        else:
            out = np.empty_like(x)
            comm.Allreduce(x, out, op=MPI.SUM)
        everyone = comm.allgather(out.tobytes())
        self.assertTrue(all(b == everyone[0] for b in everyone), "ranks differ")
        exact = np.sum(np.array(inputs, dtype=np.float64), axis=0)
        m = max(float(np.abs(v).max()) for v in inputs)
        err = float(np.abs(out - exact).max())
        self.assertGreater(err, 0)              # compressed: not MPI's exact float sum
        self.assertLessEqual(err, size * 2.0**-7 * 2 * size * m)

    def testWorld(self):
        if MPI.COMM_WORLD.Get_size() < 2:
            self.skipTest("needs 2 ranks")
        self.check(MPI.COMM_WORLD, inplace=True)
        self.check(MPI.COMM_WORLD, inplace=False)

    def testDupFreed(self):
        if MPI.COMM_WORLD.Get_size() < 2:
            self.skipTest("needs 2 ranks")
        comm = MPI.COMM_WORLD.Dup()             # its own ring, torn down by Free
        try:
            self.check(comm, inplace=True)
        finally:
            comm.Free()


if __name__ == "__main__":
    unittest.main()
