"""Gradient collectives over TCP for the soft NIC: the INCEPTIONN ring and the WA baseline.

    from inceptionn.collective import Group, FileStore     # or torch.distributed.TCPStore

    with Group(rank, world, FileStore("/shared/dir"), bind_addr="198.18.0.1") as g:
        total = g.allreduce(grad)                  # float32 sum, bit-identical on every rank
        w = g.wa_step(grad, update_fn)             # WA: rank 0 sums, runs update_fn, returns weights
        g.barrier(); m = g.max_scalar(loss)
        print(g.stats.as_dict())

The whole API, its options and guarantees: docs/collectives.md. In short:

- Construction is collective. ``store`` is anything with ``set(key, bytes)`` and a blocking
  ``get(key)`` (``torch.distributed.TCPStore``, ``FileStore``); ``Group.from_mpi`` and
  ``Group.from_torch`` rendezvous through MPI or torch.distributed instead. Every connection
  proves the group's secret (transport.py); pass ``secret=`` with a store others can read. ``codec`` is what the
  soft NICs run (must match the daemons' ``error_bound``).
- Every rank calls the same collectives in the same order; a mismatch raises RuntimeError on
  every rank. ``allreduce`` is the ring (the C ring engine, engine.py), ``wa_step`` the worker-aggregator baseline
  (wa.py); both go through the steps of pipeline.py. ``compress="nic"`` puts the gradient on
  sockets tagged for the soft NIC, ``"app"`` runs any codec inside the collective, ``None`` sends
  plain float32. The result is bit-identical on every rank.
- ``scaling`` and ``error_feedback`` default to what the codec's traits ask for; True/False
  force them. ``headroom`` (0 to limits.MAX_HEADROOM, default 0) is the precision the per-block scaling gives up
  for a higher compression ratio (docs/collectives.md, "Headroom"); ranks must agree on it. Pass ``key`` when reducing several tensors of equal length.
- ``barrier``, ``max_scalar``, ``sum_scalar``, ``control_allreduce`` and ``broadcast`` run on the
  untagged control plane (control.py); ``stats`` (stats.py), ``connections()`` and
  ``error_feedback`` are there to look inside.
- A dead peer raises ConnectionError, a silent one TimeoutError after ``timeout`` s; the group
  is then unusable. Wrong arguments raise TypeError/ValueError before anything is sent.
"""
from __future__ import annotations

import threading
import warnings
import zlib

import numpy as np

from ..codecs import Codec, ErrorFeedback, get_codec
from ..codecs.base import check_vector
from ..codecs.blockscale import HEADROOM
from ..limits import headroom_problem
from . import scaling as sc
from .rendezvous import (MPIExchange, TorchExchange, default_bind_addr, entry, group_key, make_exchange,
                         resolve_secret)
from ..shim.tagging import GRADIENT_TOS
from .control import (MODE_CODE, OP_ALLREDUCE, OP_BARRIER, OP_REDUCE, OP_VERIFY, OP_WA, REDUCE_OPS,
                      ControlPlane, codec_id, wire_format)
from . import engine
from .pipeline import Pipeline
from .stats import CallStats, GroupStats
from .transport import Conn, Endpoint, Kind, PlaneCounters, connect
from .wa import aggregate, broadcast_weights, worker_receive_weights, worker_send

__all__ = ["Group", "CallStats", "GroupStats"]

_DEFAULT = object()


def check_headroom(h) -> int:
    """``h`` as the headroom of the per-block scaling, or ValueError saying what it may be."""
    h = int(h) if isinstance(h, np.integer) else h
    if problem := headroom_problem(h):
        raise ValueError(f"headroom {problem}")
    return h


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
                 prefix: str = "inceptionn", secret: bytes | None = None, headroom: int = HEADROOM):
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
        self.headroom = check_headroom(headroom)
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
        self._plane = ControlPlane(self.rank, self.world, {})
        self._calls = 0
        self._verified = False
        self._broken: BaseException | None = None
        self._closed = False
        self._lock = threading.RLock()
        secret = resolve_secret(secret)
        exchange = make_exchange(store, self.rank, self.world, prefix) if self.world > 1 else None
        if exchange is not None and exchange is not store and secret is None and not getattr(store, "private", False):
            warnings.warn(f"the group's secret travels through a {type(store).__name__} that other users may read: "
                          "pass secret= (or $INCEPTIONN_GROUP_SECRET) to keep them out of the ring "
                          "(docs/collectives.md, 'Who can connect')", RuntimeWarning, stacklevel=2)
        self._endpoint = Endpoint(self.bind_addr, port, self.counters, timeout, self.rank,
                                  max_pending=64 + 2 * self.world)
        try:
            if self.world > 1:
                entries = exchange.exchange(entry(self._endpoint.endpoint))
                if len(entries) != self.world:
                    raise ValueError(f"rendezvous returned {len(entries)} endpoints for a world of {self.world}")
                self.endpoints, self._key = group_key(entries, secret)
                self._endpoint.set_group(self._key)
                if self.rank == 0:
                    for r in range(1, self.world):
                        self._plane.links[r] = self._incoming(Kind.CONTROL, r)
                else:
                    self._plane.links[0] = self._outgoing(Kind.CONTROL, 0)
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
        return connect(self.endpoints[peer], bind_addr=self.bind_addr, key=self._key, rank=self.rank,
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
                self._codecs[codec] = get_codec(codec)
            return self._codecs[codec]
        raise TypeError(f"codec must be a Codec (get_codec(...)) or a codec name, got {type(codec).__name__}")

    def _call_codec(self, mode: str, codec) -> Codec | None:
        if mode == "raw":
            return None
        c = self.codec if codec is None else self._resolve_codec(codec)
        if mode == "nic" and not c.per_value:
            raise ValueError(f"the soft NIC cuts the stream into packets, so it runs only per-value codecs; {c.name!r} "
                             "is not one: use compress='app' (the codec runs inside the collective)")
        return c

    @staticmethod
    def _switches(mode: str, codec, scaling, error_feedback) -> tuple[bool, bool]:
        """Scaling (wire format v2, ring.Wire) and error feedback: as asked, else what the codec's
        traits want."""
        lossy = codec is not None and mode != "raw"
        s = lossy and codec.wants_scaling if scaling is None else bool(scaling) and lossy
        if s and not codec.wants_scaling:
            raise ValueError(f"scaling=True: the per-block scaling serves codecs of absolute precision (the "
                             f"wants_scaling trait, e.g. inceptionn), not {codec.name!r}")
        e = lossy and codec.wants_error_feedback if error_feedback is None else bool(error_feedback)
        if e and mode == "raw":
            raise ValueError("error_feedback needs a lossy path: compress='nic' or 'app'")
        return s, e

    def _call_headroom(self, headroom, scale_on: bool) -> int:
        """The call's headroom (the Group's unless given); 0 on an unscaled wire, which has none."""
        h = self.headroom if headroom is None else check_headroom(headroom)
        return h if scale_on else 0

    def _chunk(self, mode: str, codec, n: int) -> int:
        """Per-value codecs may be cut into pipeline chunks anywhere; the others see one whole ring
        block (or the whole gradient in WA) per encode, their per-tensor unit."""
        if mode == "app" and not codec.per_value:
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
        self._guard(self._plane.round, OP_BARRIER, [])

    def control_allreduce(self, values, op: str = "max") -> np.ndarray:
        """Reduce a small float64 vector over all ranks on the control plane (``max``/``min``/``sum``;
        rank order at rank 0, so the result is identical on every rank)."""
        if op not in REDUCE_OPS:
            raise ValueError(f"op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
        v = np.atleast_1d(np.asarray(values, dtype=np.float64))
        if v.ndim != 1:
            raise ValueError("control_allreduce takes a scalar or a 1-D vector")
        return self._guard(self._plane.round, OP_REDUCE, [REDUCE_OPS[op], v.size], v)

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
        return self._guard(self._plane.broadcast, x, root)

    # --- allreduce -----------------------------------------------------------------------------

    def allreduce(self, x: np.ndarray, *, compress=_DEFAULT, codec=None, scaling: bool | None = None,
                  error_feedback: bool | None = None, key=None, out: np.ndarray | None = None,
                  average: bool = False, verify: bool | None = None, headroom: int | None = None) -> np.ndarray:
        """Sum of ``x`` over all ranks, bit-identical on every rank (see the module docstring)."""
        self._check_usable()
        x = check_vector(x)
        mode = self.compress if compress is _DEFAULT else self._mode(compress)
        cod = self._call_codec(mode, codec)
        scale_on, ef_on = self._switches(mode, cod, scaling, error_feedback)
        h = self._call_headroom(headroom, scale_on)
        work = self._output(out, x.size)
        do_verify = (verify if verify is not None else
                     self.verify == "always" or (self.verify == "first" and mode == "nic" and not self._verified))
        efkey = ("allreduce", x.size if key is None else key) if ef_on else None
        return self._guard(self._allreduce, x, work, mode, cod, scale_on, h, efkey, bool(average), bool(do_verify))

    def _pipeline(self, op: str, n: int, mode: str, cod, efkey) -> Pipeline:
        self._calls += 1
        return Pipeline(op, n, mode, cod, plane=self._plane, memory=self.error_feedback,
                        efkey=efkey, round_no=self._calls, stats=self.stats,
                        counters=self.counters)

    def _allreduce(self, x, work, mode, cod, scale_on, h, efkey, average, do_verify) -> np.ndarray:
        n = x.size
        with self._pipeline("allreduce", n, mode, cod, efkey) as p:
            if self.world == 1:
                if work is not x:
                    work[:] = x
                return work
            p.compensate(x, work)
            meta = [n, MODE_CODE[mode], codec_id(cod), self.chunk_values, wire_format(scale_on), h]
            p.control(OP_ALLREDUCE, meta)
            p.agree_codec(work)
            sink = p.sink(n)
            if n:
                kind = Kind.RING_TAGGED if mode == "nic" else Kind.RING_PLAIN
                send = self._outgoing(kind, (self.rank + 1) % self.world)
                recv = self._incoming(kind, (self.rank - 1) % self.world)
                args = dict(rank=self.rank, world=self.world, send=send, recv=recv,
                            chunk_values=self._chunk(mode, cod, n), mode=mode, codec=cod, sink=sink,
                            timers=p.timers, scaled=scale_on, headroom=h)
                with p.call.timing("exchange_seconds"):     # the C ring engine
                    engine.ring_allreduce(work, timeout=self.timeout, **args)
            p.remember(sink)
            if average:
                np.divide(work, np.float32(self.world), out=work)
            if do_verify:
                self._verify(p, work)
            return work

    def _verify(self, p: Pipeline, work: np.ndarray) -> None:
        crc = float(zlib.crc32(memoryview(work).cast("B")))
        v = p.control(OP_VERIFY, [], [crc, -crc])
        self._verified = True
        if v[0] != -v[1]:
            raise RuntimeError("allreduce results differ between ranks. With compress='nic' this means the soft "
                               f"NICs do not run the collective's codec ({self.codec!r}): give the Group the "
                               "codec with the daemons' error_bound")

    # --- worker-aggregator ---------------------------------------------------------------------

    def wa_step(self, grad: np.ndarray | None, update_fn=None, *, aggregator: int = 0, compress=_DEFAULT,
                codec=None, scaling: bool | None = None, error_feedback: bool | None = None, key=None,
                headroom: int | None = None) -> np.ndarray:
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
        h = self._call_headroom(headroom, scale_on)
        efkey = ("wa", (x.size if x is not None else -1) if key is None else key) if ef_on and not is_agg else None
        return self._guard(self._wa_step, x, update_fn, aggregator, mode, cod, scale_on, h, efkey)

    def _wa_step(self, x, update_fn, aggregator, mode, cod, scale_on, h, efkey) -> np.ndarray:
        is_agg = self.rank == aggregator
        with self._pipeline("wa_step", x.size if x is not None else 0, mode, cod, efkey) as p:
            meta = [aggregator, MODE_CODE[mode], codec_id(cod), self.chunk_values, wire_format(scale_on), h]
            nn = [x.size, -x.size] if x is not None else [-1.0, -np.inf]
            v = p.control(OP_WA, meta, nn)
            n = int(v[0])
            if n < 0:
                raise ValueError("wa_step: no rank passed a gradient")
            if -v[1] != n:
                raise ValueError(f"wa_step: ranks passed gradients of different lengths ({int(-v[1])} to {n} values)")
            p.call.n = n
            work = None
            if x is not None:
                work = np.empty(n, dtype=np.float32)
                p.compensate(x, work)
            p.agree_codec(work)
            kind = Kind.WA_TAGGED if mode == "nic" else Kind.WA_PLAIN
            chunk = self._chunk(mode, cod, n)
            if not is_agg:
                conn = self._outgoing(kind, aggregator)
                sink = p.sink(n)
                with p.call.timing("exchange_seconds"):
                    worker_send(work, conn, chunk_values=chunk, mode=mode, codec=cod, sink=sink, timers=p.timers,
                                scaled=scale_on, headroom=h)
                    weights = worker_receive_weights(conn)
                p.remember(sink)
                return weights
            conns = {r: self._incoming(kind, r) for r in range(self.world) if r != aggregator}
            with p.call.timing("exchange_seconds"):
                total = aggregate(work, conns, n, chunk_values=chunk, mode=mode, codec=cod, timers=p.timers,
                                  scaled=scale_on)
            weights = self._update(update_fn, total, conns)
            with p.call.timing("exchange_seconds"):
                broadcast_weights(weights, conns)
            return weights

    def _update(self, update_fn, total: np.ndarray, conns: dict) -> np.ndarray:
        """The aggregator's ``update_fn(total)``; if it fails, the waiting workers learn it by the
        connections closing."""
        try:
            weights = update_fn(total)
            if not isinstance(weights, np.ndarray) or weights.dtype != np.float32 or weights.ndim != 1:
                desc = f"{weights.dtype} array of shape {weights.shape}" if isinstance(weights, np.ndarray) \
                    else type(weights).__name__
                raise TypeError(f"update_fn must return the new weights as a 1-D float32 array, got {desc}")
        except BaseException as e:
            for c in conns.values():
                c.close()
            self._broken = e
            raise
        return np.ascontiguousarray(weights)
