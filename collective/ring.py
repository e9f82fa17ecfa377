"""The ring's per-chunk transforms in Python (``Wire``), the simulator over them
(``simulate_ring``, bench scale) and the Python ring for the codecs the C ring engine does not
run yet.

The ring itself, its schedule, transports and wire, is described once in docs/collectives.md
("The ring", "The ring engine", "Wire format v2"). ``Group.allreduce`` runs it on the C engine
(collective/engine.py) for raw floats, the INCEPTIONN codec and THC; ``ring_allreduce`` below runs
the same schedule in two threads for ``app`` mode with the other codecs (and INCEPTIONN's app
mode without scaling), which decode, add and re-encode per hop. WA (wa.py) and the simulator
use ``Wire`` in every mode, so the simulator gives the bits of a real ring (tested).

Error feedback: ``sink.record(a, b, sent, decoded)`` is called for every chunk this rank puts on
the wire in phase 1 (``decoded`` = what the receiver gets, ``Wire.send``'s second value) and for
its owned block in phase 2 (R and what the payload decodes to). Over one call that covers every
position of the vector exactly once, so the caller gets a full residual ``sent - decoded``.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from ..codecs.blockscale import BLOCK_VALUES, HEADROOM, BlockScale
from .stats import Timers
from .transport import Conn

MODES = ("raw", "nic", "app")


def block_bounds(n: int, world: int) -> list[tuple[int, int]]:
    return [(b * n // world, (b + 1) * n // world) for b in range(world)]


def chunk_list(a: int, b: int, chunk: int) -> list[tuple[int, int]]:
    return [(i, min(i + chunk, b)) for i in range(a, b, chunk)]


class _Progress:
    def __init__(self):
        self.cond = threading.Condition()
        self.done = 0
        self.error: BaseException | None = None

    def mark(self) -> None:
        with self.cond:
            self.done += 1
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()

    def wait_for(self, count: int) -> None:
        with self.cond:
            while self.done < count and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _Aborted()


class _Aborted(Exception):
    pass


def scaling_bound(codec) -> int:
    """The error bound the per-block scaling runs INCEPTIONN's reconstruction at: the codec's."""
    k = getattr(codec, "error_bound", None)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"codec {codec.name!r} asks for scaling but has no integer error_bound: the "
                         "per-block scaling runs INCEPTIONN's reconstruction at that bound")
    return int(k)


class Wire:
    """The per-chunk transforms of one call, shared by the socket ring, WA and the simulator
    (bench/scale.py), so that all three produce the same bits.

    ``scaled`` (codecs whose traits ask for scaling): every chunk goes as wire format v2
    (docs/collectives.md): per block of ``blockscale.BLOCK_VALUES`` values, one exponent float and
    the block's values times 2^s through the codec's reconstruction (codecs_c/blockscale_codec.h);
    in ``nic`` mode those floats go on the tagged socket, in ``app`` mode the codec's stream of them
    goes in a frame. Otherwise (v1) a chunk goes as before: the reconstruction (``nic``), the
    codec's stream (``app``) or the floats themselves (``raw``).

    A payload is a float32 array (raw, nic) or bytes (app). ``send`` gives the payload of a
    phase-1 chunk and what its receiver decodes; ``receive`` decodes one into ``out`` (raising
    ValueError for one the sender cannot have produced); ``own`` turns the owner's reduced chunk
    into what every rank keeps, in place, and returns the payload that travels in phase 2, which
    every rank forwards unchanged.
    """

    def __init__(self, mode: str, codec=None, *, scaled: bool = False, need_decoded: bool = True,
                 block: int = BLOCK_VALUES, headroom: int = HEADROOM):
        assert mode in MODES
        self.mode, self.codec = mode, codec
        self.scaled = bool(scaled) and mode != "raw"
        self.need_decoded = need_decoded        # False: send() may skip what the receiver decodes
        self.bs = None
        if self.scaled:
            self.bs = BlockScale(scaling_bound(codec), block, headroom)   # other sizes only to measure them
        # the wire is the values themselves: received straight into the destination
        self.direct = mode == "raw" or (mode == "nic" and not self.scaled)

    def wire_floats(self, m: int) -> int:
        """float32 values on the wire for a chunk of ``m`` (raw and nic modes)."""
        return self.bs.wire_values(m) if self.scaled else m

    def send(self, chunk: np.ndarray):
        """Phase 1: (payload, what the receiver decodes or None when not needed)."""
        if self.mode == "raw":
            return chunk, None
        if self.scaled:
            dec = np.empty_like(chunk) if self.need_decoded else None
            wire = self.bs.encode(chunk, dec)
            return (wire if self.mode == "nic" else self.codec.encode(wire)), dec
        if self.mode == "nic":
            q = self.codec.reconstruct(chunk)   # a fixed point: arrives as q, compressed or not
            return q, q
        if self.need_decoded:
            return self.codec.encode_decoded(chunk)
        return self.codec.encode(chunk), None

    def receive(self, payload, out: np.ndarray) -> None:
        if self.direct:
            if payload is not out:
                out[:] = payload
        elif self.mode == "nic":
            self.bs.decode_into(payload, out)
        elif self.scaled:
            wire = self.codec.decode(payload, self.bs.wire_values(out.size))
            self.bs.decode_into(wire, out)
        else:
            self.codec.decode_into(payload, out)

    def own(self, dst: np.ndarray):
        """Phase 2 at the owner: ``dst`` becomes what every rank decodes; returns the payload."""
        if self.mode == "raw":
            return dst
        if self.scaled:
            wire = self.bs.encode(dst, dst)
            return wire if self.mode == "nic" else self.codec.encode(wire)
        if self.mode == "nic":
            self.codec.reconstruct(dst, dst)
            return dst
        blob, q = self.codec.encode_decoded(dst)
        dst[:] = q
        return blob


class WireError(RuntimeError):
    """A received chunk that its sender cannot have produced for this call (wrong length, an
    exponent out of range, a value the format cannot hold): the call stops, nothing is returned."""


def receive(wire: Wire, payload, out: np.ndarray) -> None:
    """``wire.receive`` for what came from a peer: a malformed payload raises WireError."""
    try:
        wire.receive(payload, out)
    except ValueError as e:
        raise WireError(f"a received chunk does not belong to this call: {e}") from None


def ring_allreduce(work: np.ndarray, *, rank: int, world: int, send: Conn, recv: Conn, chunk_values: int,
                   mode: str, codec=None, sink=None, timers: Timers | None = None,
                   frame_limit: int | None = None, scaled: bool = False) -> None:
    """Sum ``work`` (float32, 1-D, contiguous) over the ring in place, in ``app`` mode, for the
    codecs the ring engine does not run yet (collective/engine.py ``supports``; the engine runs
    raw, nic and INCEPTIONN's app mode). The same schedule as the engine, in two threads."""
    assert mode == "app" and world >= 2
    timers = timers or Timers()
    wire = Wire(mode, codec, scaled=scaled, need_decoded=sink is not None)
    n = work.size
    bounds = block_bounds(n, world)
    steps = 2 * world - 2
    sends = [(s, a, b) for s in range(steps) for a, b in chunk_list(*bounds[(rank - s) % world], chunk_values)]
    recvs = [(s, a, b) for s in range(steps) for a, b in chunk_list(*bounds[(rank - s - 1) % world], chunk_values)]
    first = len(chunk_list(*bounds[rank % world], chunk_values))   # chunks sent at step 0
    keep: dict[int, object] = {}                                     # recv item -> payload to forward
    lock = contextlib.nullcontext() if codec.thread_safe else threading.Lock()
    cmax = min(chunk_values, max(n, 1))
    limit = frame_limit or (8 * 4 * wire.wire_floats(cmax) + 65536)
    prog = _Progress()

    def timed(what, fn, *args):
        t = time.perf_counter()
        with lock if what == "codec" else contextlib.nullcontext():
            r = fn(*args)
        timers.add(what, time.perf_counter() - t)
        return r

    def sender():
        try:
            for j, (s, a, b) in enumerate(sends):
                if j >= first:
                    prog.wait_for(j - first + 1)
                chunk = work[a:b]
                if s <= world - 2:                       # phase 1: this rank's partial sum
                    payload, dec = timed("codec", wire.send, chunk)
                    if sink is not None:
                        sink.record(a, b, chunk, dec)
                    send.send_frame(payload)
                else:                                    # phase 2: reduced values, forwarded as they came
                    send.send_frame(keep.pop(j - first))
        except _Aborted:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            prog.fail(e)
            recv.close()  # wake the receiving side if it waits on a peer

    t = threading.Thread(target=sender, name=f"inceptionn-ring-send-{rank}", daemon=True)
    t.start()
    tmp = np.empty(cmax, dtype=np.float32)
    try:
        for i, (s, a, b) in enumerate(recvs):
            if prog.error is not None:
                break
            dst = work[a:b]
            if s <= world - 2:                           # phase 1: receive and add
                part = tmp[: b - a]
                payload = recv.recv_frame(limit)
                timed("codec", receive, wire, payload, part)
                timed("sum", np.add, dst, part, dst)
                if s == world - 2:                       # the block this rank owns is complete
                    before = dst.copy() if sink is not None else None
                    payload = timed("codec", wire.own, dst)
                    if sink is not None:
                        sink.record(a, b, before, dst)
                    keep[i] = payload
            else:                                        # phase 2: the final values
                payload = recv.recv_frame(limit)
                timed("codec", receive, wire, payload, dst)
                if s < steps - 1:
                    keep[i] = payload
            prog.mark()
    except BaseException as e:
        prog.fail(e)
        send.close()  # wake the sending side if it blocks on a full socket
        t.join()
        raise prog.error from None   # the first failure, not what closing the sockets caused
    t.join()
    if prog.error is not None:
        raise prog.error


def simulate_ring(n: int, world: int, values, *, chunk_values: int, mode: str, codec=None,
                  scaled: bool = False, block: int = BLOCK_VALUES, headroom: int = HEADROOM, count=None,
                  progress=None) -> np.ndarray:
    """What ``ring_allreduce`` on ``world`` ranks leaves on every rank, computed in one process
    (bench/scale.py): the same blocks, chunks and Wire transforms in the same order, without
    sockets, so the bits are those of the real ring (tests/test_collective.py holds them
    together). ``values(r, a, b)`` returns rank r's float32 values [a, b) (not modified).

    Block b's partial sum starts at rank b and visits ranks b+1 .. b-1 (phase 1: each sends it
    with ``Wire.send``, the next decodes it with ``Wire.receive`` and adds its own values); the
    last one owns it (``Wire.own``), and phase 2 gives every rank what the owner's payload
    decodes to, which is what the owner keeps. ``count(payload, m, times)``, if given, sees every
    payload: phase 1's once each, the owner's with times = world - 1 (it crosses that many links).
    ``progress(done, world)`` is called after each ring block."""
    assert mode in MODES and world >= 2
    wire = Wire(mode, codec, scaled=scaled, need_decoded=False, block=block, headroom=headroom)
    out = np.empty(n, dtype=np.float32)
    for b, (lo, hi) in enumerate(block_bounds(n, world)):
        for a, e in chunk_list(lo, hi, chunk_values):
            acc = np.array(values(b, a, e), dtype=np.float32)
            part = np.empty(e - a, dtype=np.float32)
            for j in range(1, world):
                payload, _ = wire.send(acc)
                if count is not None:
                    count(payload, e - a, 1)
                if mode != "raw":
                    receive(wire, payload, part)
                else:
                    part[:] = payload
                acc = np.add(values((b + j) % world, a, e), part)
            payload = wire.own(acc) if mode != "raw" else acc
            if count is not None:
                count(payload, e - a, world - 1)
            out[a:e] = acc
        if progress is not None:
            progress(b + 1, world)
    return out
