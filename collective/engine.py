"""``Group.allreduce`` on the ring engine (collective/ring_engine.c through cffi, the C the MPI
library runs; its schedule, transports and wire: docs/collectives.md, "The ring engine"), the one
implementation of the ring's schedule.

The engine runs raw floats and every codec: a codec of the C table (codecs_c/codec_table.h) in C
where its description has a ring codec for the mode and the codec object gives its state
(``c_state``; THC in app mode summed without decoding), any other codec through its Python methods
called back (``reconstruct`` on the tagged socket, ``encode``/``decode_into`` in the process);
``supports`` says which calls it takes.
It runs the whole ring in one C call without the GIL, on the Group's two ring sockets; Python
keeps the API, the rendezvous, the control rounds and the checks around it."""
from __future__ import annotations

import math
import socket

import numpy as np

from ..codecs.blockscale import HEADROOM
from ._engine import ffi, lib
from .ring import WireError, scaling_bound
from .stats import Timers
from .transport import Conn


class EngineError(RuntimeError):
    pass


def supports(mode: str, codec, scaled: bool) -> bool:
    """raw floats; on the tagged socket any per-value codec (its C reconstruct, or its Python one
    called back; scaled, INCEPTIONN's at its bound, as ring.Wire does); in the process every codec
    (in C or called back)."""
    if mode == "nic":
        return codec.per_value
    return mode in ("raw", "app")


def _c_codec(c, codec, mode: str, scaled: bool, world: int):
    """Fill ``c`` with the codec's C ring codec (its description's make over a state from its
    defaults and the codec object's ``c_state``); returns the state (kept alive by the caller), or
    None when the codec's Python methods run instead."""
    d = lib.re_codec_named(codec.name.encode())
    if d == ffi.NULL or not (d.nic if mode == "nic" else d.app) or (scaled and not d.wants_scaling):
        return None
    fields = codec.c_state(world)
    if fields is None:
        return None
    buf = ffi.new("char[]", max(int(d.state_size), 1))
    if d.state_size:
        ffi.memmove(buf, d.defaults, d.state_size)
    state = ffi.cast(ffi.string(d.state_type).decode() + " *", buf) if d.state_type != ffi.NULL else buf
    for name, value in fields.items():
        if isinstance(value, (list, tuple)):
            getattr(state, name)[0:len(value)] = list(value)
        else:
            setattr(state, name, value)
    d.make(c, buf)
    return buf, state


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
        if codec.per_value:         # on the tagged socket
            self.callbacks.append(ffi.callback(fields["reconstruct"].type, self.reconstruct))
            c.reconstruct = self.callbacks[-1]

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

    def reconstruct(self, _c, x, n, out):
        """An exception is kept and the ring's connections shut at once, so that nothing this rank
        has not reconstructed goes out and its neighbours fail too instead of summing it."""
        try:
            src = np.frombuffer(ffi.buffer(x, n * 4), np.float32)
            dst = np.frombuffer(ffi.buffer(out, n * 4), np.float32)
            got = self.codec.reconstruct(src, dst)
            if got is not dst:
                dst[:] = got
        except BaseException as e:      # noqa: BLE001 - nothing may unwind through C
            self.fail(e)

    def strerror(self, status):
        return self.message if status == self.E_DATA else self._failed

    _failed = ffi.new("char[]", b"the codec raised (see the exception)")


def ring_allreduce(work: np.ndarray, *, rank: int, world: int, send: Conn, recv: Conn, chunk_values: int,
                   mode: str, codec=None, sink=None, timers: Timers | None = None, scaled: bool = False,
                   headroom: int = HEADROOM, timeout: float | None = None) -> None:
    """Sum ``work`` (float32, 1-D, contiguous: Group refuses another ``out``) over the ring in
    place; ``sink.lost`` gets sent - decoded (error feedback; the caller compensated ``work``
    already)."""
    assert supports(mode, codec, scaled) and world >= 2
    c = ffi.new("struct re_codec *")
    failures: list = []
    state = None
    if mode != "raw":
        state = _c_codec(c, codec, mode, scaled, world)
        callbacks = None if state else _PythonCodec(codec, c, failures, (send, recv))   # alive for the call
        c.scaled = int(bool(scaled))
        if scaled:
            c.error_bound = scaling_bound(codec)
    r = ffi.new("struct re_ring *")
    r.rank, r.size, r.chunk = rank, world, chunk_values
    r.headroom = headroom
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
    if state:
        codec.c_done(state[1])
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
