"""A numpy reference of the TernGrad codec, written straight from docs/spec.md section 4 and the
stream layout and random-bit rule of codecs_c/terngrad_codec.h. Given the same seed and draw
counter it produces the C library's bytes exactly; the tests hold the two to that.
"""
from __future__ import annotations

import numpy as np

from . import threelc_reference as tlc

MAGIC, VERSION, HEADER_BYTES = 0x54, 1, 12
PACKINGS = {"2bit": 0, "base3": 1}
RANDOM_BITS = 29
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MAX_COUNT = 2**32 - 1


def encoded_size(n: int, packing: str) -> int:
    return HEADER_BYTES + (-(-n // 4) if packing == "2bit" else -(-n // 5))


def draws(n: int) -> int:
    return -(-n // 2)


def random_draws(seed: int, draw: int, count: int) -> np.ndarray:
    """splitmix64: draw k of seed z is mix(z + (k+1) * golden), arithmetic mod 2^64."""
    k = np.arange(count, dtype=np.uint64) + np.uint64(draw % 2**64) + np.uint64(1)
    z = np.uint64(seed % 2**64) + k * GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform_bits(seed: int, draw: int, n: int) -> np.ndarray:
    """The 29 random bits of each value: bits 32*(i%2).. of draw i/2."""
    r = random_draws(seed, draw, draws(n))
    halves = np.stack([r & np.uint64(0xFFFFFFFF), r >> np.uint64(32)], axis=1).ravel()[:n]
    return (halves & np.uint64(2**RANDOM_BITS - 1)).astype(np.uint32)


def clip_bound(x: np.ndarray, clip) -> np.float32:
    """(float)(clip * sigma); sums in double over 8 interleaved lanes, in lane order."""
    if not clip or clip <= 0 or x.size == 0:
        return np.float32(np.inf)
    v = np.zeros(-(-x.size // 8) * 8, dtype=np.float64)
    v[: x.size] = x
    v = v.reshape(-1, 8)
    lanes = np.cumsum(v, axis=0)[-1]  # cumsum: strictly sequential per lane
    lanes2 = np.cumsum(v * v, axis=0)[-1]

    def combine(l):
        return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))

    s, sq = float(combine(lanes)), float(combine(lanes2))
    mean = s / x.size
    var = sq / x.size - mean * mean
    return np.float32(float(clip) * float(np.sqrt(max(var, 0.0))))


def scaler(x: np.ndarray, clip) -> tuple[np.float32, np.float32]:
    """(s, bound): this tensor's scaler max(min(|x|, bound)) and its clip bound."""
    if not np.isfinite(x).all():
        raise ValueError("TernGrad input holds NaN or infinity")
    bound = clip_bound(x, clip)
    mx = np.abs(x).max() if x.size else np.float32(0.0)
    return np.float32(min(mx, bound)), bound


def ternarize(x: np.ndarray, bound, S, seed: int, draw: int) -> np.ndarray:
    a = np.minimum(np.abs(x), np.float32(bound)).astype(np.float64)
    u = uniform_bits(seed, draw, x.size).astype(np.float64)
    hit = u * float(np.float32(S)) < a * 2.0**RANDOM_BITS
    return np.where(hit, np.where(np.signbit(x), -1, 1), 0).astype(np.int8)


def pack_2bit(t: np.ndarray) -> np.ndarray:
    c = np.zeros(-(-t.size // 4) * 4, dtype=np.uint8)
    c[: t.size] = t.astype(np.uint8) & 3  # two's complement: -1 -> 11
    c = c.reshape(-1, 4)
    return (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).astype(np.uint8)


def unpack_2bit(b: np.ndarray, n: int) -> np.ndarray:
    c = ((b[:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3).ravel()
    if (c == 2).any():
        raise ValueError(f"invalid 2-bit code 10 at payload byte {int(np.argmax(c == 2)) // 4}")
    if (c[n:] != 0).any():
        raise ValueError("non-zero padding in the last byte")
    return np.array([0, 1, 0, -1], dtype=np.int8)[c[:n]]


def header(S, n: int, packing: str) -> bytes:
    return (bytes([MAGIC, VERSION, PACKINGS[packing], 0]) + np.float32(S).tobytes()
            + int(n).to_bytes(4, "little"))


def encode(x: np.ndarray, clip=2.5, shared=None, packing: str = "2bit", seed: int = 0,
           draw: int = 0) -> bytes:
    """shared: the scaler agreed among workers (used when above this tensor's own), or None."""
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {', '.join(PACKINGS)}, got {packing!r}")
    if x.size > MAX_COUNT:
        raise ValueError(f"TernGrad streams hold at most {MAX_COUNT} values, got {x.size}")
    own, bound = scaler(x, clip)
    # The agreed scaler is a floor: a tensor with a larger own scaler keeps it (stays unbiased).
    S = own if shared is None else max(own, np.float32(shared))
    t = ternarize(x, bound, S, seed, draw)
    payload = pack_2bit(t) if packing == "2bit" else tlc.pack_base3(t)
    return header(S, x.size, packing) + payload.tobytes()


def decode_ternary(blob: bytes, n: int) -> tuple[np.float32, np.ndarray]:
    data = np.frombuffer(bytes(blob), dtype=np.uint8)
    if data.size < HEADER_BYTES:
        raise ValueError(f"stream of {data.size} bytes is shorter than the {HEADER_BYTES}-byte header")
    if data[0] != MAGIC or data[1] != VERSION or data[2] > 1 or data[3] != 0:
        raise ValueError(f"bad TernGrad header {bytes(data[:4]).hex()}")
    S = data[4:8].view(np.float32)[0]
    if not np.isfinite(S) or np.signbit(S):
        raise ValueError(f"TernGrad scaler {S} is not a finite non-negative float")
    count = int(data[8:12].view("<u4")[0])
    if count != n:
        raise ValueError(f"stream holds {count} values, expected {n}")
    packing = "2bit" if data[2] == 0 else "base3"
    if data.size != encoded_size(n, packing):
        raise ValueError(f"{n} values in {packing} take {encoded_size(n, packing)} bytes, got {data.size}")
    payload = data[HEADER_BYTES:]
    t = unpack_2bit(payload, n) if packing == "2bit" else tlc.unpack_base3(payload, n)
    return S, t


def decode(blob: bytes, n: int) -> np.ndarray:
    S, t = decode_ternary(blob, n)
    return np.array([-S, 0.0, S], dtype=np.float32)[t.astype(np.int64) + 1]
