"""FFT sparsification + range-based float (docs/spec.md section 7): the C library and the numpy
reference bit for bit, top-k selection with the bitmap, the range float's round-trip error
bound, the compression ratio accounting, the theta schedule, and refusal of malformed blobs."""
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from inceptionn.codecs import ErrorFeedback, get_codec
from inceptionn.codecs import fft_reference as ref
from inceptionn.codecs.fft import ThetaSchedule, range_float_eps, range_float_roundtrip, theta_for_lr
from codec_checks import assert_decodes_like_reference_or_both_refuse

IMPLS = ["c", "numpy"]


def grads(rng, n, scale=0.01):
    return (rng.standard_normal(n) * scale * rng.lognormal(0, 1, n)).astype(np.float32)


# --- C vs numpy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 101, 4096, 30001])
@pytest.mark.parametrize("theta,bits,mantissa", [(0.85, 10, None), (0.0, 16, None), (0.5, 4, None),
                                                  (0.99, 2, None), (1.0, 10, None), (0.85, 10, 5), (0.7, 12, 9)])
def test_c_and_numpy_bit_identical(n, theta, bits, mantissa):
    x = grads(np.random.default_rng(n), n)
    if n > 40:
        x[10:30] = x[10]  # runs of equal values: ties in the spectrum
    c, r = (get_codec("fft", theta=theta, bits=bits, mantissa_bits=mantissa, impl=i) for i in IMPLS)
    blob = c.encode(x)
    assert blob == r.encode(x)
    assert len(blob) == c.encoded_size(x) == c.max_encoded_size(n)
    yc, yr = c.decode(blob, n), r.decode(blob, n)
    np.testing.assert_array_equal(yc.view(np.uint32), yr.view(np.uint32))
    np.testing.assert_array_equal(c.decode_spectrum(blob, n).view(np.uint32),
                                  r.decode_spectrum(blob, n).view(np.uint32))


def test_ties_go_to_the_lower_index():
    spec = np.ones(11, np.complex64)
    for impl in IMPLS:
        blob = get_codec("fft", theta=0.7, impl=impl).encode_spectrum(spec, 20)  # keep 11 - 7 = 4
        assert blob[16:18] == bytes([0x0F, 0x00])


def test_known_blob():
    # Same vector as the C unit test: n = 6 (L = 6, K = 4), keep 2, N = 8, m = 2.
    spec = np.array([0.5, 4 - 1j, 1 + 1j, -1.5], np.complex64)
    c = get_codec("fft", theta=0.5, bits=8, mantissa_bits=2)
    blob = c.encode_spectrum(spec, 6)
    eps = 0x186 << 21
    assert blob == bytes([0x46, 1, 8, 2]) + struct.pack("<III", eps, 6, 2) + bytes([0x0A, 127, 0x80 | 119, 0x80 | 121, 0])
    np.testing.assert_array_equal(c.decode_spectrum(blob, 6), np.array([0, 4 - 1j, 0, -1.5], np.complex64))
    assert c.info(blob) == dict(bits=8, mantissa=2, eps=float(np.uint32(eps).view(np.float32)), n=6, k=2, bins=4)


# --- top-k and the bitmap ---------------------------------------------------------------------------

@pytest.mark.parametrize("theta", [0.0, 0.3, 0.85, 0.95, 1.0])
def test_keeps_the_largest_components(theta):
    n = 5000
    x = grads(np.random.default_rng(1), n)
    c = get_codec("fft", theta=theta)
    blob = c.encode(x)
    K = n // 2 + 1  # 5000 = 2^3 5^4: no padding
    assert ref.fft_length(n) == n
    k = K - math.floor(theta * K)
    assert c.info(blob)["k"] == k == c.kept(n)
    flags = np.unpackbits(np.frombuffer(blob[16:16 + (K + 7) // 8], np.uint8), bitorder="little")[:K].astype(bool)
    mag = np.abs(np.fft.rfft(x).astype(np.complex64).astype(np.complex128))
    assert flags.sum() == k
    if 0 < k < K:
        assert mag[flags].min() >= mag[~flags].max()
    assert (c.decode_spectrum(blob, n)[~flags] == 0).all()


def test_theta_one_decodes_to_zero_and_theta_zero_is_quantization_only():
    x = grads(np.random.default_rng(2), 1000)
    assert (get_codec("fft", theta=1.0).roundtrip(x) == 0).all()
    c = get_codec("fft", theta=0.0, bits=16)
    y = c.roundtrip(x)
    m = c.info(c.encode(x))["mantissa"]
    # All components kept: only the range float's relative error 2^-m (plus tiny ones below eps).
    assert np.linalg.norm(y - x) / np.linalg.norm(x) < 2.0 ** -m * 2


def test_low_frequency_signal_survives_sparsification():
    n = 10000
    t = np.arange(n)
    x = (np.sin(2 * np.pi * 3 * t / n) + 0.5 * np.cos(2 * np.pi * 17 * t / n)).astype(np.float32)
    x += (np.random.default_rng(3).standard_normal(n) * 0.01).astype(np.float32)
    y = get_codec("fft", theta=0.99).roundtrip(x)
    assert np.sum((y - x) ** 2) / np.sum(x**2) < 1e-3


def test_padding_to_a_fast_length():
    assert [ref.fft_length(n) for n in (0, 1, 7, 11, 77, 789010)] == [0, 1, 8, 12, 80, 800000]
    x = grads(np.random.default_rng(9), 77)
    c = get_codec("fft", theta=0.0, bits=16)
    assert c.info(c.encode(x))["bins"] == 41  # the padded spectrum
    y = c.roundtrip(x)
    assert y.shape == (77,) and np.linalg.norm(y - x) < 1e-3 * np.linalg.norm(x)


def test_compression_ratio_accounting():
    """Paper: 21.3x at theta 0.85, N = 10 without the bitmap (32/10 / 0.15); with the bitmap
    (n/2 bits) it is 16x. Our blob is exactly header + bitmap + codes."""
    n = 1_000_000
    c = get_codec("fft")
    K = n // 2 + 1
    k = c.kept(n)
    size = c.max_encoded_size(n)
    assert size == 16 + (K + 7) // 8 + (2 * k * 10 + 7) // 8
    codes_only = 32 * n / (2 * k * 10)
    assert codes_only == pytest.approx(21.33, abs=0.01)
    assert 4 * n / size == pytest.approx(16.0, abs=0.01)


# --- the range-based float ------------------------------------------------------------------------------

def test_paper_figure_8_example():
    # m = 3, eps = 0.125 (pbase 0x3E0): 0.256 -> 0.25 (8-bit codes); below eps -> 0.
    y = range_float_roundtrip(np.array([0.256, -0.256, 0.1, 2.0], np.float32), bits=8, mantissa=3, eps=0.125)
    assert y.tolist() == [0.25, -0.25, 0.0, 2.0]
    # Anchored at max = 2.0 instead (pattern 0x400), the 127 magnitude codes reach down to
    # pattern 0x400 - 126: 126 / 2^3 = 15.75 octaves below 2.0.
    assert range_float_eps(2.0, 8, 3) == float(np.uint32((0x400 - 126) << 20).view(np.float32))
    assert range_float_roundtrip(np.array([0.1], np.float32), 8, 3, max_abs=2.0)[0] == 0.09375


@pytest.mark.parametrize("bits,m", [(10, 6), (10, 3), (10, 9), (8, 3), (16, 12), (4, 1), (12, 5)])
def test_range_float_roundtrip_error_bound(bits, m):
    """|v - Q(v)| < 2^-m |v| for eps <= |v| <= max, < eps below eps; never grows a magnitude,
    never flips a sign; the largest value gets the top code."""
    rng = np.random.default_rng(bits * 100 + m)
    max_abs = np.float32(0.7)
    v = (max_abs * 2.0 ** (-40 * rng.random(20000)) * rng.choice([-1, 1], 20000)).astype(np.float32)
    v[0] = max_abs
    y = range_float_roundtrip(v, bits, m, max_abs).astype(np.float64)
    eps = range_float_eps(max_abs, bits, m)
    a = np.abs(v.astype(np.float64))
    err = np.abs(v - y)
    assert (err[a < eps] < eps).all()
    assert (err[a >= eps] < a[a >= eps] * 2.0**-m).all()
    assert (np.abs(y) <= a).all() and (np.sign(y) * np.sign(v) >= 0).all()
    assert y[0] == float(np.uint32((np.float32(max_abs).view(np.uint32) >> (23 - m)) << (23 - m)).view(np.float32))
    # The codes cover [-max, max] with about half of them positive: the dynamic range is
    # (2^(N-1) - 2) / 2^m octaves below max.
    assert math.log2(max_abs / eps) == pytest.approx(((1 << (bits - 1)) - 2) / 2**m, abs=1.0)


def test_range_float_agrees_with_the_reference():
    v = grads(np.random.default_rng(4), 5000, 1.0)
    for bits, m in [(10, 6), (6, 2)]:
        pb = ref.rf_pbase(np.abs(v).max(), bits, m)
        np.testing.assert_array_equal(range_float_roundtrip(v, bits, m),
                                      ref.rf_dequantize(ref.rf_quantize(v, bits, m, pb), bits, m, pb))


@settings(max_examples=300, deadline=None)
@given(x=arrays(np.float32, st.integers(1, 300), elements=st.floats(-1e6, 1e6, width=32)),
       theta=st.floats(0, 1), bits=st.integers(2, 16))
def test_property_roundtrip_matches_reference(x, theta, bits):
    c, r = get_codec("fft", theta=theta, bits=bits), get_codec("fft", theta=theta, bits=bits, impl="numpy")
    blob = c.encode(x)
    assert blob == r.encode(x)
    y = c.decode(blob, x.size)
    assert np.isfinite(y).all()
    # Truncation toward zero: each kept part shrinks in magnitude, dropped ones become 0.
    s, d = ref.spectrum(x), c.decode_spectrum(blob, x.size)
    assert (np.abs(d.real) <= np.abs(s.real)).all() and (np.abs(d.imag) <= np.abs(s.imag)).all()


# --- theta schedule ----------------------------------------------------------------------------------------

def test_theta_schedule():
    assert theta_for_lr(0.85, 0.1, 0.1) == 0.85
    assert theta_for_lr(0.9, 0.025, 0.1) == pytest.approx(0.45)  # theta^2 proportional to lr
    assert theta_for_lr(0.9, 0.4, 0.1) == 1.0  # clipped
    s = ThetaSchedule(0.9, lr0=0.01, mode="drop")
    assert s(0.01) == 0.9 and s(0.001) == 0.0  # the paper: theta 0.9 -> 0 at the lr drop
    q = ThetaSchedule(0.85, lr0=0.1)
    assert q(0.1) == 0.85 and q(0.001) == pytest.approx(0.085)
    c = get_codec("fft")
    c.set_theta(q(0.001))
    assert c.theta == pytest.approx(0.085)
    for bad in (lambda: ThetaSchedule(mode="cosine"), lambda: ThetaSchedule(1.5), lambda: theta_for_lr(0.5, -1, 1),
                lambda: theta_for_lr(0.5, 1, 0), lambda: c.set_theta(2), lambda: s(float("nan"))):
        with pytest.raises(ValueError):
            bad()


def test_error_feedback_carries_the_residual():
    rng = np.random.default_rng(6)
    n = 2000
    mem = ErrorFeedback()
    c = get_codec("fft", theta=0.9, error_feedback=True)
    assert c.wants_error_feedback and not get_codec("fft").wants_error_feedback
    sent, got = np.zeros(n), np.zeros(n)
    for _ in range(20):
        x = grads(rng, n)
        sent += x
        got += c.decode(mem.encode(c, x, n), n)
    np.testing.assert_allclose(got + mem.residual(n), sent, atol=1e-5)
    plain = get_codec("fft", theta=0.9)
    rng = np.random.default_rng(6)
    got_plain = np.zeros(n)
    for _ in range(20):
        got_plain += plain.roundtrip(grads(rng, n))
    assert np.linalg.norm(got - sent) < 0.5 * np.linalg.norm(got_plain - sent)


# --- malformed input ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def blob77():
    return get_codec("fft", theta=0.8).encode(grads(np.random.default_rng(0), 77))  # L = 80, K = 41, k = 9


@pytest.mark.parametrize("impl", IMPLS)
def test_malformed_blobs_raise_valueerror(impl, blob77):
    c = get_codec("fft", impl=impl)
    for cut in range(len(blob77)):
        with pytest.raises(ValueError, match="FFT"):
            c.decode(blob77[:cut], 77)
    with pytest.raises(ValueError):
        c.decode(blob77 + b"\0", 77)
    with pytest.raises(ValueError):
        c.decode(blob77, 78)
    for off, val in [(0, 0x47), (1, 2), (2, 1), (2, 17), (3, 24), (4, 1), (7, 0x80), (7, 0x7F), (8, 78),
                     (11, 0x80), (12, 42), (12, 10), (12, 8), (21, 0x80)]:
        bad = bytearray(blob77)
        bad[off] = val
        with pytest.raises(ValueError):
            c.decode(bytes(bad), 77)
    assert c.info(blob77)["k"] == 9  # 2 * 9 * 10 = 180 code bits: 4 padding bits in the last byte
    bad = bytearray(blob77)
    bad[-1] |= 0x80
    with pytest.raises(ValueError):
        c.decode(bytes(bad), 77)


@pytest.mark.parametrize("impl", IMPLS)
def test_huge_spectrum_decodes_finite_or_is_refused(impl):
    """Codes reach FLT_MAX; the float32 inverse transform of such a spectrum overflowed to
    inf/NaN. Now: redone in float64, finite when the values fit float32, else ValueError."""
    c = get_codec("fft", theta=0.0, bits=16, impl=impl)
    fits = c.encode_spectrum(np.array([3e38, -3e38], np.complex64), 2)  # x = (X0 +- X1) / 2
    y = c.decode(fits, 2)
    assert np.isfinite(y).all() and y[0] == 0 and 2.9e38 < y[1] <= 3e38
    # Every bin at +-3e38 +- 3e38j, its phase turned towards x[5]: x[5] = 3.8e38 > FLT_MAX.
    psi = 2 * np.pi * 5 * np.arange(33) / 64
    spec = 3e38 * (np.sign(np.cos(psi)) - 1j * np.sign(np.sin(psi)))
    spec[0], spec[32] = 3e38, -3e38
    beyond = c.encode_spectrum(spec.astype(np.complex64), 64)
    with pytest.raises(ValueError, match="beyond float32"):
        c.decode(beyond, 64)
    small = grads(np.random.default_rng(3), 77)  # ordinary blobs take the float32 path unchanged
    blob = c.encode(small)
    spec = c.decode_spectrum(blob, 77)
    np.testing.assert_array_equal(c.decode(blob, 77), np.fft.irfft(spec, ref.fft_length(77))[:77])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 64), bits=st.sampled_from([4, 10, 16]), data=st.data())
def test_any_finite_spectrum_decodes_finite_or_raises(n, bits, data):
    """Blobs of any finite spectrum, huge parts included: C and numpy agree, and a decode is
    finite or a ValueError (before: inf/NaN from the float32 inverse transform)."""
    K = ref.bins(n)
    parts = data.draw(st.lists(st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False),
                                         st.sampled_from([3.4e38, -3.4e38, 2e38, 0.0])),
                               min_size=2 * K, max_size=2 * K))
    spec = np.array(parts, np.float32).view(np.complex64)
    c, r = get_codec("fft", theta=0.0, bits=bits), get_codec("fft", theta=0.0, bits=bits, impl="numpy")
    blob = c.encode_spectrum(spec, n)
    try:
        y = c.decode(blob, n)
    except ValueError as exc:
        assert "beyond float32" in str(exc)
        with pytest.raises(ValueError):
            r.decode(blob, n)
        return
    np.testing.assert_array_equal(y.view(np.uint32), r.decode(blob, n).view(np.uint32))
    assert np.isfinite(y).all()


def test_hostile_count_is_refused_before_allocating(blob77):
    c = get_codec("fft")
    with pytest.raises(ValueError):
        c.decode(blob77, 10**12)
    with pytest.raises(ValueError):
        c.decode(blob77, 2**32)


@settings(max_examples=400, deadline=None)
@given(blob=st.binary(max_size=80), n=st.integers(0, 60), prefix=st.booleans())
def test_arbitrary_bytes_decode_or_raise_valueerror(blob, n, prefix):
    if prefix:
        blob = bytes([0x46, 1]) + blob
    assert_decodes_like_reference_or_both_refuse("fft", blob, n)


# --- API ------------------------------------------------------------------------------------------------------

def test_api_refuses_bad_parameters_and_input():
    with pytest.raises(ValueError, match="theta"):
        get_codec("fft", theta=1.5)
    with pytest.raises(ValueError, match="theta"):
        get_codec("fft", theta="0.5")
    with pytest.raises(ValueError, match="bits"):
        get_codec("fft", bits=1)
    with pytest.raises(TypeError, match="bits"):
        get_codec("fft", bits=10.0)
    with pytest.raises(ValueError, match="mantissa"):
        get_codec("fft", mantissa_bits=24)
    with pytest.raises(ValueError, match="exponent range"):
        get_codec("fft", bits=16, mantissa_bits=2)
    with pytest.raises(ValueError, match="impl"):
        get_codec("fft", impl="cuda")
    with pytest.raises(TypeError, match="error_feedback"):
        get_codec("fft", error_feedback=1)
    c = get_codec("fft")
    with pytest.raises(TypeError, match="float32"):
        c.encode(np.zeros(4))
    with pytest.raises(ValueError, match="non-finite"):
        c.encode(np.array([1, np.inf, 0], np.float32))
    with pytest.raises(ValueError, match="bins"):
        c.encode_spectrum(np.zeros(3, np.complex64), 10)
    with pytest.raises(TypeError, match="bytes-like"):
        c.decode("abc", 3)
