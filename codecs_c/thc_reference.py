"""A numpy reference of the THC codec (docs/spec.md section 6; wire format in thc_codec.h and
docs/codecs.md), written for clarity, not speed.

Given the same range M, rotation seed and noise seed it produces the same bytes as the C encoder:
the random bits come from the same counter-based splitmix64 stream, the Hadamard butterflies run
level by level in float32 (each element sees the same float operations in the same order), and
the quantization arithmetic is done in float64 with the same operations.
"""
from __future__ import annotations

import numpy as np

MAGIC, VERSION = 0x54, 1
HEADER_BYTES = 24
KIND_INDEX, KIND_SUM = 0, 1
MAX_BITS, MAX_GRANULARITY, MAX_LOG2_DIM = 8, 255, 31
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SQRT_HALF_F32 = np.float32(0.70710677)  # float32(sqrt(0.5)), as the C code's 0x1.6a09e6p-1f
U64 = np.uint64


def padded_dim(n: int) -> int:
    """The smallest power of two >= max(n, 1)."""
    d = 1
    while d < n:
        d <<= 1
    if d > 1 << MAX_LOG2_DIM:
        raise ValueError(f"THC handles at most 2^{MAX_LOG2_DIM} values, got {n}")
    return d


def blob_size(n: int, bits: int, width: int) -> int:
    d = padded_dim(n)
    return HEADER_BYTES + (1 << bits) + (d * width + 7) // 8


def mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def random_words(seed: int, count: int) -> np.ndarray:
    """Words 0..count-1 of the splitmix64 stream: mix(seed + (j+1) * golden)."""
    j = np.arange(1, count + 1, dtype=np.uint64)
    return mix64(U64(seed) + j * GOLDEN)


def sign_flips(seed: int, d: int) -> np.ndarray:
    """The Rademacher diagonal as a mask: True where D_i = -1."""
    words = random_words(seed, -(-d // 64))
    bits = (words[:, None] >> np.arange(64, dtype=np.uint64)) & U64(1)
    return bits.ravel()[:d].astype(bool)


def inv_sqrt_dim(d: int) -> np.float32:
    k = d.bit_length() - 1
    s = SQRT_HALF_F32 if k & 1 else np.float32(1.0)
    return np.float32(s * np.float32(2.0 ** -(k // 2)))


def fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh-Hadamard transform of a float32 vector (a new array)."""
    x = np.array(x, dtype=np.float32, copy=True)
    d = x.size
    h = 1
    while h < d:
        v = x.reshape(-1, 2, h)
        a, b = v[:, 0, :].copy(), v[:, 1, :].copy()
        v[:, 0, :] = a + b
        v[:, 1, :] = a - b
        h *= 2
    return x


def rht(x: np.ndarray, seed: int) -> np.ndarray:
    """``H D x / sqrt(d)`` for a float32 vector whose length is a power of two."""
    x = np.where(sign_flips(seed, x.size), -x, x).astype(np.float32)
    return (fwht(x) * inv_sqrt_dim(x.size)).astype(np.float32)


def irht(y: np.ndarray, seed: int) -> np.ndarray:
    """``D H y / sqrt(d)``: the inverse of ``rht``."""
    x = (fwht(y) * inv_sqrt_dim(y.size)).astype(np.float32)
    return np.where(sign_flips(seed, y.size), -x, x).astype(np.float32)


def check_table(table, bits: int, g: int) -> np.ndarray:
    t = np.asarray(table, dtype=np.int64)
    if not 1 <= bits <= MAX_BITS or not (1 << bits) - 1 <= g <= MAX_GRANULARITY:
        raise ValueError(f"bad THC parameters: bits={bits}, granularity={g}")
    if t.shape != (1 << bits,) or t[0] != 0 or t[-1] != g or (np.diff(t) <= 0).any():
        raise ValueError(f"malformed THC stream: lookup table must go 0 < ... < {g} in {1 << bits} steps")
    return t


def pack_bits(values: np.ndarray, width: int) -> bytes:
    """LSB-first packing of ``width``-bit elements."""
    v = values.astype(np.uint64)
    bits = ((v[:, None] >> np.arange(width, dtype=np.uint64)) & U64(1)).astype(np.uint8).ravel()
    return np.packbits(bits, bitorder="little").tobytes()


def unpack_bits(data: bytes, width: int, count: int) -> tuple[np.ndarray, bool]:
    """(elements, padding_is_zero)."""
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    vals = bits[: count * width].reshape(count, width).astype(np.uint64)
    out = (vals << np.arange(width, dtype=np.uint64)).sum(axis=1, dtype=np.uint64)
    return out, not bits[count * width:].any()


def header(kind, bits, g, width, log2d, count, range_, seed, table) -> bytes:
    return (bytes([MAGIC, VERSION, kind, bits, g, width, log2d, 0])
            + int(count).to_bytes(4, "little") + np.float32(range_).tobytes()
            + int(seed).to_bytes(8, "little") + bytes(int(t) for t in table))


def quantize(r: np.ndarray, range_: float, noise_seed: int, bits: int, g: int, table) -> np.ndarray:
    """Clamp the rotated vector to [-M, M] and draw table indices (unbiased within the range)."""
    t = check_table(table, bits, g)
    M = np.float32(range_)
    d = r.size
    if M == 0:
        return np.zeros(d, dtype=np.int64)
    c = np.minimum(np.maximum(r, -M), M)
    y = (c.astype(np.float64) + float(M)) * (g / (2.0 * float(M)))
    y = np.minimum(y, float(g))
    k = np.minimum(y.astype(np.int64), g - 1)
    zlo = np.searchsorted(t, np.arange(g), side="right") - 1  # last level <= k
    zlo = np.minimum(zlo, t.size - 2)
    z = zlo[k]
    lo, gap = t[z].astype(np.float64), (t[z + 1] - t[z]).astype(np.float64)
    u = (random_words(noise_seed, d) >> U64(40)).astype(np.float64) * 2.0**-24
    return z + (u * gap < y - lo)  # P = (y - lo) / gap; u * gap is exact


def range_ok(M: np.float32, d: int) -> bool:
    """M finite, >= 0 and M * d <= FLT_MAX: then the inverse transform of any payload (rotated
    values at most M, partial sums at most M * d) stays finite (thc_codec.c: range_ok)."""
    return bool(np.isfinite(M) and M >= 0 and float(M) * d <= float(np.finfo(np.float32).max))


def encode(x: np.ndarray, range_: float, rot_seed: int, noise_seed: int, bits: int, g: int, table) -> bytes:
    n = x.size
    if not np.isfinite(x).all():
        raise ValueError("THC input holds a non-finite value")
    M = np.float32(range_)
    d = padded_dim(n)
    if not range_ok(M, d):
        raise ValueError(f"THC range must be finite, >= 0 and at most FLT_MAX / {d}, got {range_}")
    padded = np.zeros(d, dtype=np.float32)
    padded[:n] = x
    r = rht(padded, rot_seed)
    if not np.isfinite(r).all():
        raise ValueError("THC input overflows float32 in the Hadamard transform")
    z = quantize(r, M, noise_seed, bits, g, table)
    return header(KIND_INDEX, bits, g, bits, d.bit_length() - 1, 1, M, rot_seed, table) + pack_bits(z, bits)


def parse(blob: bytes) -> dict:
    """Check a blob's header and total length; return its fields."""
    b = bytes(blob)
    if len(b) >= 1 and b[0] != MAGIC:
        raise ValueError("malformed THC stream: bad magic")
    if len(b) >= 2 and b[1] != VERSION:
        raise ValueError("malformed THC stream: unknown version")
    if len(b) < HEADER_BYTES:
        raise ValueError("malformed THC stream: truncated header")
    kind, bits, g, width, log2d, reserved = b[2], b[3], b[4], b[5], b[6], b[7]
    count = int.from_bytes(b[8:12], "little")
    if kind not in (KIND_INDEX, KIND_SUM) or not 1 <= bits <= MAX_BITS or g < (1 << bits) - 1 \
            or reserved != 0 or log2d > MAX_LOG2_DIM:
        raise ValueError("malformed THC stream: bad header field")
    if kind == KIND_INDEX:
        if width != bits or count != 1:
            raise ValueError("malformed THC stream: index blob with bad width or count")
    elif width not in (8, 16, 32) or count == 0 or count * g > (1 << width) - 1:
        raise ValueError("malformed THC stream: sum blob with bad width or count")
    M = np.frombuffer(b[12:16], dtype=np.float32)[0]
    if not range_ok(M, 1 << log2d):
        raise ValueError("malformed THC stream: range not finite, >= 0 and at most FLT_MAX / d")
    levels = 1 << bits
    if len(b) < HEADER_BYTES + levels:
        raise ValueError("malformed THC stream: truncated table")
    table = check_table(list(b[HEADER_BYTES: HEADER_BYTES + levels]), bits, g)
    d = 1 << log2d
    total = HEADER_BYTES + levels + (d * width + 7) // 8
    if len(b) != total:
        raise ValueError(f"malformed THC stream: {len(b)} bytes, header says {total}")
    return dict(kind=kind, bits=bits, granularity=g, width=width, log2_dim=log2d, dim=d, count=count,
                range=M, seed=int.from_bytes(b[16:24], "little"), table=table,
                payload=b[HEADER_BYTES + levels:])


def sums(info: dict) -> np.ndarray:
    """The payload as integer sums of table values (kind 0: T[z]); checks every element."""
    vals, clean = unpack_bits(info["payload"], info["width"], info["dim"])
    if not clean:
        raise ValueError("malformed THC stream: nonzero padding bits")
    if info["kind"] == KIND_INDEX:
        return info["table"][vals.astype(np.int64)]
    if (vals > info["count"] * info["granularity"]).any():
        raise ValueError("malformed THC stream: a sum exceeds count * granularity")
    return vals.astype(np.int64)


def _checked(blob: bytes, n: int) -> dict:
    info = parse(blob)
    if padded_dim(n) != info["dim"]:
        raise ValueError(f"malformed THC stream: dimension {info['dim']} does not hold {n} values")
    return info


def decode_rotated(blob: bytes, n: int) -> np.ndarray:
    """The mean of the blob's contributions in the rotated domain (padded length d)."""
    info = _checked(blob, n)
    s = sums(info)
    cmax = info["count"] * info["granularity"]
    f = float(info["range"]) / (float(info["granularity"]) * float(info["count"]))
    return ((2 * s - cmax).astype(np.float64) * f).astype(np.float32)


def decode(blob: bytes, n: int) -> np.ndarray:
    info = _checked(blob, n)
    return irht(decode_rotated(blob, n), info["seed"])[:n]


def sum_blobs(blobs, n: int, width: int) -> bytes:
    """The homomorphic sum of index or sum blobs: integer sums of T[z], never decoded."""
    if width not in (8, 16, 32):
        raise ValueError(f"sum width must be 8, 16 or 32, got {width}")
    if not blobs:
        raise ValueError("nothing to sum")
    infos = [_checked(b, n) for b in blobs]
    first = infos[0]
    for info in infos[1:]:
        if (info["bits"], info["granularity"], info["dim"], info["seed"]) != \
                (first["bits"], first["granularity"], first["dim"], first["seed"]) \
                or info["range"].tobytes() != first["range"].tobytes() \
                or not np.array_equal(info["table"], first["table"]):
            raise ValueError("THC blobs to sum differ in parameters, table, dimension, range or seed")
    total = sum(info["count"] for info in infos)
    if total * first["granularity"] > (1 << width) - 1:
        raise ValueError(f"THC sum overflow: {total} contributions x granularity "
                         f"{first['granularity']} exceed {width}-bit elements")
    acc = np.zeros(first["dim"], dtype=np.int64)
    for info in infos:
        acc += sums(info)
    return (header(KIND_SUM, first["bits"], first["granularity"], width, first["log2_dim"], total,
                   first["range"], first["seed"], first["table"])
            + acc.astype({8: "<u1", 16: "<u2", 32: "<u4"}[width]).tobytes())
