"""What a Group measures: seconds and bytes per call (``CallStats``), summed per group and per
operation (``GroupStats``), and the seconds the engines spend summing and in the codec
(``Timers``: wall time of those spans, which overlap the exchange)."""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

from .transport import PLANES

_SECONDS = ("seconds", "exchange_seconds", "control_seconds", "sum_seconds", "codec_seconds", "scale_seconds")


@dataclass
class CallStats:
    """One call, or a sum of calls. Seconds are wall time; sum/codec/scale overlap the exchange."""

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

    @contextlib.contextmanager
    def timing(self, what: str):
        """Add the wall time of the ``with`` body to the field ``what`` (e.g. "scale_seconds")."""
        t = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, what, getattr(self, what) + time.perf_counter() - t)

    def add(self, o: "CallStats") -> None:
        self.calls += o.calls
        self.n += o.n
        for f in _SECONDS:
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


class Timers:
    """Seconds spent summing and in the codec (wall time of each span), from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.sum = 0.0
        self.codec = 0.0

    def add(self, what: str, seconds: float) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + seconds)
