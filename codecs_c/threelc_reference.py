"""A numpy reference of the 3LC codec, written straight from docs/spec.md section 5 (and the stream
layout of codecs_c/threelc_codec.h). It favours clarity over speed; the tests hold the C library
to it bit for bit.
"""
from __future__ import annotations

import numpy as np

MAGIC, VERSION, HEADER_BYTES, FLAG_ZRE = 0x33, 1, 12, 1
ZERO_BYTE, MAX_BYTE, MAX_RUN = 121, 242, 14
MAX_COUNT = 2**32 - 1
POWERS = np.array([81, 27, 9, 3, 1], dtype=np.int64)


def check_sparsity(s) -> np.float32:
    s32 = np.float32(s)
    if not (1.0 <= s32 < 2.0):
        raise ValueError(f"sparsity multiplier must be in [1, 2) (as float32), got {s!r}")
    return s32


def scaler(a: np.ndarray, s) -> np.float32:
    """M = s * max|A| in float32."""
    s32 = check_sparsity(s)
    if not np.isfinite(a).all():
        raise ValueError("3LC input holds NaN or infinity")
    mx = np.abs(a).max() if a.size else np.float32(0.0)
    with np.errstate(over="ignore"):
        m = np.float32(s32 * np.float32(mx))
    if not np.isfinite(m):
        raise ValueError("3LC scaler s * max|x| overflows float32")
    return m


def quantize(a: np.ndarray, s) -> tuple[np.float32, np.ndarray]:
    """(M, Q): Q = round(A/M) in {-1,0,1}, half to even, i.e. sign(A) where 2|A| > M."""
    m = scaler(a, s)
    with np.errstate(over="ignore"):
        above = np.float32(2.0) * np.abs(a) > m
    q = np.where(above, np.where(np.signbit(a), -1, 1), 0).astype(np.int8)
    return m, q


def dequantize(m, q: np.ndarray) -> np.ndarray:
    vals = np.array([-m, 0.0, m], dtype=np.float32)
    return vals[q.astype(np.int64) + 1]


def pack_base3(q: np.ndarray) -> np.ndarray:
    """Five consecutive digits q+1 per byte, 81a+27b+9c+3d+e; the tail padded with digit 0."""
    d = np.zeros(-(-q.size // 5) * 5, dtype=np.int64)
    d[: q.size] = q.astype(np.int64) + 1
    return (d.reshape(-1, 5) @ POWERS).astype(np.uint8)


def unpack_base3(b: np.ndarray, n: int) -> np.ndarray:
    """Inverse of pack_base3: the first n values; refuses bytes above 242 and non-zero padding."""
    if b.size != -(-n // 5):
        raise ValueError(f"{n} values take {-(-n // 5)} base-3^5 bytes, got {b.size}")
    if (b > MAX_BYTE).any():
        raise ValueError(f"base-3^5 byte above {MAX_BYTE} at payload byte {int(np.argmax(b > MAX_BYTE))}")
    d = (b.astype(np.int64)[:, None] // POWERS) % 3
    d = d.ravel()
    if (d[n:] != 0).any():
        raise ValueError("padding digit of the last byte is not 0")
    return (d[:n] - 1).astype(np.int8)


def zre_encode(b: np.ndarray) -> np.ndarray:
    """Each run of k bytes 121 (k >= 2) becomes 243+(k-2), runs longer than 14 split greedily."""
    out = []
    i, n = 0, b.size
    zero = np.flatnonzero(b == ZERO_BYTE)
    starts = zero[np.r_[True, np.diff(zero) != 1]] if zero.size else zero
    ends = zero[np.r_[np.diff(zero) != 1, True]] + 1 if zero.size else zero
    for s, e in zip(starts.tolist(), ends.tolist()):
        out.append(b[i:s])
        k = e - s
        tokens = [255] * (k // MAX_RUN)
        rest = k % MAX_RUN
        if rest == 1:
            tokens.append(ZERO_BYTE)
        elif rest >= 2:
            tokens.append(243 + rest - 2)
        out.append(np.array(tokens, dtype=np.uint8))
        i = e
    out.append(b[i:n])
    return np.concatenate(out) if out else b[:0]


def zre_decode(z: np.ndarray, nbytes: int) -> np.ndarray:
    """Inverse of zre_encode, expanding to exactly nbytes base-3^5 bytes."""
    lengths = np.where(z > MAX_BYTE, z.astype(np.int64) - 241, 1)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if ends.size else 0
    if total < nbytes:
        raise ValueError(f"stream ends after {total} of {nbytes} base-3^5 bytes")
    if total > nbytes:
        first = int(np.argmax(ends > nbytes))
        starts = ends - lengths
        if starts[first] >= nbytes:
            raise ValueError(f"bytes left after the last value (payload byte {first})")
        raise ValueError(f"zero run at payload byte {first} goes past the last value")
    return np.repeat(np.where(z > MAX_BYTE, ZERO_BYTE, z), lengths).astype(np.uint8)


def header(m, n: int, zre: bool) -> bytes:
    return (bytes([MAGIC, VERSION, FLAG_ZRE if zre else 0, 0]) + np.float32(m).tobytes()
            + int(n).to_bytes(4, "little"))


def encode_quantized(m, q: np.ndarray, zre: bool = True) -> bytes:
    if q.size > MAX_COUNT:
        raise ValueError(f"3LC streams hold at most {MAX_COUNT} values, got {q.size}")
    b = pack_base3(q)
    return header(m, q.size, zre) + (zre_encode(b) if zre else b).tobytes()


def encode(a: np.ndarray, s=1.0, zre: bool = True) -> bytes:
    m, q = quantize(a, s)
    return encode_quantized(m, q, zre)


def parse(blob: bytes, n: int) -> tuple[np.float32, bool, np.ndarray]:
    """Check the header against n; return (M, zre, payload bytes)."""
    data = np.frombuffer(bytes(blob), dtype=np.uint8)
    if data.size < HEADER_BYTES:
        raise ValueError(f"stream of {data.size} bytes is shorter than the {HEADER_BYTES}-byte header")
    if data[0] != MAGIC or data[1] != VERSION or int(data[2]) & ~FLAG_ZRE or data[3] != 0:
        raise ValueError(f"bad 3LC header {bytes(data[:4]).hex()}")
    m = data[4:8].view(np.float32)[0]
    if not np.isfinite(m) or np.signbit(m):
        raise ValueError(f"3LC scaler M = {m} is not a finite non-negative float")
    count = int(data[8:12].view("<u4")[0])
    if count != n:
        raise ValueError(f"stream holds {count} values, expected {n}")
    return m, bool(data[2] & FLAG_ZRE), data[HEADER_BYTES:]


def decode_quantized(blob: bytes, n: int) -> tuple[np.float32, np.ndarray]:
    m, zre, payload = parse(blob, n)
    nbytes = -(-n // 5)
    if zre:
        b = zre_decode(payload, nbytes)
    else:
        if (payload > MAX_BYTE).any():
            raise ValueError("byte above 242 in a stream without zero-run encoding")
        if payload.size != nbytes:
            raise ValueError(f"{n} values take {nbytes} payload bytes, got {payload.size}")
        b = payload
    return m, unpack_base3(b, n)


def decode(blob: bytes, n: int) -> np.ndarray:
    m, q = decode_quantized(blob, n)
    return dequantize(m, q)
