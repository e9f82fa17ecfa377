"""Per-block power-of-two scaling of the ring's wire (codecs_c/blockscale_codec.h; the format in
docs/collectives.md, "Wire format v2"), through the C library the MPI library also links, so both
rings produce the same bits."""
from __future__ import annotations

import numpy as np

from ._cffi_util import error_text
from ._native import ffi, lib

BLOCK_VALUES = int(lib.BS_BLOCK_VALUES)
MARK_BASE = int(lib.BS_MARK_BASE)
MIN_SHIFT, MAX_SHIFT = int(lib.BS_MIN_SHIFT), int(lib.BS_MAX_SHIFT)
HEADROOM, MAX_HEADROOM = int(lib.BS_HEADROOM), int(lib.BS_MAX_HEADROOM)


def wire_values(n: int, block: int = BLOCK_VALUES) -> int:
    """Floats on the wire for ``n`` values: one exponent per block plus the values."""
    if not 1 <= block <= lib.BS_MAX_BLOCK:
        raise ValueError(f"block must be 1..{lib.BS_MAX_BLOCK}, got {block}")
    return int(lib.bs_wire_values(n, block))


def _fp(a: np.ndarray):
    return ffi.cast("float *", ffi.from_buffer(a)) if a.size else ffi.NULL


class BlockScale:
    """The wire transform for codec error bound ``k`` (the inceptionn codec's ``error_bound``);
    ``headroom`` h puts each scaled block's max in [2^(-1-h), 2^-h) (the decoder needs no h)."""

    def __init__(self, k: int, block: int = BLOCK_VALUES, headroom: int = HEADROOM):
        wire_values(0, block)
        if not 0 <= headroom <= MAX_HEADROOM:
            raise ValueError(f"headroom must be 0..{MAX_HEADROOM}, got {headroom}")
        self.k, self.block, self.headroom = int(k), int(block), int(headroom)

    def wire_values(self, n: int) -> int:
        return int(lib.bs_wire_values(n, self.block))

    def encode(self, x: np.ndarray, decoded: np.ndarray | None = None) -> np.ndarray:
        """The wire floats for ``x`` (float32, contiguous); ``decoded`` (may be ``x``) gets what a
        receiver decodes from them."""
        wire = np.empty(self.wire_values(x.size), dtype=np.float32)
        r = lib.bs_encode_h(_fp(x), x.size, self.block, self.k, self.headroom, _fp(wire), wire.size,
                          _fp(decoded) if decoded is not None else ffi.NULL)
        if r < 0:
            raise ValueError(f"block scaling failed: {error_text(lib.bs_strerror, r)}")
        return wire

    def decode_into(self, wire: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` = the values the wire floats carry; ValueError for a wire the encoder cannot
        have produced for ``out.size`` values."""
        err_at = ffi.new("size_t *")
        r = lib.bs_decode(_fp(wire), wire.size, _fp(out), out.size, self.block, err_at)
        if r != lib.BS_OK:
            raise ValueError(f"malformed ring block from the left neighbour: {error_text(lib.bs_strerror, r)} "
                             f"(wire float {err_at[0]} of {wire.size}, {out.size} values)")
        return out
