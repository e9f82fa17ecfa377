"""The INCEPTIONN gradient-centric ring (docs/spec.md section 2, the paper's Algorithm 1), chunked
and pipelined over two TCP connections: this rank -> right neighbour (send) and left neighbour ->
this rank (receive).

The vector is cut into N blocks (block b = ``[b*n//N, (b+1)*n//N)``, so any n >= 0 and any
N >= 2 work, empty blocks included) and every block into chunks of ``chunk_values``. Step s
(0..2N-3) sends block ``(rank - s) mod N`` and receives block ``(rank - s - 1) mod N``: the block
received at step s is the one sent at step s+1, so the sender thread forwards chunk c as soon as
the receiving thread has added it, without waiting for the rest of the step. Steps 0..N-2 are
phase 1 (receive, add into the local block, pass on): after step N-2 this rank owns the fully
reduced block ``(rank + 1) mod N``. Steps N-1..2N-3 are phase 2: the reduced blocks travel once
around the ring and are copied, not added.

Three modes, one schedule:

- ``raw``: float32 on an untagged socket; the sum is exact (up to float32 addition order).
- ``nic``: float32 on a *tagged* socket, so the soft NICs compress both phases. A tagged packet
  arrives as the codec's reconstruction, or exactly when the NIC sent it raw (not smaller, flow
  not negotiated, a float split across segments, no daemon at all). So the sender puts
  ``Q = codec.reconstruct(P)`` on the wire instead of its partial sum P (phase 1), and the owner
  replaces its reduced block R by ``codec.reconstruct(R)`` before keeping and sending it (phase 2).
  Q is a fixed point of the reconstruction, so it arrives as Q either way: every rank ends
  bit-identical, error feedback knows exactly what each receiver got, and the result does not
  depend on whether (or how much of) the traffic the NICs compressed, only the time does.
- ``app``: the codec runs here, on an untagged socket carrying length-prefixed codec output.
  Phase 1 decodes, adds and re-encodes per hop; in phase 2 the owner encodes R once, keeps
  ``decode(blob)`` and every rank forwards that same blob unchanged, so all decode the same bytes.

Error feedback: ``sink.record(a, b, sent, decoded)`` is called for every chunk this rank puts on
the wire in phase 1 (``decoded`` = what the receiver gets: the codec's reconstruction) and for
its owned block in phase 2 (R and Q). Over one call that covers every position of the vector
exactly once, so the caller gets a full residual ``sent - decoded``.
"""
from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

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


def ring_allreduce(work: np.ndarray, *, rank: int, world: int, send: Conn, recv: Conn, chunk_values: int,
                   mode: str, codec=None, sink=None, timers: Timers | None = None,
                   frame_limit: int | None = None) -> None:
    """Sum ``work`` (float32, 1-D, contiguous) over the ring in place."""
    assert mode in MODES and world >= 2
    timers = timers or Timers()
    n = work.size
    bounds = block_bounds(n, world)
    steps = 2 * world - 2
    sends = [(s, a, b) for s in range(steps) for a, b in chunk_list(*bounds[(rank - s) % world], chunk_values)]
    recvs = [(s, a, b) for s in range(steps) for a, b in chunk_list(*bounds[(rank - s - 1) % world], chunk_values)]
    first = len(chunk_list(*bounds[rank % world], chunk_values))   # chunks sent at step 0
    blobs: dict[int, bytes] = {}                                     # app mode: recv item -> blob to forward
    lock = contextlib.nullcontext() if codec is None or codec.thread_safe else threading.Lock()
    limit = frame_limit or (8 * 4 * min(chunk_values, max(n, 1)) + 65536)
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
                    if mode == "raw":
                        send.send(chunk)
                    elif mode == "nic":
                        q = timed("codec", codec.reconstruct, chunk)
                        if sink is not None:
                            sink.record(a, b, chunk, q)
                        send.send(q)                     # a fixed point: arrives as q, compressed or not
                    elif sink is not None:               # error feedback: the stream and its decode
                        blob, q = timed("codec", codec.encode_decoded, chunk)
                        sink.record(a, b, chunk, q)
                        send.send_frame(blob)
                    else:
                        send.send_frame(timed("codec", codec.encode, chunk))
                else:                                    # phase 2: reduced values, forwarded as they are
                    if mode == "app":
                        send.send_frame(blobs.pop(j - first))
                    else:
                        send.send(chunk)
        except _Aborted:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            prog.fail(e)
            recv.close()  # wake the receiving side if it waits on a peer

    t = threading.Thread(target=sender, name=f"inceptionn-ring-send-{rank}", daemon=True)
    t.start()
    tmp = np.empty(min(chunk_values, max(n, 1)), dtype=np.float32)
    try:
        for i, (s, a, b) in enumerate(recvs):
            if prog.error is not None:
                break
            dst = work[a:b]
            if s <= world - 2:                           # phase 1: receive and add
                part = tmp[: b - a]
                if mode == "app":
                    blob = recv.recv_frame(limit)
                    timed("codec", codec.decode_into, blob, part)
                else:
                    recv.recv_into(part)
                timed("sum", np.add, dst, part, dst)
                if s == world - 2:                       # the block this rank owns is complete
                    if mode == "nic":
                        q = timed("codec", codec.reconstruct, dst)
                        if sink is not None:
                            sink.record(a, b, dst, q)
                        dst[:] = q
                    elif mode == "app":
                        blob, q = timed("codec", codec.encode_decoded, dst)  # q is what the others decode
                        if sink is not None:
                            sink.record(a, b, dst, q)
                        dst[:] = q
                        blobs[i] = blob
            else:                                        # phase 2: the final values
                if mode == "app":
                    blob = recv.recv_frame(limit)
                    timed("codec", codec.decode_into, blob, dst)
                    if s < steps - 1:
                        blobs[i] = blob
                else:
                    recv.recv_into(dst)
            prog.mark()
    except BaseException as e:
        prog.fail(e)
        send.close()  # wake the sending side if it blocks on a full socket
        t.join()
        raise prog.error from None   # the first failure, not what closing the sockets caused
    t.join()
    if prog.error is not None:
        raise prog.error
