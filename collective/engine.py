"""``Group.allreduce`` on the ring engine (collective/ring_engine.c through cffi, the C the MPI
library runs; its schedule, transports and wire: docs/collectives.md, "The ring engine").

The engine runs the INCEPTIONN codec, THC (in app mode, summed without decoding) and raw
floats; ``supports`` says which calls it takes.
It runs the whole ring in one C call without the GIL, on the Group's two ring sockets; Python
keeps the API, the rendezvous, the control rounds and the checks around it."""
from __future__ import annotations

import math
import socket

import numpy as np

from ..codecs.inceptionn import InceptionnCodec
from ..codecs.thc import THCCodec
from ._engine import ffi, lib
from .ring import WireError, scaling_bound
from .stats import Timers
from .transport import Conn


class EngineError(RuntimeError):
    pass


def supports(mode: str, codec, scaled: bool) -> bool:
    """raw floats; on the tagged socket the INCEPTIONN codec (scaled or not) and any other per-value
    codec (its ``reconstruct`` called back from the engine; scaled, INCEPTIONN's at its bound, as
    ring.Wire does); in the process the INCEPTIONN codec scaled (wire format v2) and THC (its C
    codec, homomorphic)."""
    if mode == "raw":
        return True
    if mode == "nic":
        return type(codec) is InceptionnCodec or codec.per_value
    return (type(codec) is InceptionnCodec and scaled) or (type(codec) is THCCodec and not scaled)


def _thc_state(codec: THCCodec, world: int):
    """The call's THC parameters for collective/ring_codecs.c (struct re_thc)."""
    s = ffi.new("struct re_thc *")
    s.bits, s.granularity, s.ranks = codec.bits, codec.granularity, world
    s.table[0:len(codec.table)] = list(codec.table)
    s.t_p = codec.t_p
    s.norm, s.rot_seed, s.noise_seed = codec.round_parameters()
    return s


def _reconstruct_callback(codec, failures: list, conns):
    """The codec's Python ``reconstruct`` as the engine's (the engine calls it with the GIL taken
    back). An exception is kept in ``failures`` and raised after the call; the ring's connections
    are shut down at once, so that nothing this rank has not reconstructed goes out and its
    neighbours fail too instead of summing it."""
    def reconstruct(_c, x, n, out):
        try:
            src = np.frombuffer(ffi.buffer(x, n * 4), np.float32)
            dst = np.frombuffer(ffi.buffer(out, n * 4), np.float32)
            got = codec.reconstruct(src, dst)
            if got is not dst:
                dst[:] = got
        except BaseException as e:      # noqa: BLE001 - nothing may unwind through C
            failures.append(e)
            for conn in conns:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    return ffi.callback(ffi.typeof(ffi.new("struct re_codec *").reconstruct), reconstruct)


def ring_allreduce(work: np.ndarray, *, rank: int, world: int, send: Conn, recv: Conn, chunk_values: int,
                   mode: str, codec=None, sink=None, timers: Timers | None = None, scaled: bool = False,
                   timeout: float | None = None) -> None:
    """Sum ``work`` (float32, 1-D, contiguous: Group refuses another ``out``) over the ring in
    place; ``sink.lost`` gets sent - decoded (error feedback; the caller compensated ``work``
    already)."""
    assert supports(mode, codec, scaled) and world >= 2
    c = ffi.new("struct re_codec *")
    failures: list = []
    callback = state = None
    if mode != "raw":
        if type(codec) is THCCodec:
            state = _thc_state(codec, world)
            lib.re_codec_thc(c, state)
        elif type(codec) is InceptionnCodec or scaled:
            lib.re_codec_inceptionn(c, scaling_bound(codec))
            c.scaled = int(bool(scaled))
        else:                           # another per-value codec on the tagged socket
            lib.re_codec_inceptionn(c, -10)    # for its error text only: reconstruct is the codec's
            c.scaled = 0
            callback = _reconstruct_callback(codec, failures, (send, recv))
            c.reconstruct = callback
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
    if failures:
        raise failures[0]
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
