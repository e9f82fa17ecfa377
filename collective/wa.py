"""The worker-aggregator baseline ("WA", docs/spec.md section 2): workers push gradients to one
aggregator, which sums them, runs the update and sends the new weights back.

Each worker has one connection to the aggregator. The worker's direction carries its gradient,
chunked, in the ring's wire format (ring.Wire, docs/collectives.md): float32 on a tagged socket
(``nic``: the soft NIC compresses this leg; the worker sends fixed points of the codec's
reconstruction, so the aggregator gets the same values whether a packet was compressed or not),
raw float32 untagged (``raw``), or length-prefixed codec output untagged (``app``); per-block
scaled for codecs that ask for scaling. The aggregator answers on
the accepted side of the same connection, which is never tagged: the weights travel exact, so
every rank ends with the aggregator's weights bit for bit (the paper's WA compresses one leg).

The aggregator receives from all workers at once (one thread each) into per-worker buffers and
sums chunk by chunk, always in rank order, as soon as every worker's chunk is in: the sum is
deterministic and overlaps the transfer. Weights go back as an 8-byte count of float32 values
followed by the values, to all workers in parallel.
"""
from __future__ import annotations

import contextlib
import struct
import threading
import time

import numpy as np

from ..codecs.blockscale import HEADROOM
from .ring import Wire, chunk_list, receive
from .stats import Timers
from .transport import Conn

WEIGHTS_HDR = struct.Struct("<Q")
MAX_WEIGHTS = 1 << 31


def worker_send(work: np.ndarray, conn: Conn, *, chunk_values: int, mode: str, codec=None, sink=None,
                timers: Timers | None = None, scaled: bool = False, headroom: int = HEADROOM) -> None:
    timers = timers or Timers()
    wire = Wire(mode, codec, scaled=scaled, need_decoded=sink is not None, headroom=headroom)
    for a, b in chunk_list(0, work.size, chunk_values):
        chunk = work[a:b]
        if mode == "raw":
            conn.send(chunk)
            continue
        t = time.perf_counter()
        payload, dec = wire.send(chunk)
        timers.add("codec", time.perf_counter() - t)
        if sink is not None:
            sink.record(a, b, chunk, dec)
        if mode == "app":
            conn.send_frame(payload)
        else:
            conn.send(payload)


def worker_receive_weights(conn: Conn) -> np.ndarray:
    (count,) = WEIGHTS_HDR.unpack(conn.recv_bytes(WEIGHTS_HDR.size))
    if count > MAX_WEIGHTS:
        raise ConnectionError(f"the aggregator announced {count} weights (protocol mismatch?)")
    w = np.empty(count, dtype=np.float32)
    conn.recv_into(w)
    return w


def aggregate(own: np.ndarray | None, conns: dict[int, Conn], n: int, *, chunk_values: int, mode: str,
              codec=None, timers: Timers | None = None, scaled: bool = False) -> np.ndarray:
    """Sum ``own`` (or nothing) and every worker's gradient, chunk by chunk in rank order."""
    timers = timers or Timers()
    wire = Wire(mode, codec, scaled=scaled)
    chunks = chunk_list(0, n, chunk_values)
    limit = 8 * 4 * wire.wire_floats(min(chunk_values, max(n, 1))) + 65536
    bufs = {r: np.empty(n, dtype=np.float32) for r in conns}
    cond = threading.Condition()
    done = dict.fromkeys(conns, 0)
    errors: list[BaseException] = []
    lock = contextlib.nullcontext() if codec is None or codec.thread_safe else threading.Lock()

    def receiver(r: int, conn: Conn):
        try:
            for a, b in chunks:
                dst = bufs[r][a:b]
                if wire.direct:
                    conn.recv_into(dst)
                else:
                    if mode == "app":
                        payload = conn.recv_frame(limit)
                    else:
                        payload = np.empty(wire.wire_floats(b - a), dtype=np.float32)
                        conn.recv_into(payload)
                    t = time.perf_counter()
                    with lock:
                        receive(wire, payload, dst)
                    timers.add("codec", time.perf_counter() - t)
                with cond:
                    done[r] += 1
                    cond.notify_all()
        except BaseException as e:  # noqa: BLE001
            with cond:
                errors.append(e)
                cond.notify_all()

    threads = [threading.Thread(target=receiver, args=(r, c), daemon=True, name=f"inceptionn-wa-recv-{r}")
               for r, c in conns.items()]
    for t in threads:
        t.start()
    total = np.zeros(n, dtype=np.float32) if own is None else own
    try:
        for i, (a, b) in enumerate(chunks):
            for r in sorted(conns):
                with cond:
                    while done[r] <= i and not errors:
                        cond.wait()
                    if errors:
                        raise errors[0]
                t = time.perf_counter()
                np.add(total[a:b], bufs[r][a:b], out=total[a:b])
                timers.add("sum", time.perf_counter() - t)
    except BaseException:
        for c in conns.values():
            c.close()
        for t in threads:
            t.join()
        raise
    for t in threads:
        t.join()
    return total


def broadcast_weights(weights: np.ndarray, conns: dict[int, Conn]) -> None:
    errors: list[BaseException] = []
    hdr = WEIGHTS_HDR.pack(weights.size)

    def push(c: Conn):
        try:
            c.send(hdr)
            c.send(weights)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=push, args=(c,), daemon=True) for c in conns.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
