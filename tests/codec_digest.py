"""What every codec puts on the wire and decodes for one input, as digests: the same function runs
in the test process and, as a script, in a child whose numpy, OpenBLAS and C codecs are held to
their portable paths (tests/test_codec_portability.py), and the two must agree bit for bit.

    python tests/codec_digest.py INPUT.npy   -> JSON {case: sha256 of the bytes or float32 bits}
"""
from __future__ import annotations

import hashlib
import json
import sys

import numpy as np


def _h(b) -> str:
    return hashlib.sha256(bytes(b) if not isinstance(b, np.ndarray) else b.tobytes()).hexdigest()[:32]


def digests(x: np.ndarray) -> dict[str, str]:
    from inceptionn.codecs import get_codec
    from inceptionn.collective import scaling

    x = np.ascontiguousarray(x, dtype=np.float32)
    out: dict[str, str] = {}

    def case(name: str, codec, y=x) -> None:
        blob = codec.encode(y)
        out[f"{name} encode"] = _h(blob)
        out[f"{name} decode"] = _h(codec.decode(blob, y.size))

    # the collective scales buckets with exponents every rank derives from the same maxima
    y, exps = scaling.scaled_copy(x, 4)
    out["scaling exponents"] = _h(exps.astype(np.int64))
    for impl in ("auto", "scalar", "numpy"):
        for k in (-10, -6):
            c = get_codec("inceptionn", error_bound=k, impl=impl)
            case(f"inceptionn {impl} k={k}", c, y)
            out[f"inceptionn {impl} k={k} reconstruct"] = _h(c.reconstruct(y))
    for impl in ("auto", "numpy"):
        for packing in ("2bit", "base3"):
            case(f"terngrad {impl} {packing}", get_codec("terngrad", packing=packing, seed=7, impl=impl))
        for sparsity in (1.0, 1.5):
            case(f"3lc {impl} s={sparsity}", get_codec("3lc", sparsity=sparsity, impl=impl))
    for impl in ("c", "numpy"):
        for bits in (2, 4):
            cs = [get_codec("thc", bits=bits, seed=11, noise_seed=5 + w, error_feedback=False, impl=impl)
                  for w in range(2)]
            parts = (x, x[::-1].copy())
            shared = max(c.local_stat(v) for c, v in zip(cs, parts))
            for c in cs:
                c.agree(shared, 3)
            blobs = [c.encode(v) for c, v in zip(cs, parts)]
            out[f"thc {impl} b={bits} norm"] = _h(np.float64(shared))
            out[f"thc {impl} b={bits} encode"] = _h(b"".join(blobs))
            out[f"thc {impl} b={bits} decode"] = _h(cs[0].decode(blobs[0], x.size))
            summed = cs[0].sum_encoded(blobs, x.size)
            out[f"thc {impl} b={bits} sum"] = _h(summed)
            out[f"thc {impl} b={bits} decode_sum"] = _h(cs[0].decode_sum(summed, x.size, 2))
        case(f"fft {impl}", get_codec("fft", theta=0.85, bits=10, impl=impl))
    return out


if __name__ == "__main__":
    json.dump(digests(np.load(sys.argv[1])), sys.stdout, indent=1, sort_keys=True)
