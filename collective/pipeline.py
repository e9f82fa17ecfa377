"""The steps of one ``allreduce`` or ``wa_step`` around its engine (engine.py, wa.py), in the
order a call takes them:

1. compensate: the gradient plus what this rank's receivers did not get last time (error
   feedback, keyed per tensor);
2. the plan round on the control plane (every rank called the same thing);
3. codec agreement, for codecs that need shared parameters (``needs_agreement``);
4. the engine (the C ring engine through engine.py, or wa.py), which scales per block and per hop
   where the codec asks for it and records ``sent - decoded`` into the error-feedback sink;
5. remember the residual for next time.

A ``Pipeline`` is one call: it owns the call's ``CallStats`` and ``Timers`` and records them in
the group's stats however the call ends (``with Pipeline(...) as p``).
"""
from __future__ import annotations

import numpy as np

from ..codecs.memory import ErrorFeedback, Sink
from .control import OP_AGREE, ControlPlane
from .stats import CallStats, GroupStats, Timers
from .transport import PLANES, PlaneCounters


class Pipeline:
    """One call of ``op`` in ``mode`` ("raw", "nic", "app") with ``codec``; ``efkey`` names the
    tensor for error feedback (None: off)."""

    def __init__(self, op: str, n: int, mode: str, codec, *, plane: ControlPlane, memory: ErrorFeedback,
                 efkey, round_no: int, stats: GroupStats, counters: PlaneCounters):
        self.mode, self.codec, self.efkey = mode, codec, efkey
        self.plane, self.memory = plane, memory
        self.round_no = round_no
        self.call = CallStats(op=op, calls=1, n=n, compress=None if mode == "raw" else mode)
        self.timers = Timers()
        self._stats, self._counters = stats, counters

    def __enter__(self) -> "Pipeline":
        self._before = self._counters.snapshot()
        self._timing = self.call.timing("seconds")
        self._timing.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._timing.__exit__(*exc)
        call = self.call
        call.sum_seconds, call.codec_seconds = self.timers.sum, self.timers.codec
        (sent0, recv0), (sent1, recv1) = self._before, self._counters.snapshot()
        call.bytes_sent = {p: sent1[p] - sent0[p] for p in PLANES}
        call.bytes_received = {p: recv1[p] - recv0[p] for p in PLANES}
        self._stats.record(call)

    def control(self, op: int, meta: list[int], values=None) -> np.ndarray:
        """One control-plane round, counted as control time."""
        with self.call.timing("control_seconds"):
            return self.plane.round(op, meta, values)

    def compensate(self, x: np.ndarray, work: np.ndarray) -> None:
        """work = x + what this rank's receivers did not get last time (x alone without error
        feedback)."""
        with self.call.timing("scale_seconds"):
            if self.efkey is not None:
                self.memory.compensate_into(self.efkey, x, work)
            elif work is not x:
                work[:] = x

    def agree_codec(self, work: np.ndarray | None) -> None:
        """A codec that needs shared parameters gets the max over ranks of its local statistic."""
        if self.mode == "app" and self.codec.needs_agreement:
            stat = self.codec.local_stat(work) if work is not None else 0.0
            shared = self.control(OP_AGREE, [], [stat])[0]
            self.codec.agree(float(shared), self.round_no)

    def sink(self, n: int) -> Sink | None:
        """Where the engine records ``sent - decoded`` (None without error feedback)."""
        return self.memory.sink(self.efkey, n) if self.efkey is not None else None

    def remember(self, sink: Sink | None) -> None:
        """Keep ``sent - decoded`` for next time (the engines already subtracted chunk by chunk)."""
        if sink is None:
            return
        with self.call.timing("scale_seconds"):
            # inf - inf = NaN where a gradient held inf/NaN: never carry that into the next call
            # (the ring engine zeroes them already; one check is ~10x cheaper than nan_to_num)
            if not np.isfinite(sink.lost).all():
                np.nan_to_num(sink.lost, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
            self.memory.store(self.efkey, sink.lost)
