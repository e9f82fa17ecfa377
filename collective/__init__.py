"""Gradient collectives over TCP for the soft NIC: the INCEPTIONN ring and the WA baseline
(docs/collectives.md). ``Group`` is the way in; the integrations live beside it and are imported
on their own, so neither torch nor mpi4py is needed for the rest:

- ``inceptionn.collective.mpi``: ``allreduce_comp`` for mpi4py programs (also ``inceptionn.mpi``)
- ``inceptionn.collective.torch_hook``: the PyTorch DDP communication hook
"""
from .group import CallStats, Group, GroupStats
from .rendezvous import FileStore

__all__ = ["Group", "GroupStats", "CallStats", "FileStore"]
