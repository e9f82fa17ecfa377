"""The INCEPTIONN codec (docs/spec.md section 1) through its C library, with the numpy reference
selectable as ``impl="numpy"`` so every path shares one API."""
from __future__ import annotations

import numpy as np

from . import inceptionn_reference as ref
from ._cffi_util import decode_stream, error_text
from ._native import ffi, lib
from . import table
from .base import Codec, check_blob, check_choice, check_count, check_out, check_vector

IMPLS = {"auto": lib.INC_IMPL_AUTO, "scalar": lib.INC_IMPL_SCALAR, "avx2": lib.INC_IMPL_AVX2, "numpy": None}
TIER_NAMES = ("0bit", "8bit", "16bit", "32bit")
TIER_BITS = np.array([0, 8, 16, 32])


def have_avx2() -> bool:
    return bool(lib.inc_have_avx2())


def max_encoded_size(n: int) -> int:
    return int(lib.inc_max_encoded_size(n))


class InceptionnCodec(Codec):
    """Error bound 2^error_bound, error_bound a negative integer (the paper uses -10, -8, -6)."""

    name = "inceptionn"          # traits: its C description (inceptionn_codec.c)

    def __init__(self, error_bound: int = table.defaults("inceptionn").error_bound, impl: str = "auto"):
        if isinstance(error_bound, bool) or not isinstance(error_bound, (int, np.integer)):
            raise TypeError(f"error_bound must be an integer exponent such as -10, got {error_bound!r}")
        if not lib.INC_MIN_ERROR_BOUND <= error_bound <= lib.INC_MAX_ERROR_BOUND:
            raise ValueError(f"error_bound must be between {lib.INC_MIN_ERROR_BOUND} and "
                             f"{lib.INC_MAX_ERROR_BOUND} (the bound is 2^error_bound), got {error_bound}")
        check_choice("impl", impl, IMPLS)
        if impl == "avx2" and not have_avx2():
            raise ValueError("impl='avx2' requested but this CPU has no AVX2")
        self.error_bound = int(error_bound)
        self.impl = ("avx2" if have_avx2() else "scalar") if impl == "auto" else impl
        self._impl_code = IMPLS[self.impl]

    def c_state(self, world: int) -> dict:
        return {"error_bound": self.error_bound}

    def __repr__(self) -> str:
        return f"InceptionnCodec(error_bound={self.error_bound}, impl={self.impl!r})"

    def encode(self, x: np.ndarray) -> bytes:
        x = check_vector(x)
        if self.impl == "numpy":
            return ref.encode(x, self.error_bound)
        out = np.empty(max_encoded_size(x.size), dtype=np.uint8)
        return out[: self.encode_into(x, out)].tobytes()

    def encode_into(self, x: np.ndarray, out) -> int:
        """Encode into the caller's writable byte buffer; returns the bytes written.
        A buffer of ``max_encoded_size(x.size)`` bytes always suffices."""
        x = check_vector(x)
        if self.impl == "numpy":
            blob = ref.encode(x, self.error_bound)
            view = memoryview(out).cast("B")
            if len(blob) > view.nbytes:
                raise ValueError(f"output buffer of {view.nbytes} bytes is too small for {len(blob)} bytes")
            view[: len(blob)] = blob
            return len(blob)
        dst = ffi.from_buffer(out, require_writable=True)
        r = lib.inc_encode(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.error_bound,
                           ffi.cast("uint8_t *", dst), len(dst), self._impl_code)
        if r == lib.INC_E_SPACE:
            raise ValueError(f"output buffer of {len(dst)} bytes is too small "
                             f"(max_encoded_size({x.size}) = {max_encoded_size(x.size)})")
        if r < 0:
            raise RuntimeError(f"inceptionn encode failed: {error_text(lib.inc_strerror, r)}")
        return int(r)

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        view = check_blob(blob)
        out = check_out(out)
        if self.impl == "numpy":
            out[:] = ref.decode(bytes(view), out.size)
            return out
        return decode_stream(lib.inc_decode, lib.inc_strerror, lib.INC_OK, "inceptionn", view, out,
                             self._impl_code)

    def check_count_fits(self, nbytes: int, n: int) -> None:
        groups = -(-n // 8)
        if not 2 * groups <= nbytes <= lib.INC_MAX_GROUP_BYTES * groups:
            raise ValueError(f"malformed inceptionn stream: {n} values take {2 * groups} to "
                             f"{lib.INC_MAX_GROUP_BYTES * groups} bytes, got {nbytes}")

    def reconstruct(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """What a receiver decodes for ``x``, value by value, with +0.0 for every zero (so that
        ``reconstruct(reconstruct(x)) == reconstruct(x)``); one C pass, no stream built.
        ``out`` may be ``x`` (in place)."""
        x = check_vector(x)
        out = np.empty_like(x) if out is None else check_out(out)
        if out.size != x.size:
            raise ValueError(f"output holds {out.size} values, input {x.size}")
        if self.impl == "numpy":
            return super().reconstruct(x, out)
        lib.inc_reconstruct(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.error_bound,
                            ffi.cast("float *", ffi.from_buffer(out)))
        return out

    def histogram(self, x: np.ndarray) -> np.ndarray:
        """Values per tier [0BIT, 8BIT, 16BIT, NO_COMPRESS]: the paper's bitwidth distribution."""
        x = check_vector(x)
        if self.impl == "numpy":
            return np.bincount(ref.tiers(x, self.error_bound), minlength=4).astype(np.int64)
        counts = ffi.new("uint64_t[4]")
        lib.inc_histogram(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.error_bound, counts)
        return np.array(list(counts), dtype=np.int64)

    def max_encoded_size(self, n: int) -> int:
        return max_encoded_size(check_count(n))

    def encoded_size(self, x: np.ndarray) -> int:
        """Bytes ``encode(x)`` would produce, without producing them."""
        x = check_vector(x)
        return int(lib.inc_encoded_size(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.error_bound))
