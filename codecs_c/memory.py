"""Error feedback as one reusable piece (GRACE's "Memory"), the only one: codecs keep none.

What a lossy codec drops in one round is added back before the next: the sender keeps, per
tensor (or bucket) key, the residual ``compensated - reconstructed``, where ``reconstructed`` is
exactly what the receiver decodes (the decode of the blob that was sent). 3LC's accumulation
buffer and THC's ``e = x - RHT^-1(own quantized)`` are this same loop:
``memory.encode(codec, x, key)``. The collective runs it over whole calls (``compensate_into``,
``sink``, ``store``), where what each receiver decodes is known piece by piece.
"""
from __future__ import annotations

from collections.abc import Hashable

import numpy as np


class Sink:
    """What the receivers did not get in one call, filled piece by piece as the pieces go on the
    wire (a collective's engines call ``record`` for every position exactly once per call)."""

    def __init__(self, n: int):
        self.lost = np.empty(n, dtype=np.float32)

    def record(self, a: int, b: int, sent: np.ndarray, decoded: np.ndarray) -> None:
        np.subtract(sent, decoded, out=self.lost[a:b])


class ErrorFeedback:
    """Residual memory keyed by tensor name (or bucket index)."""

    def __init__(self, decay: float = 1.0):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"error-feedback decay must be in [0, 1], got {decay}")
        self.decay = float(decay)
        self._residual: dict[Hashable, np.ndarray] = {}
        self._sinks: dict[Hashable, Sink] = {}

    def compensate(self, key: Hashable, x: np.ndarray) -> np.ndarray:
        """``x`` plus what was lost for ``key`` last time (a new array; ``x`` is not modified)."""
        r = self._residual.get(key)
        if r is None:
            return np.array(x, dtype=np.float32, copy=True)
        if r.shape != x.shape:
            raise ValueError(f"error-feedback key {key!r}: shape {x.shape} differs from the stored {r.shape}")
        return (x + r).astype(np.float32, copy=False)

    def compensate_into(self, key: Hashable, x: np.ndarray, out: np.ndarray) -> None:
        """``out = x`` plus what was lost for ``key`` last time, without a temporary (``out`` may
        be ``x``)."""
        r = self._residual.get(key)
        if r is None:
            if out is not x:
                out[:] = x
            return
        if r.shape != x.shape:
            raise ValueError(f"error-feedback key {key!r}: {x.size} values now, {r.size} last time; "
                             "pass a distinct key= for each tensor")
        np.add(x, r, out=out)

    def sink(self, key: Hashable, n: int) -> Sink:
        """The key's Sink for a call of ``n`` values, reused: n fresh floats every call would cost
        page faults, not just memory. Hand ``sink.lost`` to ``store`` when the call is done."""
        s = self._sinks.get(key)
        if s is None or s.lost.size != n:
            s = self._sinks[key] = Sink(n)
        return s

    def encode(self, codec, x: np.ndarray, key: Hashable) -> bytes:
        """One round around ``codec``: encode ``x`` plus the key's residual and keep what the
        receiver will not see. A codec that needs agreement agrees on the compensated vector
        first (``codec.local_stat(memory.compensate(key, x))``)."""
        comp = self.compensate(key, x)
        blob, decoded = codec.encode_decoded(comp)
        self.update(key, comp, decoded)
        return blob

    def update(self, key: Hashable, compensated: np.ndarray, reconstructed: np.ndarray) -> None:
        """Remember what the receiver will not see: ``compensated - reconstructed``."""
        if compensated.shape != reconstructed.shape:
            raise ValueError("compensated and reconstructed differ in shape")
        r = np.subtract(compensated, reconstructed, dtype=np.float32)
        if self.decay != 1.0:
            r *= np.float32(self.decay)
        self._residual[key] = r

    def store(self, key: Hashable, residual: np.ndarray) -> None:
        """Keep ``residual`` (already ``compensated - reconstructed``) for ``key``: copied into the
        key's buffer, so the caller may reuse its array and no memory is allocated per call."""
        r = self._residual.get(key)
        if r is None or r.shape != residual.shape:
            r = self._residual[key] = np.empty(residual.shape, dtype=np.float32)
        np.copyto(r, residual)
        if self.decay != 1.0:
            r *= np.float32(self.decay)

    def residual(self, key: Hashable) -> np.ndarray | None:
        return self._residual.get(key)

    def reset(self) -> None:
        self._residual.clear()

    def __len__(self) -> int:
        return len(self._residual)


def check_switch(name: str, value) -> bool:
    """A codec's on/off argument such as ``error_feedback`` (which sets its trait)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value
