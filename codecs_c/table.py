"""The C codec table (codec_table.h, listed in codec_list.h) as Python reads it: each codec's
traits, defaults and what its C runs, described once in its C file. ``base.Codec`` takes a
codec's traits from here; a codec of the table without a Python class of its own runs as
``TableCodec``, its C called through cffi."""
from __future__ import annotations

import functools

import numpy as np

from ._native import ffi, lib
from .base import Codec, check_blob, check_count, check_out, check_vector

# what the Python side reads of a description: base.Codec's traits and what the C runs
RUNS = ("app", "nic", "summed")


def names() -> list[str]:
    """Every codec of the table, in codec_list.h's order."""
    out, i = [], 0
    while lib.re_codecs[i] != ffi.NULL:
        out.append(ffi.string(lib.re_codecs[i].name).decode())
        i += 1
    return out


def description(name: str):
    """The codec's struct re_codec_desc, or None when the table has no codec of that name."""
    d = lib.re_codec_named(name.encode())
    return None if d == ffi.NULL else d


def traits(name: str) -> dict[str, bool]:
    """The traits (base.Codec.TRAITS) and what the C runs (RUNS, as c_app, c_nic, c_summed) of a
    codec of the table."""
    d = description(name)
    return {**{t: bool(getattr(d, t)) for t in Codec.TRAITS}, **{f"c_{t}": bool(getattr(d, t)) for t in RUNS}}


def defaults(name: str):
    """The codec's state at get_codec(name)'s defaults (a struct of its state_type), or None."""
    d = description(name)
    if d is None or d.state_type == ffi.NULL:
        return None
    return ffi.cast(ffi.string(d.state_type).decode() + " *", d.defaults)


class TableCodec(Codec):
    """A codec of the C table that has no Python class: its ring codec (the description's make, at
    its defaults) called through cffi. Subclassed per name by ``codec_class``."""

    def __init__(self):
        d = description(self.name)
        if d.make == ffi.NULL:
            raise ValueError(f"codec {self.name!r} has no C ring codec to run")
        self._state = ffi.new("char[]", max(int(d.state_size), 1))
        if d.state_size:
            ffi.memmove(self._state, d.defaults, d.state_size)
        self._c = ffi.new("struct re_codec *")
        d.make(self._c, self._state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def _error(self, status: int) -> str:
        return ffi.string(self._c.strerror(status)).decode() if self._c.strerror != ffi.NULL else f"status {status}"

    def max_encoded_size(self, n: int) -> int:
        return int(self._c.max_encoded_size(self._c, check_count(n)))

    def encode(self, x: np.ndarray) -> bytes:
        x = check_vector(x)
        cap = self.max_encoded_size(x.size)
        out = ffi.new("uint8_t[]", max(cap, 1))
        got = self._c.encode(self._c, ffi.cast("const float *", ffi.from_buffer(x)), x.size, out, cap)
        if got < 0:
            raise ValueError(f"{self.name}: {self._error(got)}")
        return ffi.buffer(out, got)[:]

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        view, out = check_blob(blob), check_out(out)
        st = self._c.decode(self._c, ffi.from_buffer(view) if view.nbytes else ffi.NULL, view.nbytes,
                            ffi.cast("float *", ffi.from_buffer(out, require_writable=True)), out.size)
        if st:
            raise ValueError(f"{self.name} stream: {self._error(st)}")
        return out

    def reconstruct(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if self._c.reconstruct == ffi.NULL:
            return super().reconstruct(x, out)
        x = check_vector(x)
        out = np.empty_like(x) if out is None else check_out(out)
        self._c.reconstruct(self._c, ffi.cast("const float *", ffi.from_buffer(x)), x.size,
                            ffi.cast("float *", ffi.from_buffer(out, require_writable=True)))
        return out

    def c_state(self, world: int) -> dict:
        return {}


@functools.cache
def codec_class(name: str) -> type[Codec]:
    """A TableCodec of that name (base.Codec reads its traits from the table)."""
    return type(f"TableCodec_{name}", (TableCodec,), {"name": name})
