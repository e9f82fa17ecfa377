"""A numpy reference of FFT sparsification with the range-based float (docs/spec.md section 7; wire
format in fft_codec.h and docs/codecs.md), written for clarity, not speed.

Both paths take the spectrum from ``numpy.fft.rfft``; from the spectrum on, this module and the
C library produce the same bytes: the same magnitude keys (float64 ``re^2 + im^2`` of the
float32 parts), the same tie-breaking (lower index first), the same range and mantissa choice
(squared error summed left to right in float64), the same codes.
"""
from __future__ import annotations

import numpy as np

MAGIC, VERSION = 0x46, 1
HEADER_BYTES = 16
MIN_BITS, MAX_BITS, MAX_MANTISSA = 2, 16, 23
MAX_N = 1 << 31


def fft_length(n: int) -> int:
    """The padded transform length: the smallest 2^a 3^b 5^c >= n (0 for n = 0)."""
    if n == 0 or n > MAX_N:
        return 0
    best = 1 << 32
    a = 1
    while a < best:
        b = a
        while b < best:
            c = b
            while c < best:
                if c >= n:
                    best = c
                    break
                c *= 5
            b *= 3
        a *= 2
    return best


def bins(n: int) -> int:
    L = fft_length(n)
    return L // 2 + 1 if L else 0


def kept_count(n: int, theta: float) -> int:
    """Components kept at drop ratio theta: K - floor(theta * K) (theta = 0 keeps all)."""
    K = bins(n)
    return K - int(np.floor(theta * K))


def encoded_size(n: int, k: int, bits: int) -> int:
    return HEADER_BYTES + (bins(n) + 7) // 8 + (2 * k * bits + 7) // 8


def spectrum(x: np.ndarray) -> np.ndarray:
    """The real-to-complex FFT of x zero-padded to ``fft_length(n)``, as complex64 (numpy >= 2
    computes float32 input in float32). Padding to a 5-smooth length keeps the FFT fast: a
    gradient whose length has a large prime factor would otherwise fall to Bluestein's
    algorithm (789010 = 2 * 5 * 78901 takes ~30x longer than 800000)."""
    if x.size == 0:
        return np.zeros(0, np.complex64)
    return np.fft.rfft(x, fft_length(x.size)).astype(np.complex64)


# --- the range-based float ----------------------------------------------------------------------

def _pattern(v: np.ndarray, m: int) -> np.ndarray:
    return (v.astype(np.float32).view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(np.int64) >> (23 - m)


def pbase_ok(pbase: int, bits: int, m: int) -> bool:
    qmax = (1 << (bits - 1)) - 1
    return pbase >= 1 and pbase + qmax - 1 < (255 << m)


def rf_pbase(max_abs: float, bits: int, m: int) -> int:
    """pbase so that the top code is the truncated pattern of max_abs (0 if no valid pbase)."""
    qmax = (1 << (bits - 1)) - 1
    top = int(_pattern(np.array([max_abs], np.float32), m)[0])
    pbase = top - (qmax - 1) if top > qmax - 1 else 1
    return pbase if pbase_ok(pbase, bits, m) else 0


def rf_quantize(v: np.ndarray, bits: int, m: int, pbase: int) -> np.ndarray:
    qmax = (1 << (bits - 1)) - 1
    v = np.asarray(v, np.float32)
    p = _pattern(v, m)
    q = np.where(p < pbase, 0, np.minimum(p - pbase + 1, qmax))
    sign = (v.view(np.uint32) >> np.uint32(31)).astype(np.int64)
    return (sign << (bits - 1)) | q


def rf_dequantize(codes: np.ndarray, bits: int, m: int, pbase: int) -> np.ndarray:
    codes = np.asarray(codes, np.int64)
    sign = (codes >> (bits - 1)) & 1
    q = codes & ((1 << (bits - 1)) - 1)
    mag = np.where(q == 0, 0, (pbase + q - 1) << (23 - m))
    return ((sign << 31) | mag).astype(np.uint32).view(np.float32)


def rf_sse(v: np.ndarray, bits: int, m: int, pbase: int) -> float:
    """Squared error summed left to right in float64 (as the C loop does)."""
    if v.size == 0:
        return 0.0
    e = v.astype(np.float64) - rf_dequantize(rf_quantize(v, bits, m, pbase), bits, m, pbase).astype(np.float64)
    return float(np.cumsum(e * e)[-1])


def choose_mantissa(v: np.ndarray, bits: int) -> int:
    max_abs = np.float32(np.abs(v).max()) if v.size else np.float32(0)
    best, best_m = 0.0, -1
    for m in range(min(bits - 1, MAX_MANTISSA) + 1):
        pb = rf_pbase(max_abs, bits, m)
        if pb == 0:
            continue
        e = rf_sse(v, bits, m, pb)
        if best_m < 0 or e < best:
            best, best_m = e, m
    return best_m


# --- sparsification and the blob ----------------------------------------------------------------

def select(spec: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest |X|^2 (float64 of the float32 parts), ties to the lower index,
    in increasing order."""
    re = spec.real.astype(np.float64)
    im = spec.imag.astype(np.float64)
    key = (re * re + im * im).view(np.uint64)
    order = np.lexsort((np.arange(spec.size), ~key))  # key descending, then index ascending
    return np.sort(order[:k])


def pack_bits(values: np.ndarray, width: int) -> bytes:
    v = values.astype(np.uint64)
    bits = ((v[:, None] >> np.arange(width, dtype=np.uint64)) & np.uint64(1)).astype(np.uint8).ravel()
    return np.packbits(bits, bitorder="little").tobytes()


def encode_spectrum(spec: np.ndarray, n: int, k: int, bits: int, mantissa: int | None = None) -> bytes:
    K = bins(n)
    spec = np.asarray(spec, np.complex64)
    if spec.size != K or not 0 <= k <= K or not MIN_BITS <= bits <= MAX_BITS or n > MAX_N:
        raise ValueError("bad FFT encode arguments")
    parts = spec.view(np.float32)
    if not np.isfinite(parts).all():
        raise ValueError("FFT spectrum holds a non-finite value")
    idx = select(spec, k) if k < K else np.arange(K)
    kept = spec[idx].view(np.float32) if k else np.zeros(0, np.float32)  # re, im interleaved
    m = choose_mantissa(kept, bits) if mantissa is None else mantissa
    max_abs = np.float32(np.abs(kept).max()) if kept.size else np.float32(0)
    pbase = rf_pbase(max_abs, bits, m)
    if pbase == 0:
        raise ValueError(f"no valid range for mantissa bits {m}")
    bitmap = np.zeros(K, np.uint8)
    bitmap[idx] = 1
    head = bytes([MAGIC, VERSION, bits, m]) + np.uint32(pbase << (23 - m)).tobytes() \
        + np.uint32(n).tobytes() + np.uint32(k).tobytes()
    return head + np.packbits(bitmap, bitorder="little").tobytes() + pack_bits(rf_quantize(kept, bits, m, pbase), bits)


def parse(blob: bytes) -> dict:
    b = bytes(blob)
    if (len(b) >= 1 and b[0] != MAGIC) or (len(b) >= 2 and b[1] != VERSION):
        raise ValueError("malformed FFT stream: bad magic or version")
    if len(b) < HEADER_BYTES:
        raise ValueError("malformed FFT stream: truncated header")
    bits, m = b[2], b[3]
    if not MIN_BITS <= bits <= MAX_BITS or m > MAX_MANTISSA:
        raise ValueError("malformed FFT stream: bad bits or mantissa")
    eps = int.from_bytes(b[4:8], "little")
    pbase = eps >> (23 - m)
    if eps >> 31 or pbase << (23 - m) != eps or not pbase_ok(pbase, bits, m):
        raise ValueError("malformed FFT stream: bad range")
    n, k = int.from_bytes(b[8:12], "little"), int.from_bytes(b[12:16], "little")
    K = bins(n)
    if k > K:
        raise ValueError("malformed FFT stream: more kept components than bins")
    total = encoded_size(n, k, bits)
    if len(b) != total:
        raise ValueError(f"malformed FFT stream: {len(b)} bytes, header says {total}")
    return dict(bits=bits, mantissa=m, pbase=pbase, eps=float(np.uint32(eps).view(np.float32)), n=n, k=k,
                bins=K, bitmap=b[HEADER_BYTES: HEADER_BYTES + (K + 7) // 8],
                codes=b[HEADER_BYTES + (K + 7) // 8:])


def decode_spectrum(blob: bytes, n: int) -> np.ndarray:
    info = parse(blob)
    if info["n"] != n:
        raise ValueError(f"malformed FFT stream: it holds {info['n']} values, expected {n}")
    K, k, bits = info["bins"], info["k"], info["bits"]
    flags = np.unpackbits(np.frombuffer(info["bitmap"], np.uint8), bitorder="little")
    if flags[K:].any() or flags.sum() != k:
        raise ValueError("malformed FFT stream: bitmap does not match k")
    cbits = np.unpackbits(np.frombuffer(info["codes"], np.uint8), bitorder="little")
    if cbits[2 * k * bits:].any():
        raise ValueError("malformed FFT stream: nonzero padding bits")
    codes = (cbits[: 2 * k * bits].reshape(2 * k, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)
    spec = np.zeros(K, np.complex64)
    spec.view(np.float32).reshape(K, 2)[np.flatnonzero(flags[:K])] = \
        rf_dequantize(codes, bits, info["mantissa"], info["pbase"]).reshape(k, 2)
    return spec


def inverse(spec: np.ndarray, n: int) -> np.ndarray:
    """The first n values of irfft(spec, fft_length(n)), all finite, or ValueError. A blob's
    codes reach FLT_MAX, and float32 partial sums of such a spectrum overflow: those (rare)
    spectra are inverted again in float64, and refused if a value still lies beyond float32."""
    if n == 0:
        return np.zeros(0, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.fft.irfft(spec, fft_length(n))[:n].astype(np.float32)
        if np.isfinite(x).all():
            return x
        x = np.fft.irfft(spec.astype(np.complex128), fft_length(n))[:n].astype(np.float32)
    if not np.isfinite(x).all():
        raise ValueError("malformed FFT stream: its spectrum decodes to values beyond float32")
    return x


def encode(x: np.ndarray, theta: float, bits: int, mantissa: int | None = None) -> bytes:
    return encode_spectrum(spectrum(x), x.size, kept_count(x.size, theta), bits, mantissa)


def decode(blob: bytes, n: int) -> np.ndarray:
    return inverse(decode_spectrum(blob, n), n)
