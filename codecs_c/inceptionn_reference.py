"""A numpy reference of the INCEPTIONN codec, written straight from docs/spec.md section 1.

It uses the spec's own bit formulas (shift of the 24-bit significand, bit-length on decode) and
no float tricks, so differential tests against the C paths check two independent readings of
the spec. It favours clarity over speed.
"""
from __future__ import annotations

import numpy as np

LANES = 8
LANE_BYTES = np.array([0, 1, 2, 4], dtype=np.int64)
TAG_0BIT, TAG_8BIT, TAG_16BIT, TAG_NO_COMPRESS = 0, 1, 2, 3


def thresholds(k: int) -> tuple[int, int]:
    """(Eb, mid) of docs/spec.md: Eb = 127 + k, mid = Eb + ceil((127 - Eb) / 2)."""
    eb = 127 + k
    mid = eb + -(-(127 - eb) // 2)
    return eb, mid


def tiers(x: np.ndarray, k: int) -> np.ndarray:
    bits = x.view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int64)
    eb, mid = thresholds(k)
    return np.where(e >= 127, TAG_NO_COMPRESS,
                    np.where(e < eb, TAG_0BIT, np.where(e >= mid, TAG_16BIT, TAG_8BIT)))


def encode(x: np.ndarray, k: int) -> bytes:
    n = x.size
    if n == 0:
        return b""
    bits = x.view(np.uint32).astype(np.uint64)
    t = tiers(x, k)
    s = bits >> 31
    e = ((bits >> 23) & 0xFF).astype(np.int64)
    shift = np.clip(127 - e, 0, 63).astype(np.uint64)  # only used where 1 <= 127-e <= 30
    fixed = ((1 << 23) | (bits & 0x7FFFFF)) >> shift
    p8 = (s << 7) | ((fixed >> 16) & 0x7F)
    p16 = (s << 15) | ((fixed >> 8) & 0x7FFF)

    groups = -(-n // LANES)
    tg = np.zeros(groups * LANES, dtype=np.int64)
    tg[:n] = t
    tg = tg.reshape(groups, LANES)
    keys = (tg << (2 * np.arange(LANES))).sum(axis=1)
    lens = LANE_BYTES[tg]
    group_len = 2 + lens.sum(axis=1)
    group_start = np.concatenate([[0], np.cumsum(group_len)[:-1]]).astype(np.int64)
    lane_off = 2 + np.concatenate([np.zeros((groups, 1), np.int64), np.cumsum(lens, axis=1)[:, :-1]], axis=1)
    off = (group_start[:, None] + lane_off).ravel()[:n]

    out = np.zeros(int(group_len.sum()), dtype=np.uint8)
    out[group_start] = keys & 0xFF
    out[group_start + 1] = keys >> 8
    for tag, payload, nbytes in ((TAG_8BIT, p8, 1), (TAG_16BIT, p16, 2), (TAG_NO_COMPRESS, bits, 4)):
        sel = t == tag
        for b in range(nbytes):
            out[off[sel] + b] = (payload[sel] >> (8 * b)) & 0xFF
    return out.tobytes()


def _decode_field(s: np.ndarray, f: np.ndarray, w: int) -> np.ndarray:
    f = f.astype(np.int64)
    bitlen = np.zeros_like(f)
    nz = f > 0
    bitlen[nz] = np.floor(np.log2(f[nz])).astype(np.int64) + 1
    nshift = w + 1 - bitlen
    e = 127 - nshift
    mant = ((f << np.where(nz, nshift, 0)) & ((1 << w) - 1)) << (23 - w)
    bits = (s.astype(np.int64) << 31) | np.where(nz, (e << 23) | mant, 0)
    return bits.astype(np.uint32)


def decode(blob: bytes, n: int) -> np.ndarray:
    data = np.frombuffer(blob, dtype=np.uint8)
    groups = -(-n // LANES)
    if groups > data.size // 2:  # every group has a 2-byte tag word
        raise ValueError(f"stream ends inside a group ({n} values need at least {2 * groups} bytes, got {data.size})")
    pos = 0
    tags = np.zeros((groups, LANES), dtype=np.int64)
    starts = np.zeros(groups, dtype=np.int64)
    for g in range(groups):
        if data.size - pos < 2:
            raise ValueError(f"stream ends inside a group (group {g}, byte {pos})")
        key = int(data[pos]) | (int(data[pos + 1]) << 8)
        tg = [(key >> (2 * j)) & 3 for j in range(LANES)]
        lanes = min(LANES, n - g * LANES)
        if any(tg[j] != 0 for j in range(lanes, LANES)):
            raise ValueError(f"a lane past the value count is not 0BIT (group {g}, byte {pos})")
        glen = 2 + sum(int(LANE_BYTES[x]) for x in tg)
        if data.size - pos < glen:
            raise ValueError(f"stream ends inside a group (group {g}, byte {pos})")
        tags[g] = tg
        starts[g] = pos
        pos += glen
    if pos != data.size:
        raise ValueError(f"bytes left after the last group (byte {pos} of {data.size})")

    lens = LANE_BYTES[tags]
    lane_off = 2 + np.concatenate([np.zeros((groups, 1), np.int64), np.cumsum(lens, axis=1)[:, :-1]], axis=1)
    off = (starts[:, None] + lane_off).ravel()[:n]
    t = tags.ravel()[:n]
    out = np.zeros(n, dtype=np.uint32)
    d = data.astype(np.uint32)
    sel = t == TAG_8BIT
    v = d[off[sel]]
    out[sel] = _decode_field(v >> 7, v & 0x7F, 7)
    sel = t == TAG_16BIT
    v = d[off[sel]] | (d[off[sel] + 1] << 8)
    out[sel] = _decode_field(v >> 15, v & 0x7FFF, 15)
    sel = t == TAG_NO_COMPRESS
    o = off[sel]
    out[sel] = d[o] | (d[o + 1] << 8) | (d[o + 2] << 16) | (d[o + 3] << 24)
    return out.view(np.float32)
