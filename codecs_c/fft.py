"""FFT sparsification with a range-based N-bit float (docs/spec.md section 7).

encode: ``numpy.fft.rfft`` of the gradient zero-padded to the next 5-smooth length L (a
real-to-complex FFT; written in C it would be a mixed-radix FFT, which numpy's pocketfft already
is), then in C: keep the top ``1 - theta`` fraction of the ``K = L/2 + 1`` frequency components
by magnitude, a bitmap of the
kept positions, the real and imaginary parts quantized separately to the N-bit range-based float
with ``eps`` and mantissa bits ``m`` chosen per blob so the codes cover the kept values. decode:
the checked C parser rebuilds the sparse spectrum, ``numpy.fft.irfft`` inverts it. Every byte
that arrives from the network is read by C with bounds checks; numpy only sees a spectrum.

``impl="numpy"`` runs the numpy reference from the spectrum on (same bytes).
"""
from __future__ import annotations

import math
import numpy as np

from . import fft_reference as ref
from ._cffi_util import bytes_in, error_text
from ._native import ffi, lib
from .base import Codec, check_blob, check_choice, check_count, check_out, check_vector
from .memory import check_switch

IMPLS = ("c", "numpy")


def theta_for_lr(theta0: float, lr: float, lr0: float) -> float:
    """Theorem 3.5 of the paper: ``theta^2`` proportional to the learning rate, so
    ``theta = theta0 * sqrt(lr / lr0)`` (clipped to [0, 1])."""
    if not 0.0 <= theta0 <= 1.0:
        raise ValueError(f"theta0 must be in [0, 1], got {theta0}")
    if not (lr0 > 0 and lr >= 0 and math.isfinite(lr) and math.isfinite(lr0)):
        raise ValueError(f"learning rates must be finite with lr >= 0 and lr0 > 0, got lr={lr}, lr0={lr0}")
    return min(1.0, max(0.0, theta0 * math.sqrt(lr / lr0)))


class ThetaSchedule:
    """Diminishing drop ratio theta as a function of the learning rate.

    ``mode="sqrt"``: theta = theta0 * sqrt(lr / lr0) (theta^2 proportional to lr, Theorem 3.5).
    ``mode="drop"``: theta0 while lr >= lr0, then 0 (the paper's experiment: theta goes from
    0.9 to 0 at the learning-rate drop, which restores the uncompressed accuracy).
    """

    def __init__(self, theta0: float = 0.85, lr0: float = 0.1, mode: str = "sqrt"):
        if mode not in ("sqrt", "drop"):
            raise ValueError(f"mode must be 'sqrt' or 'drop', got {mode!r}")
        theta_for_lr(theta0, lr0, lr0)  # validates
        self.theta0, self.lr0, self.mode = float(theta0), float(lr0), mode

    def __call__(self, lr: float) -> float:
        if self.mode == "sqrt":
            return theta_for_lr(self.theta0, lr, self.lr0)
        if not (lr >= 0 and math.isfinite(lr)):
            raise ValueError(f"learning rate must be finite and >= 0, got {lr}")
        return self.theta0 if lr >= self.lr0 else 0.0

    def __repr__(self) -> str:
        return f"ThetaSchedule(theta0={self.theta0}, lr0={self.lr0}, mode={self.mode!r})"


def _check_theta(theta) -> float:
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.floating)) or not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta (the fraction of frequency components dropped) must be in [0, 1], got {theta!r}")
    return float(theta)


class FFTCodec(Codec):
    """Drop ratio ``theta`` (keep the top 1 - theta of the components), ``bits``-bit range
    float (paper: theta 0.85, N = 10). ``mantissa_bits=None`` picks m per blob."""

    name = "fft"                 # traits: its C description (fft_codec.c)

    def __init__(self, theta: float = 0.85, bits: int = 10, mantissa_bits: int | None = None,
                 error_feedback: bool = False, impl: str = "c"):
        self.theta = _check_theta(theta)
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
            raise TypeError(f"bits must be an integer, got {bits!r}")
        if not lib.FFT_MIN_BITS <= bits <= lib.FFT_MAX_BITS:
            raise ValueError(f"bits must be in {lib.FFT_MIN_BITS}..{lib.FFT_MAX_BITS}, got {bits}")
        self.bits = int(bits)
        if mantissa_bits is not None:
            if isinstance(mantissa_bits, bool) or not isinstance(mantissa_bits, (int, np.integer)):
                raise TypeError(f"mantissa_bits must be an integer or None, got {mantissa_bits!r}")
            if not 0 <= mantissa_bits <= lib.FFT_MAX_MANTISSA:
                raise ValueError(f"mantissa_bits must be in 0..{lib.FFT_MAX_MANTISSA}, got {mantissa_bits}")
            mantissa_bits = int(mantissa_bits)
            if (1 << (self.bits - 1)) - 1 >= 255 << mantissa_bits:
                raise ValueError(f"{self.bits}-bit codes with mantissa_bits={mantissa_bits} would run past "
                                 f"float's exponent range: use more mantissa bits")
        self.mantissa_bits = mantissa_bits
        self.wants_error_feedback = check_switch("error_feedback", error_feedback)
        check_choice("impl", impl, IMPLS)
        self.impl = impl

    def __repr__(self) -> str:
        return (f"FFTCodec(theta={self.theta}, bits={self.bits}, mantissa_bits={self.mantissa_bits}, "
                f"error_feedback={self.wants_error_feedback}, impl={self.impl!r})")

    def set_theta(self, theta: float) -> None:
        """Change the drop ratio (e.g. from a ThetaSchedule once per epoch)."""
        self.theta = _check_theta(theta)

    def kept(self, n: int) -> int:
        """Components kept for n values: K - floor(theta * K), K = fft_length(n)/2 + 1."""
        return ref.kept_count(check_count(n), self.theta)

    def encoded_size(self, x: np.ndarray) -> int:
        """Bytes of a blob for x (header, bitmap and codes; only the length counts)."""
        return self.max_encoded_size(check_vector(x).size)

    def max_encoded_size(self, n: int) -> int:
        return ref.encoded_size(check_count(n), self.kept(n), self.bits)

    # --- encode / decode ----------------------------------------------------------------------
    def encode(self, x: np.ndarray) -> bytes:
        x = check_vector(x)
        if x.size > ref.MAX_N:
            raise ValueError(f"FFT codec handles at most {ref.MAX_N} values, got {x.size}")
        return self.encode_spectrum(ref.spectrum(x), x.size)

    def encode_spectrum(self, spec: np.ndarray, n: int) -> bytes:
        """Sparsify and quantize a given spectrum (complex64, ``rfft(x, fft_length(n))``)."""
        n = check_count(n)
        spec = np.ascontiguousarray(spec, dtype=np.complex64)
        if spec.ndim != 1 or spec.size != ref.bins(n):
            raise ValueError(f"a spectrum of {n} values has {ref.bins(n)} bins, got shape {spec.shape}")
        if not np.isfinite(spec.view(np.float32)).all():
            raise ValueError("FFT input holds a non-finite value (its spectrum is not finite)")
        k = ref.kept_count(n, self.theta)
        if self.impl == "numpy":
            return ref.encode_spectrum(spec, n, k, self.bits, self.mantissa_bits)
        out = np.empty(ref.encoded_size(n, k, self.bits), dtype=np.uint8)
        src = ffi.cast("const float *", ffi.from_buffer(spec)) if spec.size else ffi.NULL
        m = lib.FFT_AUTO_MANTISSA if self.mantissa_bits is None else self.mantissa_bits
        r = lib.fft_encode(src, n, k, self.bits, m, ffi.cast("uint8_t *", ffi.from_buffer(out)), out.size)
        if r == lib.FFT_E_ARG and self.mantissa_bits is not None:
            raise ValueError(f"mantissa_bits={self.mantissa_bits} leaves no valid range for {self.bits}-bit codes")
        if r < 0:
            raise RuntimeError(f"fft encode failed: {error_text(lib.fft_strerror, r)}")
        return out.tobytes()

    def decode_spectrum(self, blob, n: int) -> np.ndarray:
        """The sparse spectrum a blob holds (complex64, K bins), checked byte by byte."""
        view = check_blob(blob)
        n = check_count(n)
        self.check_count_fits(view.nbytes, n)
        if self.impl == "numpy":
            return ref.decode_spectrum(bytes(view), n)
        spec = np.empty(ref.bins(n), dtype=np.complex64)
        err_at = ffi.new("size_t *")
        r = lib.fft_decode(bytes_in(view), view.nbytes, n,
                           ffi.cast("float *", ffi.from_buffer(spec)) if spec.size else ffi.NULL, err_at)
        if r != lib.FFT_OK:
            raise ValueError(f"malformed FFT stream: {error_text(lib.fft_strerror, r)} at byte {err_at[0]} "
                             f"(stream of {view.nbytes} bytes, {n} values)")
        return spec

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        out = check_out(out)
        out[:] = ref.inverse(self.decode_spectrum(blob, out.size), out.size)
        return out

    def check_count_fits(self, nbytes: int, n: int) -> None:
        if n > ref.MAX_N:
            raise ValueError(f"malformed FFT stream: the format holds at most {ref.MAX_N} values, got {n}")
        lo = ref.HEADER_BYTES + (ref.bins(n) + 7) // 8  # nothing kept
        hi = ref.encoded_size(n, ref.bins(n), ref.MAX_BITS)
        if not lo <= nbytes <= hi:
            raise ValueError(f"malformed FFT stream: {n} values take {lo} to {hi} bytes, got {nbytes}")

    def info(self, blob) -> dict:
        """Header fields of a checked blob: bits, mantissa, eps, n, k, bins."""
        view = check_blob(blob)
        c = ffi.new("struct fft_info *")
        r = lib.fft_inspect(bytes_in(view), view.nbytes, c)
        if r != lib.FFT_OK:
            raise ValueError(f"malformed FFT stream: {error_text(lib.fft_strerror, r)}")
        return dict(bits=c.bits, mantissa=c.mantissa, eps=float(c.eps), n=c.n, k=c.k, bins=c.bins)


def range_float_roundtrip(v: np.ndarray, bits: int = 10, mantissa: int = 6, max_abs: float | None = None,
                          eps: float | None = None) -> np.ndarray:
    """The range-based float alone (C): quantize float32 values and decode them back. The codes
    start at ``eps`` if given (the paper's Algorithm 1), else they end at ``max_abs`` (default:
    the largest |v|), as the codec does."""
    v = check_vector(v)
    if eps is not None:
        pbase = int(np.float32(eps).view(np.uint32)) >> (23 - mantissa)
    else:
        if max_abs is None:
            max_abs = float(np.abs(v).max()) if v.size else 0.0
        pbase = lib.fft_rf_pbase(float(np.float32(max_abs)), bits, mantissa)
    if pbase == 0 or not ref.pbase_ok(pbase, bits, mantissa):
        raise ValueError(f"no valid range for bits={bits}, mantissa={mantissa}, max_abs={max_abs}, eps={eps}")
    codes = np.empty(v.size, dtype=np.uint16)
    out = np.empty(v.size, dtype=np.float32)
    r = lib.fft_rf_quantize(ffi.cast("const float *", ffi.from_buffer(v)), v.size, bits, mantissa, pbase,
                            ffi.cast("uint16_t *", ffi.from_buffer(codes)))
    if r != lib.FFT_OK:
        raise ValueError(f"range float: {error_text(lib.fft_strerror, r)}")
    lib.fft_rf_dequantize(ffi.cast("const uint16_t *", ffi.from_buffer(codes)), v.size, bits, mantissa, pbase,
                          ffi.cast("float *", ffi.from_buffer(out)))
    return out


def range_float_eps(max_abs: float, bits: int, mantissa: int) -> float:
    """The smallest nonzero magnitude of the range float that covers max_abs."""
    pbase = lib.fft_rf_pbase(float(np.float32(max_abs)), bits, mantissa)
    if pbase == 0:
        raise ValueError(f"no valid range for bits={bits}, mantissa={mantissa}, max_abs={max_abs}")
    return float(np.uint32(pbase << (23 - mantissa)).view(np.float32))
