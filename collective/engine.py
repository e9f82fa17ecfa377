"""``Group.allreduce`` on the ring engine (collective/ring_engine.c through cffi, the C the MPI
library runs; its schedule, transports and wire: docs/collectives.md, "The ring engine"), the one
implementation of the ring's schedule.

The engine runs raw floats and every codec: INCEPTIONN's, THC's, 3LC's and TernGrad's C codecs in
C (THC in app mode summed without decoding), any other codec through its Python methods called back (``reconstruct``
on the tagged socket, ``encode``/``decode_into`` in the process); ``supports`` says which calls
it takes.
It runs the whole ring in one C call without the GIL, on the Group's two ring sockets; Python
keeps the API, the rendezvous, the control rounds and the checks around it."""
from __future__ import annotations

import math
import socket

import numpy as np

from ..codecs.inceptionn import InceptionnCodec
from ..codecs.terngrad import PACKINGS, TernGradCodec
from ..codecs.thc import THCCodec
from ..codecs.threelc import ThreeLCCodec
from ._engine import ffi, lib
from .ring import WireError, scaling_bound
from .stats import Timers
from .transport import Conn


class EngineError(RuntimeError):
    pass


def supports(mode: str, codec, scaled: bool) -> bool:
    """raw floats; on the tagged socket the INCEPTIONN codec (scaled or not) and any other per-value
    codec (its ``reconstruct`` called back from the engine; scaled, INCEPTIONN's at its bound, as
    ring.Wire does); in the process every codec: INCEPTIONN's, THC's, 3LC's and TernGrad's in C
    (THC summed without decoding), any other through its Python ``encode``/``decode_into`` called
    back."""
    if mode == "nic":
        return type(codec) is InceptionnCodec or codec.per_value
    return mode in ("raw", "app")


def _thc_state(codec: THCCodec, world: int):
    """The call's THC parameters for collective/ring_codecs.c (struct re_thc)."""
    s = ffi.new("struct re_thc *")
    s.bits, s.granularity, s.ranks = codec.bits, codec.granularity, world
    s.table[0:len(codec.table)] = list(codec.table)
    s.t_p = codec.t_p
    s.norm, s.rot_seed, s.noise_seed = codec.round_parameters()
    return s


def _failed(failures: list, conns, e: BaseException) -> None:
    """A Python method called back from the engine raised: keep the exception (raised after the
    call) and shut the ring's connections at once, so that the neighbours fail too."""
    failures.append(e)
    for conn in conns:
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _PythonCodec:
    """A codec's Python ``encode``/``decode_into`` as the engine's (the engine calls them with the
    GIL taken back), in the codec transport. A stream that does not decode (ValueError) fails the
    call as a received chunk that does not belong to it (RE_E_DATA, its message kept for the
    error line); any other exception is kept in ``failures`` and raised after the call, the ring's
    connections shut at once so that the neighbours fail too."""

    E_DATA, E_FAILED = -1, -2

    def __init__(self, codec, c, failures: list, conns):
        self.codec, self.failures, self.conns = codec, failures, conns
        self.message = ffi.new("char[512]")
        t = ffi.typeof(c[0])
        fields = dict(t.fields)
        self.callbacks = [ffi.callback(fields[name].type, fn) for name, fn in
                          (("max_encoded_size", self.max_size), ("encode", self.encode),
                           ("decode", self.decode), ("strerror", self.strerror))]
        c.max_encoded_size, c.encode, c.decode, c.strerror = self.callbacks

    def fail(self, e: BaseException) -> int:
        _failed(self.failures, self.conns, e)
        return self.E_FAILED

    def max_size(self, _c, n):
        try:
            return int(self.codec.max_encoded_size(n))
        except NotImplementedError:
            return 32 * n + 65536           # the frame limit of the Python ring this replaces
        except BaseException as e:          # noqa: BLE001 - nothing may unwind through C
            self.fail(e)
            return 0

    def encode(self, _c, x, n, out, cap):
        try:
            blob = memoryview(self.codec.encode(np.frombuffer(ffi.buffer(x, n * 4), np.float32))).cast("B")
            if blob.nbytes > cap:
                raise ValueError(f"codec {self.codec.name!r} encoded {n} values into {blob.nbytes} bytes, more "
                                 f"than its max_encoded_size ({cap})")
            ffi.memmove(out, blob, blob.nbytes)
            return blob.nbytes
        except BaseException as e:          # noqa: BLE001
            return self.fail(e)

    def decode(self, _c, inp, length, out, n):
        try:
            self.codec.decode_into(bytes(ffi.buffer(inp, length)), np.frombuffer(ffi.buffer(out, n * 4), np.float32))
            return 0
        except ValueError as e:
            text = str(e).encode(errors="replace")[: len(self.message) - 1]
            ffi.memmove(self.message, text + b"\0", len(text) + 1)
            return self.E_DATA
        except BaseException as e:          # noqa: BLE001
            return self.fail(e)

    def strerror(self, status):
        return self.message if status == self.E_DATA else self._failed

    _failed = ffi.new("char[]", b"the codec raised (see the exception)")


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
            _failed(failures, conns, e)
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
    callback = state = start_draw = None
    if mode != "raw":
        if type(codec) is THCCodec:
            state = _thc_state(codec, world)
            lib.re_codec_thc(c, state)
        elif mode == "app" and type(codec) is ThreeLCCodec and codec.impl == "c" and not scaled:
            state = ffi.new("struct re_tlc *")
            state.sparsity, state.zre = codec.sparsity, int(bool(codec.zre))
            lib.re_codec_threelc(c, state)
        elif mode == "app" and type(codec) is TernGradCodec and codec.impl == "c" and not scaled and \
                (not codec.share_scaler or codec.agreed_scaler is not None):
            state = ffi.new("struct re_tg *")
            state.clip, state.packing, state.seed = codec.clip, PACKINGS[codec.packing], codec.seed
            state.shared = codec.agreed_scaler if codec.share_scaler else -1.0
            state.draw = start_draw = codec.draw % 2**64
            lib.re_codec_terngrad(c, state)
        elif mode == "app" and type(codec) is not InceptionnCodec:    # any other codec, called back
            state = _PythonCodec(codec, c, failures, (send, recv))
            c.scaled = int(bool(scaled))
            c.error_bound = scaling_bound(codec) if scaled else 0
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
    if start_draw is not None:           # TernGrad: the random stream's position moves on
        codec.skip((int(state.draw) - start_draw) % 2**64)
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
