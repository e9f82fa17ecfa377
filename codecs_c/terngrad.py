"""TernGrad (docs/spec.md section 4) through its C library, with the numpy reference selectable as
``impl="numpy"``: gradient clipping at ``clip`` standard deviations, a per-tensor scaler,
stochastic ternarization and 2-bit or base-3 packing. The stream layout is in
``codecs_c/terngrad_codec.h`` and docs/codecs.md.

Randomness: each codec owns a counter-based generator (splitmix64) seeded by ``seed``; every
encode of n values consumes ceil(n/2) draws and advances ``draw``. Two codecs with the same seed
and draw produce the same bytes, C or numpy. Workers must use different seeds (the default,
``seed=None``, takes fresh OS entropy) so their rounding noise is independent.

Scaler sharing (``share_scaler=True``): the collective calls ``local_stat(x)`` (this worker's
scaler after clipping), max-reduces it over the workers and hands the result to
``agree(shared, round_no)``; every encode after that uses the agreed scaler until the next
``agree``. The sum of N ternary gradients then has at most 2N+1 levels. The agreed scaler is a
floor: a tensor whose own scaler is larger (a partial sum in a ring) keeps its own, so every
encoding stays unbiased.

The seed and the draw counter are private (``seed``/``draw`` read-only): they differ between
workers by design, so they are not part of the parameters a collective compares across ranks.
"""
from __future__ import annotations

import math
import secrets

import numpy as np

from . import terngrad_reference as ref
from ._cffi_util import decode_blob, error_text
from ._native import ffi, lib
from . import table
from .base import Codec, check_choice, check_count, check_vector

PACKINGS = {"2bit": lib.TG_PACK_2BIT, "base3": lib.TG_PACK_BASE3}
IMPLS = ("auto", "c", "numpy")
_DEFAULTS = table.defaults("terngrad")     # get_codec("terngrad")'s, from its C description
_DEFAULT_PACKING = next(k for k, v in PACKINGS.items() if v == _DEFAULTS.packing)
HEADER_BYTES = lib.TG_HEADER_BYTES


def encoded_size(n: int, packing: str = "2bit") -> int:
    """Exact stream length of n values (12-byte header + payload)."""
    check_choice("packing", packing, PACKINGS)
    return ref.encoded_size(n, packing)


def _error(r: int) -> str:
    return error_text(lib.tg_strerror, r)


class TernGradCodec(Codec):
    """``packing`` "2bit" (16x) or "base3" (5 values a byte, 20x); ``clip`` the clipping factor
    c (values clipped to [-c*sigma, c*sigma]; None or 0 disables); ``share_scaler`` turns on the
    max-agreement of scalers among workers; ``seed`` seeds the stochastic rounding."""

    name = "terngrad"            # traits: its C description (terngrad_codec.c)

    def __init__(self, packing: str = _DEFAULT_PACKING, clip: float | None = _DEFAULTS.clip, share_scaler: bool = False,
                 seed: int | None = None, impl: str = "auto"):
        check_choice("packing", packing, PACKINGS)
        if clip is not None:
            if isinstance(clip, bool) or not isinstance(clip, (int, float, np.integer, np.floating)):
                raise TypeError(f"clip must be a number of standard deviations or None, got {clip!r}")
            if not math.isfinite(clip) or clip < 0:
                raise ValueError(f"clip must be a finite factor >= 0 (0 or None: no clipping), got {clip}")
        if not isinstance(share_scaler, bool):
            raise TypeError(f"share_scaler must be True or False, got {share_scaler!r}")
        if seed is None:
            seed = secrets.randbits(64)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an integer or None, got {seed!r}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2^64), got {seed}")
        check_choice("impl", impl, IMPLS)
        self.packing = packing
        self.clip = float(clip) if clip else 0.0
        self.share_scaler = share_scaler
        self.needs_agreement = share_scaler
        self._seed = int(seed)
        self._draw = 0  # position in the random stream; advanced by every encode
        self.impl = "c" if impl == "auto" else impl
        self._shared: np.float32 | None = None
        self._round_no: int | None = None

    def c_state(self, world: int) -> dict | None:
        """Its C in the engine from this codec's random stream (``c_done`` moves it on), unless
        ``impl="numpy"`` or a shared scaler not agreed yet."""
        if self.impl != "c" or (self.share_scaler and self.agreed_scaler is None):
            return None
        return {"clip": self.clip, "packing": PACKINGS[self.packing], "seed": self.seed, "draw": self.draw % 2**64,
                "shared": self.agreed_scaler if self.share_scaler else -1.0}

    def c_done(self, state) -> None:
        self.skip((int(state.draw) - self.draw) % 2**64)

    def __repr__(self) -> str:
        return (f"TernGradCodec(packing={self.packing!r}, clip={self.clip or None}, "
                f"share_scaler={self.share_scaler}, impl={self.impl!r})")

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def draw(self) -> int:
        """Random draws used so far (each encode of n values takes ceil(n/2))."""
        return self._draw

    def skip(self, draws: int) -> None:
        """Move the random stream on by ``draws``: what encodes made elsewhere (in C, by the ring
        engine, from ``seed`` at ``draw``) took."""
        self._draw += int(draws)

    # --- scaler sharing -----------------------------------------------------------------------
    def scaler(self, x: np.ndarray) -> float:
        """This tensor's scaler: max |x| after clipping."""
        x = check_vector(x)
        if self.impl == "numpy":
            return float(ref.scaler(x, self.clip)[0])
        s, b = ffi.new("float *"), ffi.new("float *")
        r = lib.tg_scaler(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.clip, s, b)
        if r != lib.TG_OK:
            raise ValueError(f"terngrad: {_error(r)}")
        return float(s[0])

    def local_stat(self, x: np.ndarray) -> float:
        return self.scaler(x)

    def agree(self, shared: float, round_no: int) -> None:
        if not self.share_scaler:
            return
        shared = float(shared)
        if not math.isfinite(shared) or shared < 0:
            raise ValueError(f"agreed TernGrad scaler must be finite and >= 0, got {shared}")
        self._shared = np.float32(shared)
        self._round_no = round_no

    @property
    def agreed_scaler(self) -> float | None:
        """The scaler of the last ``agree`` (None before any, or without share_scaler)."""
        return None if self._shared is None else float(self._shared)

    @property
    def round_no(self) -> int | None:
        return self._round_no

    # --- encode / decode ----------------------------------------------------------------------
    def encode(self, x: np.ndarray) -> bytes:
        x = check_vector(x)
        if x.size > lib.TG_MAX_COUNT:
            raise ValueError(f"TernGrad streams hold at most {lib.TG_MAX_COUNT} values, got {x.size}")
        shared = self._shared if self.share_scaler else None
        if self.impl == "numpy":
            blob = ref.encode(x, self.clip, shared, self.packing, self._seed, self._draw)
        else:
            out = np.empty(encoded_size(x.size, self.packing), dtype=np.uint8)
            r = lib.tg_encode(ffi.cast("const float *", ffi.from_buffer(x)), x.size, self.clip,
                              -1.0 if shared is None else float(shared), PACKINGS[self.packing],
                              self._seed, self._draw % 2**64,
                              ffi.cast("uint8_t *", ffi.from_buffer(out, require_writable=True)), out.size)
            if r < 0:
                raise ValueError(f"terngrad encode: {_error(r)}")
            blob = out[:r].tobytes()
        self._draw += ref.draws(x.size)
        return blob

    def encoded_size(self, x: np.ndarray) -> int:
        return encoded_size(check_vector(x).size, self.packing)

    def max_encoded_size(self, n: int) -> int:
        return encoded_size(check_count(n), self.packing)

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        return decode_blob(self.impl, ref.decode, blob, out, lib.tg_decode, lib.tg_strerror, lib.TG_OK, "terngrad")

    def check_count_fits(self, nbytes: int, n: int) -> None:
        sizes = (ref.encoded_size(n, "2bit"), ref.encoded_size(n, "base3"))
        if n > lib.TG_MAX_COUNT or nbytes not in sizes:
            raise ValueError(f"malformed terngrad stream: {n} values take {sizes[0]} (2-bit) or "
                             f"{sizes[1]} (base-3) bytes, got {nbytes}")
