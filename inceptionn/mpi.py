"""``import inceptionn.mpi; inceptionn.mpi.allreduce_comp(a)``: the MPI integration lives in
``inceptionn.collective.mpi`` (collective/mpi.py); this module keeps the short name."""
from inceptionn.collective.mpi import allreduce_comp, close, close_all, group_for, init  # noqa: F401

__all__ = ["allreduce_comp", "init", "group_for", "close", "close_all"]
