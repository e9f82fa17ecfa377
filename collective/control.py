"""The control plane of a Group: a star of untagged connections (every rank has one to rank 0)
that carries barriers, small reductions, broadcasts and the plan of every collective call.

One round: every rank sends (op, meta, values) to rank 0, which checks that all ranks called
the same op with the same meta (the plan: length, mode, codec, chunk size, wire format ...),
reduces the values in rank order (max, or what meta[0] says for OP_REDUCE) and sends the result
back, so it is identical everywhere. A mismatch is reported to every rank as one RuntimeError.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from .transport import Conn

_CTRL = struct.Struct("<4sIIII")       # magic, seq, op, meta count, value count
_REPLY = struct.Struct("<4sIIII")      # magic, seq, status, value count, message bytes
_MAGIC, _RMAGIC = b"INCC", b"INCR"
OP_BARRIER, OP_REDUCE, OP_ALLREDUCE, OP_AGREE, OP_VERIFY, OP_WA = range(1, 7)
OP_BCAST = 8      # 7 was wire format v1's scaling round of wa_step
_OP_NAMES = {OP_BARRIER: "barrier", OP_REDUCE: "control_allreduce", OP_ALLREDUCE: "allreduce",
             OP_AGREE: "codec agreement", OP_VERIFY: "verify", OP_WA: "wa_step", OP_BCAST: "broadcast"}
_META_NAMES = {
    OP_REDUCE: ("op", "count"),
    OP_ALLREDUCE: ("n", "compress", "codec", "chunk_values", "wire", "headroom"),
    OP_WA: ("aggregator", "compress", "codec", "chunk_values", "wire", "headroom"),
    OP_BCAST: ("root", "count"),
}
MODE_CODE = {"raw": 0, "nic": 1, "app": 2}
REDUCE_OPS = {"max": 0, "min": 1, "sum": 2}
# Wire formats of the gradient sockets (docs/collectives.md): 1 the values (raw) or the codec's
# output of them; 2 per-block scaled (ring.Wire, codecs_c/blockscale_codec.h). The plan carries
# version * 2^20 + block, so ranks that disagree on either fail at the first call.
WIRE_V1, WIRE_V2 = 1, 2


def wire_format(scaled: bool) -> int:
    from ..codecs.blockscale import BLOCK_VALUES
    return (WIRE_V2 << 20) + BLOCK_VALUES if scaled else WIRE_V1 << 20


def codec_id(codec) -> int:
    """What the plan says about a codec: its name and public parameters (scalars and tuples of
    them, such as THC's lookup table), hashed (0: none). Ranks compare it at the first call, so a
    table or threshold computed differently on another host is an error there, never a wrong sum."""
    if codec is None:
        return 0
    # traits are how this rank runs the codec (the collective's own error_feedback= decides what
    # runs), not what goes on the wire: ranks may differ in them
    scalar = (int, float, str, bool)
    params = sorted((k, v) for k, v in vars(codec).items()
                    if not k.startswith("_") and k != "impl" and k not in codec.TRAITS
                    and (isinstance(v, scalar) or isinstance(v, tuple) and all(isinstance(e, scalar) for e in v)))
    return zlib.crc32(f"{codec.name}:{params}".encode()) & 0x7FFFFFFF


def describe(op: int, meta, nvals: int) -> str:
    """A call as the mismatch message shows it, e.g. ``allreduce(n=100, compress='nic', ...)``."""
    names = _META_NAMES.get(op, ())
    args = ", ".join(f"{k}={int(v)}" for k, v in zip(names, meta))
    if op in (OP_ALLREDUCE, OP_WA) and len(meta) > 1:
        mode = {v: k for k, v in MODE_CODE.items()}.get(int(meta[1]), "?")
        args = args.replace(f"compress={int(meta[1])}", f"compress={mode!r}")
    return f"{_OP_NAMES.get(op, f'op {op}')}({args})"


class ControlPlane:
    """The rounds of one rank. ``links``: on rank 0 the connection from every other rank
    ({rank: Conn}), elsewhere {0: the connection to rank 0}."""

    def __init__(self, rank: int, world: int, links: dict[int, Conn]):
        self.rank, self.world = rank, world
        self.links = links
        self._seq = 0

    def round(self, op: int, meta: list[int], values=None) -> np.ndarray:
        """One round (see the module docstring); returns the reduced values."""
        vals = np.ascontiguousarray(values if values is not None else np.empty(0), dtype=np.float64)
        meta_a = np.asarray(meta, dtype=np.int64)
        self._seq += 1
        seq = self._seq & 0xFFFFFFFF
        if self.world == 1:
            return vals.copy()
        if self.rank != 0:
            c = self.links[0]
            c.send(_CTRL.pack(_MAGIC, seq, op, meta_a.size, vals.size) + meta_a.tobytes() + vals.tobytes())
            magic, rseq, status, count, msglen = _REPLY.unpack(c.recv_bytes(_REPLY.size))
            if magic != _RMAGIC or rseq != seq:
                raise ConnectionError("control plane out of step with rank 0 (protocol mismatch)")
            out = np.empty(count, dtype=np.float64)
            c.recv_into(out)
            msg = c.recv_bytes(msglen).decode(errors="replace") if msglen else ""
            if status:
                raise RuntimeError(msg)
            return out
        acc = vals.copy()
        parts = []
        error = ""
        for r in range(1, self.world):
            c = self.links[r]
            magic, rseq, rop, nm, nv = _CTRL.unpack(c.recv_bytes(_CTRL.size))
            if magic != _MAGIC or nm > 64 or nv > (1 << 24):
                raise ConnectionError(f"garbage on the control connection of rank {r}")
            if rseq != seq:
                raise ConnectionError(f"control plane out of step with rank {r} (its round {rseq}, ours {self._seq})")
            rmeta = np.frombuffer(c.recv_bytes(8 * nm), dtype=np.int64)
            rvals = np.frombuffer(c.recv_bytes(8 * nv), dtype=np.float64)
            parts.append(rvals)
            if not error and (rop != op or not np.array_equal(rmeta, meta_a) or nv != vals.size):
                error = (f"collective mismatch: rank 0 called {describe(op, meta_a, vals.size)}, "
                         f"rank {r} called {describe(rop, rmeta, nv)}")
        if not error:
            kind = int(meta_a[0]) if op == OP_REDUCE else REDUCE_OPS["max"]
            for p in parts:
                if kind == REDUCE_OPS["sum"]:
                    acc += p
                elif kind == REDUCE_OPS["min"]:
                    np.minimum(acc, p, out=acc)
                else:
                    np.maximum(acc, p, out=acc)
        body = acc.tobytes() if not error else b""
        msg = error.encode()
        reply = _REPLY.pack(_RMAGIC, seq, 1 if error else 0, 0 if error else acc.size, len(msg))
        for r in range(1, self.world):
            self.links[r].send(reply + body + msg)
        if error:
            raise RuntimeError(error)
        return acc

    def broadcast(self, x: np.ndarray | None, root: int) -> np.ndarray:
        """Rank ``root``'s float32 array on every rank; the data is relayed by rank 0."""
        count = int(self.round(OP_BCAST, [root, 0], [x.size if self.rank == root else -1])[0])
        if self.world == 1:
            return x.copy()
        if self.rank == 0:
            data = x.copy() if root == 0 else np.empty(count, dtype=np.float32)
            if root != 0:
                self.links[root].recv_into(data)
            for r in range(1, self.world):
                if r != root:
                    self.links[r].send(data)
            return data
        c = self.links[0]
        if self.rank == root:
            c.send(x)
            return x.copy()
        data = np.empty(count, dtype=np.float32)
        c.recv_into(data)
        return data
