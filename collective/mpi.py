"""``allreduce_comp``: the paper's MPI_collective_comp for mpi4py programs.

    from mpi4py import MPI
    import inceptionn.mpi

    g = grad.astype(np.float32)
    total = inceptionn.mpi.allreduce_comp(g)                        # sum over COMM_WORLD
    avg = inceptionn.mpi.allreduce_comp(g, comm=sub, average=True)  # any intracommunicator
    inceptionn.mpi.allreduce_comp(g, g)                             # in place (recvbuf = sendbuf)

The first call on a communicator builds a ``Group`` (collective/group.py) for it: endpoints are
exchanged with ``comm.allgather``, then the ring runs over its own TCP sockets, the gradient ones
tagged ToS 0x28 so the soft NIC compresses them (MPI itself only carries the rendezvous). The
group is cached on the communicator as an MPI attribute and closed when the communicator is
freed (or at exit). ``init(comm, **group_options)`` creates it explicitly with options
(``bind_addr``, ``codec`` matching the daemons' error bound, ``chunk_bytes``, ``tag`` ...);
otherwise the defaults of ``Group`` apply, with ``$INCEPTIONN_BIND_ADDR`` or the host's only
non-loopback address as ``bind_addr``.

Like ``MPI_Allreduce`` every rank of the communicator must call it, in the same order. Only
float32 is reduced: other dtypes raise TypeError unless ``convert=True`` (the values are then
reduced as float32 and the result cast back to the input dtype). Any shape; the reduction is
over the flattened array and the result has the input's shape.
"""
from __future__ import annotations

import atexit

import numpy as np

from .group import Group

__all__ = ["allreduce_comp", "init", "group_for", "close"]

_keyval: int | None = None
_groups: list[Group] = []


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError("inceptionn.mpi needs mpi4py (pip install 'inceptionn[mpi]')") from None
    return MPI


def _key() -> int:
    global _keyval
    if _keyval is None:
        MPI = _mpi()

        def delete(comm, keyval, group):
            group.close()

        _keyval = MPI.Comm.Create_keyval(delete_fn=delete)
        atexit.register(close_all)
    return _keyval


def _comm(comm):
    MPI = _mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
    return comm


def init(comm=None, **group_options) -> Group:
    """Build the Group of ``comm`` with options (collective); raises if it exists already."""
    comm = _comm(comm)
    if comm.Get_attr(_key()) is not None:
        raise ValueError("this communicator already has an inceptionn group; call init() before the first "
                         "allreduce_comp, or close(comm) first")
    group = Group.from_mpi(comm, **group_options)
    comm.Set_attr(_key(), group)
    _groups.append(group)
    return group


def group_for(comm=None) -> Group:
    """The communicator's Group, built with default options on first use (collective then)."""
    comm = _comm(comm)
    group = comm.Get_attr(_key())
    return group if group is not None else init(comm)


def close(comm=None) -> None:
    """Close and forget the communicator's Group (not collective: no communication)."""
    comm = _comm(comm)
    group = comm.Get_attr(_key())
    if group is not None:
        comm.Delete_attr(_key())   # runs the delete callback, which closes it


def close_all() -> None:
    for g in _groups:
        g.close()
    _groups.clear()


def allreduce_comp(sendbuf, recvbuf=None, *, comm=None, compress="nic", codec=None, scaling=None,
                   error_feedback=None, key=None, average: bool = False, convert: bool = False) -> np.ndarray:
    """Sum (or average) ``sendbuf`` over ``comm`` through the INCEPTIONN ring; returns the result
    (``recvbuf`` if given). See the module docstring; the keyword options are those of
    ``Group.allreduce``."""
    if not isinstance(sendbuf, np.ndarray):
        raise TypeError(f"sendbuf must be a numpy array, got {type(sendbuf).__name__}")
    if sendbuf.dtype != np.float32 and not convert:
        raise TypeError(f"allreduce_comp reduces float32 gradients, got {sendbuf.dtype}; convert with "
                        ".astype(np.float32) or pass convert=True")
    if recvbuf is not None:
        if not isinstance(recvbuf, np.ndarray) or recvbuf.shape != sendbuf.shape or recvbuf.dtype != sendbuf.dtype:
            raise TypeError("recvbuf must be a numpy array of the same shape and dtype as sendbuf")
        if not recvbuf.flags.writeable:
            raise ValueError("recvbuf must be writable")
    group = group_for(comm)
    flat = np.ascontiguousarray(sendbuf, dtype=np.float32).reshape(-1)
    if key is None:
        key = ("mpi", sendbuf.shape)
    inplace = (recvbuf is not None and recvbuf.dtype == np.float32 and recvbuf.flags.c_contiguous)
    out = recvbuf.reshape(-1) if inplace else None
    res = group.allreduce(flat, compress=compress, codec=codec, scaling=scaling, error_feedback=error_feedback,
                          key=key, average=average, out=out)
    if inplace:
        return recvbuf
    res = res.reshape(sendbuf.shape)
    if recvbuf is not None:
        recvbuf[...] = res
        return recvbuf
    return res.astype(sendbuf.dtype, copy=False) if sendbuf.dtype != np.float32 else res
