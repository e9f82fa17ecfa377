"""Gradient collectives over TCP for the soft NIC: the INCEPTIONN ring and the WA baseline
(docs/collectives.md). ``Group`` is the way in; the integrations live beside it and are imported
on their own, so neither torch nor mpi4py is needed for the rest:

- ``inceptionn.collective.mpi``: ``allreduce_comp`` for mpi4py programs (also ``inceptionn.mpi``)
- ``inceptionn.collective.torch_hook``: the PyTorch DDP communication hook
"""
import importlib

# Imported on first use, so the MPI library's launcher half (pmpi_env, read by `inceptionn env
# --help` and mpirun) does not load numpy with the package.
_LAZY = {"Group": "group", "GroupStats": "group", "CallStats": "group", "FileStore": "rendezvous"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Group", "GroupStats", "CallStats", "FileStore"]
