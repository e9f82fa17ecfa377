"""3LC (docs/spec.md section 5) through its C library, with the numpy reference selectable as
``impl="numpy"``: 3-value quantization with a sparsity multiplier, base-3^5 packing and
zero-run encoding. The stream layout is in ``codecs_c/threelc_codec.h`` and docs/codecs.md.

3LC's per-tensor error accumulation is the shared ``ErrorFeedback`` (memory.py), which the
codec says it wants (``wants_error_feedback``) and does not keep itself:
``memory.encode(codec, x, key)`` quantizes ``A = x + residual[key]`` and stores ``A - M*Q``
back, exactly the spec's ``A += T; ...; A -= M*Q`` with one accumulation buffer per tensor
(``encode_decoded`` hands the memory ``M*Q`` from the same C pass). The codec itself is
stateless.
"""
from __future__ import annotations

import numpy as np

from . import threelc_reference as ref
from ._cffi_util import decode_blob, error_text, floats_out
from ._native import ffi, lib
from . import table
from .base import Codec, check_choice, check_count, check_vector

IMPLS = ("auto", "c", "numpy")
_DEFAULTS = table.defaults("3lc")      # get_codec("3lc")'s, from its C description
HEADER_BYTES = lib.TLC_HEADER_BYTES


def max_encoded_size(n: int) -> int:
    """Largest stream n values can take: 12-byte header + ceil(n/5) (no zero run at all)."""
    return HEADER_BYTES + -(-n // 5)


def min_encoded_size(n: int) -> int:
    """Smallest stream n values can take with ZRE: every base-3^5 byte in runs of 14."""
    base3_bytes = -(-n // 5)
    return HEADER_BYTES + -(-base3_bytes // lib.TLC_MAX_RUN)


def _error(r: int) -> str:
    return error_text(lib.tlc_strerror, r)


class ThreeLCCodec(Codec):
    """``sparsity`` the multiplier s in [1, 2) (1.0 keeps max|A|; 1.5, 1.75, 1.9 in the paper);
    ``zre`` zero-run encoding on/off."""

    name = "3lc"                 # traits: its C description (threelc_codec.c)

    def __init__(self, sparsity: float = float(_DEFAULTS.sparsity), zre: bool = bool(_DEFAULTS.zre),
                 impl: str = "auto"):
        if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.integer, np.floating)):
            raise TypeError(f"sparsity must be a number in [1, 2), got {sparsity!r}")
        self.sparsity = float(ref.check_sparsity(sparsity))  # as float32, the value C uses
        if not isinstance(zre, bool):
            raise TypeError(f"zre must be True or False, got {zre!r}")
        check_choice("impl", impl, IMPLS)
        self.zre = zre
        self.impl = "c" if impl == "auto" else impl

    def c_state(self, world: int) -> dict | None:
        return {"sparsity": self.sparsity, "zre": int(self.zre)} if self.impl == "c" else None

    def __repr__(self) -> str:
        return f"ThreeLCCodec(sparsity={self.sparsity}, zre={self.zre}, impl={self.impl!r})"

    def _quantize(self, x: np.ndarray, recon: bool = True) -> tuple[bytes, np.ndarray | None]:
        """(stream, M*Q): the bytes for x and exactly what a receiver decodes from them (None
        when ``recon`` is off: the C library then skips writing them)."""
        if x.size > lib.TLC_MAX_COUNT:
            raise ValueError(f"3LC streams hold at most {lib.TLC_MAX_COUNT} values, got {x.size}")
        if self.impl == "numpy":
            m, q = ref.quantize(x, self.sparsity)
            return ref.encode_quantized(m, q, self.zre), ref.dequantize(m, q)
        out = np.empty(max_encoded_size(x.size), dtype=np.uint8)
        rec = np.empty(x.size, dtype=np.float32) if recon else None
        r = lib.tlc_encode(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.sparsity,
                           int(self.zre), ffi.cast("uint8_t *", ffi.from_buffer(out, require_writable=True)),
                           out.size, floats_out(rec) if recon else ffi.NULL)
        if r < 0:
            raise ValueError(f"3lc encode: {_error(r)}")
        return out[:r].tobytes(), rec

    def encode(self, x: np.ndarray) -> bytes:
        return self._quantize(check_vector(x), recon=False)[0]

    def encode_decoded(self, x: np.ndarray) -> tuple[bytes, np.ndarray]:
        """The stream and ``M*Q`` (what a receiver decodes) from one C pass."""
        return self._quantize(check_vector(x))

    def encoded_size(self, x: np.ndarray) -> int:
        """Bytes of the stateless ``encode(x)`` (zero runs depend on the data: quantizes)."""
        return len(self._quantize(check_vector(x), recon=False)[0])

    def max_encoded_size(self, n: int) -> int:
        return max_encoded_size(check_count(n))

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        return decode_blob(self.impl, ref.decode, blob, out, lib.tlc_decode, lib.tlc_strerror, lib.TLC_OK, "3lc")

    def check_count_fits(self, nbytes: int, n: int) -> None:
        if n > lib.TLC_MAX_COUNT or not min_encoded_size(n) <= nbytes <= max_encoded_size(n):
            raise ValueError(f"malformed 3lc stream: {n} values take {min_encoded_size(n)} to "
                             f"{max_encoded_size(n)} bytes, got {nbytes}")
