"""Gradient collectives over TCP for the soft NIC: the INCEPTIONN ring and the WA baseline.

    from inceptionn.collective import Group, FileStore     # or torch.distributed.TCPStore

    with Group(rank, world, FileStore("/shared/dir"), bind_addr="198.18.0.1") as g:
        total = g.allreduce(grad)                  # float32 sum, bit-identical on every rank
        w = g.wa_step(grad, update_fn)             # WA: rank 0 sums, runs update_fn, returns weights
        g.barrier(); m = g.max_scalar(loss)
        print(g.stats.as_dict())

Construction (collective: every rank must construct its Group)
    ``Group(rank, world, store, *, bind_addr=None, port=0, tag=True, tos=0x28, chunk_bytes=256 KiB,
    bucket_values=65536, codec=None, compress="nic", verify="first", timeout=300, prefix="inceptionn")``

    - ``store``: ``set(key, bytes)`` + blocking ``get(key) -> bytes`` (``torch.distributed.TCPStore``,
      ``rendezvous.FileStore``), or anything with ``exchange(str) -> list[str]``.
      ``Group.from_mpi(comm=None, **kw)`` and ``Group.from_torch(process_group=None, **kw)`` use
      MPI ``allgather`` / ``torch.distributed.all_gather_object`` instead.
    - ``bind_addr``: the local address all sockets use (on a testbed host: its testbed address).
      Default: ``rendezvous.default_bind_addr()``.
    - ``codec``: what the soft NIC runs (must match the daemons' ``error_bound``!) and the default
      for ``compress="app"``. Default ``get_codec("inceptionn", error_bound=-10)``.
    - ``tag=False`` opens the "gradient" sockets untagged: the same computation as ``compress="nic"``
      with no NIC compressing (an A/B switch for benchmarks).
    - ``verify``: ``"first"`` (default) compares a CRC of the first ``compress="nic"`` result of
      each group across ranks over the control plane and raises if replicas differ (it catches a
      daemon running another error bound than ``codec``); ``"always"``; ``"never"``.

Collectives (every rank calls the same ones in the same order; a mismatch raises RuntimeError)
    ``allreduce(x, *, compress=<group default>, codec=None, scaling=None, error_feedback=None,
    key=None, out=None, average=False, verify=None) -> np.ndarray``
        Ring allreduce (docs/spec.md section 2) of a 1-D float32 array of any length; returns the sum
        (``average=True``: sum / world), bit-identical on every rank. ``out`` may be ``x``
        (in place). ``compress``:

        - ``"nic"``: gradient chunks go on sockets tagged ToS 0x28, so the soft NICs compress them
          in both phases. Every value sent is the codec's reconstruction of itself (a fixed point,
          see ring.py), so it arrives identical compressed or raw: the result is the same bit for
          bit with or without daemons running, only the time differs.
        - ``"app"``: ``codec`` (any registered codec, a name or a Codec) runs inside the collective
          on untagged sockets: decode-add-encode per hop, one blob per block forwarded in phase 2.
          Codecs with ``needs_agreement`` get ``agree(max over ranks of local_stat, round)`` first.
        - ``None``: plain float32, untagged, nothing lossy.

        ``scaling`` (exact power of two per bucket of ``bucket_values``, agreed as the max over
        ranks so partial sums over the N ranks stay below 1.0) and ``error_feedback`` (residual of
        what this rank sent vs what its receiver decodes, added back next call, kept per ``key``,
        default key: the length; exact, because what a receiver decodes is known) default to on
        for the inceptionn codec (``"nic"``/``"app"``), error feedback also for 3LC, both off
        otherwise (``SCALING_HELPS``, ``ERROR_FEEDBACK_HELPS``); True/False force them. Pass
        ``key`` when reducing several tensors of equal length.

    ``wa_step(grad, update_fn=None, *, aggregator=0, compress=..., codec=None, scaling=None,
    error_feedback=None, key=None) -> np.ndarray``
        WA baseline: every rank but ``aggregator`` sends its gradient (tagged with ``"nic"``: the
        compressed leg); the aggregator sums the gradients (its own too, unless it passes
        ``grad=None``: a dedicated aggregator), calls ``update_fn(sum) -> weights`` (float32 1-D,
        any length; only the aggregator's ``update_fn`` runs) and sends the weights back untagged.
        Returns the weights, bit-identical on every rank. Scaling uses headroom 1 (sums are
        formed after decoding, never on the wire).

    ``barrier()``, ``max_scalar(v)``, ``sum_scalar(v)``, ``control_allreduce(values, op="max"|"min"|
    "sum")`` (small float64 vectors, reduced in rank order at rank 0: identical everywhere),
    ``broadcast(x, root=0)`` (float32 array, e.g. initial weights): all on the untagged control
    plane (a star: every rank has one connection to rank 0).

Introspection
    ``stats`` (``GroupStats``: ``last`` and ``total`` ``CallStats`` and ``by_op``: seconds of the
    whole call, of the data exchange, of control rounds, CPU seconds summing, in the codec and
    scaling; bytes sent/received per plane ``gradient`` (tagged), ``data`` (untagged data) and
    ``control``; ``as_dict()``), ``reset_stats()``, ``connections()`` (kind, peer, plane, ToS of
    every socket), ``error_feedback`` (the ``ErrorFeedback`` memory), ``close()`` / context manager.

Failures: a dead peer raises ConnectionError, a silent one TimeoutError after ``timeout`` s; the
group is then unusable (every later call raises). Wrong arguments raise TypeError/ValueError
before anything is sent, and leave the group usable.
"""
from __future__ import annotations

import struct
import threading
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..codecs import Codec, ErrorFeedback, get_codec
from ..codecs.base import check_vector
from . import scaling as sc
from .rendezvous import MPIExchange, TorchExchange, default_bind_addr, make_exchange
from .ring import Timers, ring_allreduce
from ..shim.tagging import GRADIENT_TOS
from .transport import MAX_TOKEN, PLANES, Conn, Endpoint, Kind, PlaneCounters, connect
from .wa import aggregate, broadcast_weights, worker_receive_weights, worker_send

__all__ = ["Group", "CallStats", "GroupStats"]

_CTRL = struct.Struct("<4sIIII")       # magic, seq, op, meta count, value count
_REPLY = struct.Struct("<4sIIII")      # magic, seq, status, value count, message bytes
_MAGIC, _RMAGIC = b"INCC", b"INCR"
OP_BARRIER, OP_REDUCE, OP_ALLREDUCE, OP_AGREE, OP_VERIFY, OP_WA, OP_WA_SCALE, OP_BCAST = range(1, 9)
_OP_NAMES = {OP_BARRIER: "barrier", OP_REDUCE: "control_allreduce", OP_ALLREDUCE: "allreduce",
             OP_AGREE: "codec agreement", OP_VERIFY: "verify", OP_WA: "wa_step", OP_WA_SCALE: "wa_step scaling",
             OP_BCAST: "broadcast"}
_META_NAMES = {
    OP_REDUCE: ("op", "count"),
    OP_ALLREDUCE: ("n", "compress", "codec", "chunk_values", "bucket_values", "scaling"),
    OP_WA: ("aggregator", "compress", "codec", "chunk_values", "bucket_values", "scaling"),
    OP_BCAST: ("root", "count"),
}
_MODE_CODE = {"raw": 0, "nic": 1, "app": 2}
_REDUCE_OPS = {"max": 0, "min": 1, "sum": 2}
_DEFAULT = object()
# Defaults of scaling / error_feedback per codec: the INCEPTIONN codec keeps absolute precision
# (scaling puts gradients into its range) and drops what falls below it (error feedback brings it
# back); 3LC is specified with an error-accumulation buffer and leaves it to the caller when
# encode() gets no key. TernGrad (unbiased), THC (keeps its own error feedback) and FFT: off.
SCALING_HELPS = frozenset({"inceptionn"})
ERROR_FEEDBACK_HELPS = frozenset({"inceptionn", "3lc"})
# Codecs that work value by value can be cut into pipeline chunks anywhere; the others see one
# whole ring block (or the whole gradient in WA) per encode, their per-tensor unit.
PER_VALUE_CODECS = frozenset({"inceptionn"})


# --- statistics --------------------------------------------------------------------------------

@dataclass
class CallStats:
    """One call, or a sum of calls. Seconds are wall time except sum/codec/scale (CPU, overlapped)."""

    op: str = ""
    calls: int = 0
    n: int = 0
    compress: str | None = None
    seconds: float = 0.0
    exchange_seconds: float = 0.0
    control_seconds: float = 0.0
    sum_seconds: float = 0.0
    codec_seconds: float = 0.0
    scale_seconds: float = 0.0
    bytes_sent: dict = field(default_factory=lambda: dict.fromkeys(PLANES, 0))
    bytes_received: dict = field(default_factory=lambda: dict.fromkeys(PLANES, 0))

    @property
    def comm_seconds(self) -> float:
        """Time in communication: the data exchange plus the control rounds."""
        return self.exchange_seconds + self.control_seconds

    def add(self, o: "CallStats") -> None:
        self.calls += o.calls
        self.n += o.n
        for f in ("seconds", "exchange_seconds", "control_seconds", "sum_seconds", "codec_seconds", "scale_seconds"):
            setattr(self, f, getattr(self, f) + getattr(o, f))
        for p in PLANES:
            self.bytes_sent[p] += o.bytes_sent[p]
            self.bytes_received[p] += o.bytes_received[p]

    def as_dict(self) -> dict:
        return {"op": self.op, "calls": self.calls, "n": self.n, "compress": self.compress,
                "seconds": self.seconds, "comm_seconds": self.comm_seconds,
                "exchange_seconds": self.exchange_seconds, "control_seconds": self.control_seconds,
                "sum_seconds": self.sum_seconds, "codec_seconds": self.codec_seconds,
                "scale_seconds": self.scale_seconds,
                "bytes_sent": dict(self.bytes_sent), "bytes_received": dict(self.bytes_received)}


@dataclass
class GroupStats:
    total: CallStats = field(default_factory=lambda: CallStats(op="total"))
    last: CallStats | None = None
    by_op: dict = field(default_factory=dict)

    def record(self, c: CallStats) -> None:
        self.last = c
        self.total.add(c)
        self.by_op.setdefault(c.op, CallStats(op=c.op)).add(c)

    def as_dict(self) -> dict:
        return {"total": self.total.as_dict(), "last": self.last.as_dict() if self.last else None,
                "by_op": {k: v.as_dict() for k, v in self.by_op.items()}}


class _Sink:
    """Error-feedback bookkeeping of one call: ``sent - decoded`` for every position this rank
    put on the wire (each position exactly once per call)."""

    def __init__(self, n: int):
        self.lost = np.empty(n, dtype=np.float32)

    def record(self, a: int, b: int, sent: np.ndarray, decoded: np.ndarray) -> None:
        np.subtract(sent, decoded, out=self.lost[a:b])


def _codec_id(c: Codec | None) -> int:
    if c is None:
        return 0
    params = sorted((k, v) for k, v in vars(c).items()
                    if not k.startswith("_") and k != "impl" and isinstance(v, (int, float, str, bool)))
    return zlib.crc32(f"{c.name}:{params}".encode()) & 0x7FFFFFFF


def _check_rank(rank, world) -> tuple[int, int]:
    for name, v in (("rank", rank), ("world", world)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {type(v).__name__}")
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in 0..{world - 1}, got {rank}")
    return int(rank), int(world)


class Group:
    """A set of ``world`` processes that reduce gradients together (see the module docstring)."""

    def __init__(self, rank: int, world: int, store=None, *, bind_addr: str | None = None, port: int = 0,
                 tag: bool = True, tos: int = GRADIENT_TOS, chunk_bytes: int = 256 * 1024,
                 bucket_values: int = sc.BUCKET_VALUES, codec: Codec | str | None = None,
                 compress: str | None = "nic", verify: str = "first", timeout: float | None = 300.0,
                 prefix: str = "inceptionn"):
        self.rank, self.world = _check_rank(rank, world)
        if store is None and self.world > 1:
            raise ValueError("a group of more than one rank needs a store (set/get), or use "
                             "Group.from_mpi / Group.from_torch")
        if not 0 < tos <= 0xFF:
            raise ValueError(f"tos must be 1..255, got {tos}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 4:
            raise ValueError(f"chunk_bytes must be an integer >= 4, got {chunk_bytes!r}")
        if isinstance(bucket_values, bool) or not isinstance(bucket_values, int) or bucket_values < 1:
            raise ValueError(f"bucket_values must be a positive integer, got {bucket_values!r}")
        if verify not in ("first", "always", "never"):
            raise ValueError(f"verify must be 'first', 'always' or 'never', got {verify!r}")
        self.tag, self.tos = bool(tag), int(tos)
        self.chunk_values = chunk_bytes // 4
        self.bucket_values = bucket_values
        self.timeout = timeout
        self.verify = verify
        self._codecs: dict[str, Codec] = {}
        self.codec = self._resolve_codec(codec if codec is not None else "inceptionn")
        self.compress = self._mode(compress)
        self.error_feedback = ErrorFeedback()
        self.stats = GroupStats()
        self.counters = PlaneCounters()
        self.bind_addr = bind_addr or default_bind_addr()
        if self.bind_addr in ("0.0.0.0", "::", ""):
            raise ValueError("bind_addr must be an address of this host the other ranks can reach (it is what "
                             f"they connect to), not the wildcard {self.bind_addr!r}")
        self._conns: dict[tuple, Conn] = {}
        self._sinks: dict = {}
        self._seq = 0
        self._calls = 0
        self._verified = False
        self._broken: BaseException | None = None
        self._closed = False
        self._lock = threading.RLock()
        self._endpoint = Endpoint(self.bind_addr, port, self.counters, timeout)
        try:
            if self.world > 1:
                eps = make_exchange(store, self.rank, self.world, prefix).exchange(self._endpoint.endpoint)
                if len(eps) != self.world:
                    raise ValueError(f"rendezvous returned {len(eps)} endpoints for a world of {self.world}")
                self.endpoints = eps
                self._token = zlib.crc32("|".join(eps).encode()) & MAX_TOKEN
                self._endpoint.set_group(self._token, self.world)
                if self.rank == 0:
                    for r in range(1, self.world):
                        self._conns[("in", Kind.CONTROL, r)] = self._endpoint.wait(Kind.CONTROL, r, self.timeout)
                else:
                    self._conns[("out", Kind.CONTROL, 0)] = self._open(Kind.CONTROL, 0)
                self.barrier()
            else:
                self.endpoints = [self._endpoint.endpoint]
        except BaseException:
            self.close()
            raise

    # --- construction helpers ----------------------------------------------------------------

    @classmethod
    def from_mpi(cls, comm=None, **kw) -> "Group":
        """A group of the ranks of an mpi4py communicator (default COMM_WORLD); rendezvous by allgather."""
        if comm is None:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        return cls(comm.Get_rank(), comm.Get_size(), MPIExchange(comm), **kw)

    @classmethod
    def from_torch(cls, process_group=None, **kw) -> "Group":
        """A group of the ranks of an initialised torch.distributed process group."""
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call init_process_group first")
        return cls(dist.get_rank(process_group), dist.get_world_size(process_group), TorchExchange(process_group), **kw)

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Group(rank={self.rank}, world={self.world}, bind_addr={self.bind_addr!r}, codec={self.codec!r})"

    def close(self) -> None:
        """Close every socket (no communication; idempotent)."""
        if self._closed:
            return
        self._closed = True
        for c in self._conns.values():
            c.close()
        self._conns.clear()
        self._endpoint.close()

    def connections(self) -> list[dict]:
        """Every open socket: kind, peer, plane, whether we opened it, and the ToS it sends with."""
        out = []
        for (direction, kind, peer), c in sorted(self._conns.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
            try:
                tos, local, remote = c.tos(), c.sock.getsockname()[:2], c.sock.getpeername()[:2]
            except OSError:        # closed after a failure
                tos, local, remote = None, ("", 0), ("", 0)
            out.append({"kind": kind.name, "peer": peer, "direction": direction, "send_plane": c.send_plane,
                        "tos": tos, "local": "%s:%d" % local, "remote": "%s:%d" % remote})
        return out

    def reset_stats(self) -> None:
        self.stats = GroupStats()

    # --- connections ---------------------------------------------------------------------------

    def _open(self, kind: Kind, peer: int) -> Conn:
        return connect(self.endpoints[peer], bind_addr=self.bind_addr, token=self._token, rank=self.rank,
                       peer=peer, kind=kind, tos=self.tos if self.tag else 0, counters=self.counters,
                       timeout=self.timeout)

    def _outgoing(self, kind: Kind, peer: int) -> Conn:
        key = ("out", kind, peer)
        if key not in self._conns:
            self._conns[key] = self._open(kind, peer)
        return self._conns[key]

    def _incoming(self, kind: Kind, peer: int) -> Conn:
        key = ("in", kind, peer)
        if key not in self._conns:
            self._conns[key] = self._endpoint.wait(kind, peer, self.timeout)
        return self._conns[key]

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("the group is closed")
        if self._broken is not None:
            raise RuntimeError(f"the group is unusable after an earlier failure: {self._broken}")

    # --- argument handling ---------------------------------------------------------------------

    @staticmethod
    def _mode(compress) -> str:
        if compress is None:
            return "raw"
        if compress in ("nic", "app"):
            return compress
        raise ValueError(f"compress must be 'nic' (the soft NIC compresses tagged sockets), 'app' (the codec "
                         f"runs in the collective) or None (no compression), got {compress!r}")

    def _resolve_codec(self, codec) -> Codec:
        if isinstance(codec, Codec):
            return codec
        if isinstance(codec, str):
            if codec not in self._codecs:
                self._codecs[codec] = get_codec(codec, error_bound=-10) if codec == "inceptionn" else get_codec(codec)
            return self._codecs[codec]
        raise TypeError(f"codec must be a Codec (get_codec(...)) or a codec name, got {type(codec).__name__}")

    def _call_codec(self, mode: str, codec) -> Codec | None:
        if mode == "raw":
            return None
        c = self.codec if codec is None else self._resolve_codec(codec)
        if mode == "nic" and c.name != "inceptionn":
            raise ValueError(f"the soft NIC runs only the inceptionn codec; to compare {c.name!r} use "
                             "compress='app' (the codec runs inside the collective)")
        return c

    @staticmethod
    def _switches(mode: str, codec, scaling, error_feedback) -> tuple[bool, bool]:
        name = codec.name if codec is not None and mode != "raw" else None
        s = name in SCALING_HELPS if scaling is None else bool(scaling)
        e = name in ERROR_FEEDBACK_HELPS if error_feedback is None else bool(error_feedback)
        if e and mode == "raw":
            raise ValueError("error_feedback needs a lossy path: compress='nic' or 'app'")
        return s, e

    def _chunk(self, mode: str, codec, n: int) -> int:
        if mode == "app" and codec.name not in PER_VALUE_CODECS:
            return max(n, 1)
        return self.chunk_values

    def _output(self, out, n: int) -> np.ndarray:
        if out is None:
            return np.empty(n, dtype=np.float32)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != (n,):
            desc = f"{out.dtype} array of shape {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise TypeError(f"out must be a float32 array of shape ({n},), got {desc}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writable")
        return out

    # --- control plane -------------------------------------------------------------------------

    def _control(self, op: int, meta: list[int], values=None) -> np.ndarray:
        """One round over the star: every rank sends (op, meta, values) to rank 0, which checks
        that op and meta agree, reduces the values (max, or what meta[0] says for OP_REDUCE) and
        sends the result back."""
        vals = np.ascontiguousarray(values if values is not None else np.empty(0), dtype=np.float64)
        meta_a = np.asarray(meta, dtype=np.int64)
        self._seq += 1
        if self.world == 1:
            return vals.copy()
        hdr = _CTRL.pack(_MAGIC, self._seq & 0xFFFFFFFF, op, meta_a.size, vals.size)
        if self.rank != 0:
            c = self._conns[("out", Kind.CONTROL, 0)]
            c.send(hdr + meta_a.tobytes() + vals.tobytes())
            magic, seq, status, count, msglen = _REPLY.unpack(c.recv_bytes(_REPLY.size))
            if magic != _RMAGIC or seq != self._seq & 0xFFFFFFFF:
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
            c = self._conns[("in", Kind.CONTROL, r)]
            magic, seq, rop, nm, nv = _CTRL.unpack(c.recv_bytes(_CTRL.size))
            if magic != _MAGIC or nm > 64 or nv > (1 << 24):
                raise ConnectionError(f"garbage on the control connection of rank {r}")
            if seq != self._seq & 0xFFFFFFFF:
                raise ConnectionError(f"control plane out of step with rank {r} (its round {seq}, ours {self._seq})")
            rmeta = np.frombuffer(c.recv_bytes(8 * nm), dtype=np.int64)
            rvals = np.frombuffer(c.recv_bytes(8 * nv), dtype=np.float64)
            parts.append(rvals)
            if not error and (rop != op or not np.array_equal(rmeta, meta_a) or nv != vals.size):
                error = (f"collective mismatch: rank 0 called {self._describe(op, meta_a, vals.size)}, "
                         f"rank {r} called {self._describe(rop, rmeta, nv)}")
        if not error:
            kind = int(meta_a[0]) if op == OP_REDUCE else _REDUCE_OPS["max"]
            for p in parts:
                if kind == _REDUCE_OPS["sum"]:
                    acc += p
                elif kind == _REDUCE_OPS["min"]:
                    np.minimum(acc, p, out=acc)
                else:
                    np.maximum(acc, p, out=acc)
        body = acc.tobytes() if not error else b""
        msg = error.encode()
        reply = _REPLY.pack(_RMAGIC, self._seq & 0xFFFFFFFF, 1 if error else 0, 0 if error else acc.size, len(msg))
        for r in range(1, self.world):
            self._conns[("in", Kind.CONTROL, r)].send(reply + body + msg)
        if error:
            raise RuntimeError(error)
        return acc

    @staticmethod
    def _describe(op: int, meta, nvals: int) -> str:
        names = _META_NAMES.get(op, ())
        args = ", ".join(f"{k}={int(v)}" for k, v in zip(names, meta))
        if op in (OP_ALLREDUCE, OP_WA) and len(meta) > 1:
            mode = {v: k for k, v in _MODE_CODE.items()}.get(int(meta[1]), "?")
            args = args.replace(f"compress={int(meta[1])}", f"compress={mode!r}")
        return f"{_OP_NAMES.get(op, f'op {op}')}({args})"

    def _timed_control(self, call: CallStats, op: int, meta: list[int], values=None) -> np.ndarray:
        t = time.perf_counter()
        try:
            return self._control(op, meta, values)
        finally:
            call.control_seconds += time.perf_counter() - t

    def _guard(self, fn, *args):
        """Run one collective: errors after communication started make the group unusable."""
        self._check_usable()
        with self._lock:
            try:
                return fn(*args)
            except (RuntimeError, ConnectionError, TimeoutError, OSError) as e:
                self._broken = e
                raise

    def barrier(self) -> None:
        self._guard(self._control, OP_BARRIER, [])

    def control_allreduce(self, values, op: str = "max") -> np.ndarray:
        """Reduce a small float64 vector over all ranks on the control plane (``max``/``min``/``sum``;
        rank order at rank 0, so the result is identical on every rank)."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"op must be one of {', '.join(_REDUCE_OPS)}, got {op!r}")
        v = np.atleast_1d(np.asarray(values, dtype=np.float64))
        if v.ndim != 1:
            raise ValueError("control_allreduce takes a scalar or a 1-D vector")
        return self._guard(self._control, OP_REDUCE, [_REDUCE_OPS[op], v.size], v)

    def max_scalar(self, v: float) -> float:
        return float(self.control_allreduce([v], "max")[0])

    def sum_scalar(self, v: float) -> float:
        return float(self.control_allreduce([v], "sum")[0])

    def broadcast(self, x: np.ndarray | None, root: int = 0) -> np.ndarray:
        """Rank ``root``'s float32 array on every rank (others may pass None), over the control plane."""
        if not isinstance(root, int) or not 0 <= root < self.world:
            raise ValueError(f"root must be a rank in 0..{self.world - 1}, got {root!r}")
        if self.rank == root:
            x = check_vector(x)
        return self._guard(self._broadcast, x, root)

    def _broadcast(self, x, root: int) -> np.ndarray:
        count = int(self._control(OP_BCAST, [root, 0], [x.size if self.rank == root else -1])[0])
        if self.world == 1:
            return x.copy()
        if self.rank == 0:
            data = x.copy() if root == 0 else np.empty(count, dtype=np.float32)
            if root != 0:
                self._conns[("in", Kind.CONTROL, root)].recv_into(data)
            for r in range(1, self.world):
                if r != root:
                    self._conns[("in", Kind.CONTROL, r)].send(data)
            return data
        c = self._conns[("out", Kind.CONTROL, 0)]
        if self.rank == root:
            c.send(x)
            return x.copy()
        data = np.empty(count, dtype=np.float32)
        c.recv_into(data)
        return data

    # --- allreduce -----------------------------------------------------------------------------

    def allreduce(self, x: np.ndarray, *, compress=_DEFAULT, codec=None, scaling: bool | None = None,
                  error_feedback: bool | None = None, key=None, out: np.ndarray | None = None,
                  average: bool = False, verify: bool | None = None) -> np.ndarray:
        """Sum of ``x`` over all ranks, bit-identical on every rank (see the module docstring)."""
        self._check_usable()
        x = check_vector(x)
        mode = self.compress if compress is _DEFAULT else self._mode(compress)
        cod = self._call_codec(mode, codec)
        scale_on, ef_on = self._switches(mode, cod, scaling, error_feedback)
        work = self._output(out, x.size)
        do_verify = (verify if verify is not None else
                     self.verify == "always" or (self.verify == "first" and mode == "nic" and not self._verified))
        return self._guard(self._allreduce, x, work, mode, cod, scale_on, ef_on,
                           ("allreduce", x.size if key is None else key), bool(average), bool(do_verify))

    def _allreduce(self, x, work, mode, cod, scale_on, ef_on, efkey, average, do_verify) -> np.ndarray:
        call = CallStats(op="allreduce", calls=1, n=x.size, compress=None if mode == "raw" else mode)
        t_start = time.perf_counter()
        sent0, recv0 = self.counters.snapshot()
        timers = Timers()
        self._calls += 1
        n = x.size
        try:
            if self.world == 1:
                if work is not x:
                    work[:] = x
                return work
            t = time.perf_counter()
            self._compensate(efkey, x, work, ef_on)
            maxima = sc.bucket_maxima(work, self.bucket_values) if scale_on else None
            call.scale_seconds += time.perf_counter() - t
            meta = [n, _MODE_CODE[mode], _codec_id(cod), self.chunk_values, self.bucket_values, int(scale_on)]
            agreed = self._timed_control(call, OP_ALLREDUCE, meta, maxima)
            exps = None
            if scale_on and n:
                t = time.perf_counter()
                exps = sc.exponents(agreed, self.world)
                sc.apply(work, exps, self.bucket_values)
                call.scale_seconds += time.perf_counter() - t
            if mode == "app" and cod.needs_agreement:
                shared = self._timed_control(call, OP_AGREE, [], [cod.local_stat(work)])[0]
                cod.agree(float(shared), self._calls)
            sink = self._sink(efkey, n) if ef_on else None
            if n:
                kind = Kind.RING_TAGGED if mode == "nic" else Kind.RING_PLAIN
                send = self._outgoing(kind, (self.rank + 1) % self.world)
                recv = self._incoming(kind, (self.rank - 1) % self.world)
                t = time.perf_counter()
                ring_allreduce(work, rank=self.rank, world=self.world, send=send, recv=recv,
                               chunk_values=self._chunk(mode, cod, n), mode=mode, codec=cod, sink=sink,
                               timers=timers)
                call.exchange_seconds += time.perf_counter() - t
            t = time.perf_counter()
            if exps is not None:
                sc.apply(work, exps, self.bucket_values, inverse=True)
            if sink is not None:
                self._remember(efkey, sink, exps, agreed if scale_on else None)
            if average:
                np.divide(work, np.float32(self.world), out=work)
            call.scale_seconds += time.perf_counter() - t
            if do_verify:
                self._verify(call, work)
            return work
        finally:
            call.sum_seconds, call.codec_seconds = timers.sum, timers.codec
            self._finish(call, t_start, sent0, recv0)

    def _compensate(self, efkey, x: np.ndarray, work: np.ndarray, ef_on: bool) -> None:
        """work = x + what this rank's receivers did not get last time for ``efkey``."""
        r = self.error_feedback.residual(efkey) if ef_on else None
        if r is not None:
            if r.shape != x.shape:
                raise ValueError(f"error-feedback key {efkey!r}: {x.size} values now, {r.size} last time; "
                                 "pass a distinct key= for each tensor")
            np.add(x, r, out=work)
        elif work is not x:
            work[:] = x

    def _remember(self, efkey, sink: _Sink, exps, agreed) -> None:
        """Keep ``sent - decoded`` for next time, unscaled (exact: a power of two per bucket).
        The ring already subtracted chunk by chunk."""
        if exps is not None:
            sc.apply(sink.lost, exps, self.bucket_values, inverse=True)
        # inf - inf = NaN where a gradient held inf/NaN: never carry that into the next call.
        # The agreed bucket maxima (max over ranks) tell whether any rank had one.
        if agreed is None or not np.isfinite(agreed).all():
            np.nan_to_num(sink.lost, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        self.error_feedback.store(efkey, sink.lost)

    def _sink(self, efkey, n: int) -> _Sink:
        """Reused per key: n fresh floats every call would cost page faults, not just memory."""
        s = self._sinks.get(efkey)
        if s is None or s.lost.size != n:
            s = self._sinks[efkey] = _Sink(n)
        return s

    def _verify(self, call: CallStats, work: np.ndarray) -> None:
        crc = float(zlib.crc32(memoryview(work).cast("B")))
        v = self._timed_control(call, OP_VERIFY, [], [crc, -crc])
        self._verified = True
        if v[0] != -v[1]:
            raise RuntimeError("allreduce results differ between ranks. With compress='nic' this means the soft "
                               f"NICs do not run the collective's codec ({self.codec!r}): give the Group the "
                               "codec with the daemons' error_bound")

    def _finish(self, call: CallStats, t_start: float, sent0: dict, recv0: dict) -> None:
        call.seconds = time.perf_counter() - t_start
        sent1, recv1 = self.counters.snapshot()
        call.bytes_sent = {p: sent1[p] - sent0[p] for p in PLANES}
        call.bytes_received = {p: recv1[p] - recv0[p] for p in PLANES}
        self.stats.record(call)

    # --- worker-aggregator ---------------------------------------------------------------------

    def wa_step(self, grad: np.ndarray | None, update_fn=None, *, aggregator: int = 0, compress=_DEFAULT,
                codec=None, scaling: bool | None = None, error_feedback: bool | None = None, key=None) -> np.ndarray:
        """One WA exchange: gradients to ``aggregator``, weights back (see the module docstring)."""
        self._check_usable()
        if isinstance(aggregator, bool) or not isinstance(aggregator, int) or not 0 <= aggregator < self.world:
            raise ValueError(f"aggregator must be a rank in 0..{self.world - 1}, got {aggregator!r}")
        is_agg = self.rank == aggregator
        if grad is None and not is_agg:
            raise ValueError("only the aggregator may pass grad=None (a dedicated aggregator)")
        if is_agg and not callable(update_fn):
            raise TypeError("the aggregator needs update_fn(summed_gradient) -> new weights")
        x = check_vector(grad) if grad is not None else None
        mode = self.compress if compress is _DEFAULT else self._mode(compress)
        cod = self._call_codec(mode, codec)
        scale_on, ef_on = self._switches(mode, cod, scaling, error_feedback)
        efkey = ("wa", (x.size if x is not None else -1) if key is None else key)
        return self._guard(self._wa_step, x, update_fn, aggregator, mode, cod, scale_on, ef_on and not is_agg, efkey)

    def _wa_step(self, x, update_fn, aggregator, mode, cod, scale_on, ef_on, efkey) -> np.ndarray:
        call = CallStats(op="wa_step", calls=1, n=x.size if x is not None else 0,
                         compress=None if mode == "raw" else mode)
        t_start = time.perf_counter()
        sent0, recv0 = self.counters.snapshot()
        timers = Timers()
        self._calls += 1
        is_agg = self.rank == aggregator
        try:
            meta = [aggregator, _MODE_CODE[mode], _codec_id(cod), self.chunk_values, self.bucket_values, int(scale_on)]
            nn = [x.size, -x.size] if x is not None else [-1.0, -np.inf]
            v = self._timed_control(call, OP_WA, meta, nn)
            n = int(v[0])
            if n < 0:
                raise ValueError("wa_step: no rank passed a gradient")
            if -v[1] != n:
                raise ValueError(f"wa_step: ranks passed gradients of different lengths ({int(-v[1])} to {n} values)")
            call.n = n
            t = time.perf_counter()
            work = None
            if x is not None:
                work = np.empty(n, dtype=np.float32)
                self._compensate(efkey, x, work, ef_on)
            call.scale_seconds += time.perf_counter() - t
            exps = agreed = None
            if scale_on and n:
                maxima = sc.bucket_maxima(work, self.bucket_values) if work is not None else \
                    np.zeros(-(-n // self.bucket_values))
                agreed = self._timed_control(call, OP_WA_SCALE, [], maxima)
                t = time.perf_counter()
                exps = sc.exponents(agreed, 1)
                if work is not None:
                    sc.apply(work, exps, self.bucket_values)
                call.scale_seconds += time.perf_counter() - t
            if mode == "app" and cod.needs_agreement:
                stat = cod.local_stat(work) if work is not None else 0.0
                shared = self._timed_control(call, OP_AGREE, [], [stat])[0]
                cod.agree(float(shared), self._calls)
            kind = Kind.WA_TAGGED if mode == "nic" else Kind.WA_PLAIN
            if not is_agg:
                conn = self._outgoing(kind, aggregator)
                sink = sc_sink = self._sink(efkey, n) if ef_on else None
                t = time.perf_counter()
                worker_send(work, conn, chunk_values=self._chunk(mode, cod, n), mode=mode, codec=cod, sink=sink,
                            timers=timers)
                weights = worker_receive_weights(conn)
                call.exchange_seconds += time.perf_counter() - t
                if sc_sink is not None:
                    self._remember(efkey, sc_sink, exps, agreed)
                return weights
            conns = {r: self._incoming(kind, r) for r in range(self.world) if r != aggregator}
            t = time.perf_counter()
            total = aggregate(work, conns, n, chunk_values=self._chunk(mode, cod, n), mode=mode, codec=cod,
                              timers=timers)
            call.exchange_seconds += time.perf_counter() - t
            if exps is not None:
                t = time.perf_counter()
                sc.apply(total, exps, self.bucket_values, inverse=True)
                call.scale_seconds += time.perf_counter() - t
            try:
                weights = update_fn(total)
                if not isinstance(weights, np.ndarray) or weights.dtype != np.float32 or weights.ndim != 1:
                    desc = f"{weights.dtype} array of shape {weights.shape}" if isinstance(weights, np.ndarray) \
                        else type(weights).__name__
                    raise TypeError(f"update_fn must return the new weights as a 1-D float32 array, got {desc}")
            except BaseException as e:
                for c in conns.values():   # the workers wait for weights: tell them by closing
                    c.close()
                self._broken = e
                raise
            weights = np.ascontiguousarray(weights)
            t = time.perf_counter()
            broadcast_weights(weights, conns)
            call.exchange_seconds += time.perf_counter() - t
            return weights
        finally:
            call.sum_seconds, call.codec_seconds = timers.sum, timers.codec
            self._finish(call, t_start, sent0, recv0)
