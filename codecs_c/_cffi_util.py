"""Small helpers the cffi wrappers of the C codecs share (terngrad.py, threelc.py, inceptionn.py,
fft.py, thc.py): pointers into numpy/bytes buffers, the library's error text, and the checked
decode of a stream into a float32 array.
"""
from __future__ import annotations

import numpy as np

from ._native import ffi


def error_text(strerror, r: int) -> str:
    """The C library's message for status ``r`` (``strerror`` is e.g. ``lib.tg_strerror``)."""
    return ffi.string(strerror(r)).decode()


def bytes_in(view: memoryview):
    """Read-only pointer to a byte view (NULL when empty)."""
    return ffi.from_buffer(view) if view.nbytes else ffi.NULL


def floats_out(out: np.ndarray):
    """Writable ``float *`` into a float32 array (NULL when empty)."""
    return ffi.cast("float *", ffi.from_buffer(out, require_writable=True)) if out.size else ffi.NULL


def decode_stream(decode, strerror, ok: int, label: str, view: memoryview, out: np.ndarray, *extra) -> np.ndarray:
    """Run ``decode(in, len, out, n, err_at, *extra)`` and raise ValueError naming the status and
    the byte offset when it does not return ``ok``."""
    err_at = ffi.new("size_t *")
    r = decode(ffi.cast("const uint8_t *", bytes_in(view)), view.nbytes, floats_out(out), out.size, err_at, *extra)
    if r != ok:
        raise ValueError(f"malformed {label} stream: {error_text(strerror, r)} at byte {err_at[0]} "
                         f"(stream of {view.nbytes} bytes, {out.size} values)")
    return out


def decode_blob(impl: str, ref_decode, blob, out, decode, strerror, ok: int, label: str) -> np.ndarray:
    """A wrapper's whole ``decode_into``: check the stream and the buffer, then decode with the
    numpy reference (``impl == "numpy"``: ``ref_decode(bytes, n)``) or the C decoder."""
    from .base import check_blob, check_out
    view = check_blob(blob)
    out = check_out(out)
    if impl == "numpy":
        out[:] = ref_decode(bytes(view), out.size)
        return out
    return decode_stream(decode, strerror, ok, label, view, out)
