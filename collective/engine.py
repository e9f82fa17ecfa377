"""``Group.allreduce`` on the ring engine (collective/ring_engine.c through cffi, the C the MPI
library runs; its schedule, transports and wire: docs/collectives.md, "The ring engine").

The engine runs the INCEPTIONN codec (and raw floats); ``supports`` says which calls it takes.
It runs the whole ring in one C call without the GIL, on the Group's two ring sockets; Python
keeps the API, the rendezvous, the control rounds and the checks around it."""
from __future__ import annotations

import math

import numpy as np

from ..codecs.inceptionn import InceptionnCodec
from ._engine import ffi, lib
from .ring import WireError
from .stats import Timers
from .transport import Conn


class EngineError(RuntimeError):
    pass


def supports(mode: str, codec, scaled: bool) -> bool:
    """raw floats; the INCEPTIONN codec on the tagged socket (scaled or not) or in the process
    (scaled: wire format v2)."""
    if mode == "raw":
        return True
    return type(codec) is InceptionnCodec and (mode == "nic" or scaled)


def ring_allreduce(work: np.ndarray, *, rank: int, world: int, send: Conn, recv: Conn, chunk_values: int,
                   mode: str, codec=None, sink=None, timers: Timers | None = None, scaled: bool = False,
                   timeout: float | None = None) -> None:
    """Sum ``work`` (float32, 1-D, contiguous: Group refuses another ``out``) over the ring in
    place; ``sink.lost`` gets sent - decoded (error feedback; the caller compensated ``work``
    already)."""
    assert supports(mode, codec, scaled) and world >= 2
    c = ffi.new("struct re_codec *")
    if mode != "raw":
        lib.re_codec_inceptionn(c, codec.error_bound)
        c.scaled = int(bool(scaled))
    r = ffi.new("struct re_ring *")
    r.rank, r.size, r.chunk = rank, world, chunk_values
    r.send_fd, r.recv_fd = send.sock.fileno(), recv.sock.fileno()
    r.timeout_ms = -1 if timeout is None else max(1, math.ceil(timeout * 1000))
    r.tp = lib.re_transport_named(mode.encode())
    r.codec = c if mode != "raw" else ffi.NULL
    lost = sink.lost if sink is not None else None
    stats = ffi.new("struct re_stats *")
    err = ffi.new("char[256]")
    st = lib.re_allreduce(r, ffi.cast("float *", ffi.from_buffer(work)), work.size,
                          ffi.cast("float *", ffi.from_buffer(lost)) if lost is not None else ffi.NULL,
                          stats, err, len(err))
    send.counters.add(send.send_plane, sent=int(stats.bytes_sent))
    recv.counters.add(recv.recv_plane, received=int(stats.bytes_received))
    if timers is not None:
        timers.add("codec", stats.codec_seconds)
        timers.add("sum", stats.sum_seconds)
    if st == lib.RE_OK:
        return
    msg = ffi.string(err).decode(errors="replace")
    if st == lib.RE_E_DATA:
        raise WireError(msg)
    if st == lib.RE_E_PEER:
        raise ConnectionError(f"ring (rank {rank} of {world}): {msg}")
    if st == lib.RE_E_TIMEOUT:
        raise TimeoutError(f"ring (rank {rank} of {world}): {msg}")
    raise EngineError(f"ring (rank {rank} of {world}): {msg}")
