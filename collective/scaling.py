"""Exact power-of-two gradient scaling per bucket: wire format v1's. The collective no longer
uses it (v2 scales per block at every hop: ring.Wire, docs/collectives.md); the benchmarks do,
to compare codecs on scaled inputs (``scaled_copy``) and for ``bench scale``'s "before" rows.

The INCEPTIONN codec keeps *absolute* precision (16BIT: 2^-15, 8BIT: 2^-7) and zeroes values
below 2^-7 for the usual error bounds (docs/spec.md section 1), while real gradients mostly sit below
2^-7. So before a gradient goes on a tagged socket, every bucket of ``bucket`` consecutive values
is multiplied by ``2^s``, one exponent per bucket agreed by all workers: the largest ``s`` with
``headroom * M * 2^s < 1``, ``M`` the max over workers of the bucket's ``max |x|`` and
``headroom`` the number of values that can meet in one sum on the wire (N for the ring, whose
partial sums cross the wire; 1 for WA, where only single gradients do). Sums then stay below 1.0,
in the compressed tiers. Multiplying by a power of two is exact (unless a value leaves the
normal float range), so unscaling gives back exactly what a sum of unscaled values would.
"""
from __future__ import annotations

import numpy as np

BUCKET_VALUES = 65536
MAX_EXPONENT = 100


def bucket_maxima(x: np.ndarray, bucket: int = BUCKET_VALUES) -> np.ndarray:
    """Per bucket, ``max |x|`` as float64 (NaN if the bucket holds a NaN); no temporary copy of x."""
    if x.size == 0:
        return np.zeros(0, dtype=np.float64)
    starts = np.arange(0, x.size, bucket)
    hi = np.maximum.reduceat(x, starts).astype(np.float64)
    lo = np.minimum.reduceat(x, starts).astype(np.float64)
    return np.maximum(hi, -lo)


def exponents(maxima: np.ndarray, headroom: int) -> np.ndarray:
    """The largest s per bucket with ``headroom * max * 2^s < 1`` (0 for zero, inf or NaN).

    Read off the float's exponent (``peak = m * 2^e`` with ``0.5 <= m < 1``, so ``s = -e``), not
    computed with log2: numpy's log2 is a SIMD routine picked per CPU whose last bit may differ,
    and every rank must derive the same exponents from the same agreed maxima."""
    peak = np.asarray(maxima, dtype=np.float64) * float(headroom)
    _, e = np.frexp(peak)
    s = -e.astype(np.int64)
    s[(peak == 0) | ~np.isfinite(peak)] = 0
    return np.clip(s, -MAX_EXPONENT, MAX_EXPONENT)


def apply(x: np.ndarray, exps: np.ndarray, bucket: int = BUCKET_VALUES, *, inverse: bool = False) -> None:
    """Multiply each bucket of ``x`` in place by ``2^s`` (``2^-s`` with ``inverse``); exact."""
    for b, s in enumerate(exps.tolist()):
        if s:
            x[b * bucket:(b + 1) * bucket] *= np.float32(2.0 ** (-s if inverse else s))


def scaled_copy(x: np.ndarray, headroom: int, bucket: int = BUCKET_VALUES) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as one rank alone would scale it for ``headroom`` values per sum, and the exponents
    (what the benchmarks compare the codecs on; a Group agrees the maxima over ranks first)."""
    exps = exponents(bucket_maxima(x, bucket), headroom)
    y = np.array(x, dtype=np.float32, copy=True)
    apply(y, exps, bucket)
    return y, exps
