"""The INCEPTIONN codec against docs/spec.md section 1: C scalar, C AVX2 and the numpy reference
must agree bit for bit, and each tier must keep the precision the spec gives it."""
import math

import numpy as np
import pytest

from inceptionn.codecs import available_codecs, get_codec
from inceptionn.codecs.inceptionn import have_avx2, max_encoded_size
from inceptionn.codecs.inceptionn_reference import thresholds
from inceptionn.train.gradients import gradient_sample

C_IMPLS = ["scalar"] + (["avx2"] if have_avx2() else [])
ALL_IMPLS = C_IMPLS + ["numpy"]
BOUNDS = [-6, -7, -8, -9, -10, -11, -12]


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def f32(*vals):
    return np.array(vals, dtype=np.float32)


def edge_values(k):
    """Specials and both sides of every tier boundary for error bound 2^k."""
    eb, mid = thresholds(k)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 1.17549435e-38,
            np.finfo(np.float32).max, -np.finfo(np.float32).max]
    for e in (eb, mid, 127):
        edge = np.float32(2.0 ** (e - 127))
        below = np.nextafter(edge, np.float32(0))
        vals += [edge, -edge, below, -below, np.nextafter(edge, np.float32(np.inf))]
    return np.array(vals, dtype=np.float32)


def mixed_values(rng, n):
    """Random floats over every exponent plus gradient-like magnitudes."""
    raw = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    grad = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 1, n)).astype(np.float32)
    return np.where(rng.random(n) < 0.3, raw, grad).astype(np.float32)


@pytest.mark.parametrize("k", BOUNDS)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 1001, 40000])
def test_all_paths_bit_identical(k, n):
    rng = np.random.default_rng(n * 100 - k)
    x = mixed_values(rng, n)
    x[: min(n, 40)] = np.resize(edge_values(k), min(n, 40))
    blobs = {impl: get_codec("inceptionn", error_bound=k, impl=impl).encode(x) for impl in ALL_IMPLS}
    assert len(set(blobs.values())) == 1, {i: len(b) for i, b in blobs.items()}
    blob = blobs["numpy"]
    decoded = {impl: bits(get_codec("inceptionn", error_bound=k, impl=impl).decode(blob, n)) for impl in ALL_IMPLS}
    for impl in ALL_IMPLS:
        np.testing.assert_array_equal(decoded[impl], decoded["numpy"], err_msg=impl)


def test_known_bytes():
    # k=-10: Eb=117, mid=122. 0.75 -> 16BIT field 0.75*2^15; 2^-6 -> 8BIT field 2; 1e-5 -> 0BIT;
    # 2.5 -> raw; -0.5 -> 16BIT with sign. Tags 2,1,0,3,2 = 0x2C6.
    x = f32(0.75, 2**-6, 1e-5, 2.5, -0.5)
    want = bytes([0xC6, 0x02, 0x00, 0x60, 0x02]) + f32(2.5).tobytes() + bytes([0x00, 0xC0])
    for impl in ALL_IMPLS:
        assert get_codec("inceptionn", error_bound=-10, impl=impl).encode(x) == want


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_specials(impl):
    c = get_codec("inceptionn", error_bound=-10, impl=impl)
    x = f32(0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-40, -1e-40)
    y = c.roundtrip(x)
    # Zeros and denormals are 0BIT, which decodes to +0.0 (the sign is not kept).
    assert bits(y[[0, 1, 7, 8]]).tolist() == [0, 0, 0, 0]
    # >= 1.0, inf and NaN travel raw, bit for bit.
    np.testing.assert_array_equal(bits(y[2:7]), bits(x[2:7]))
    assert c.histogram(x).tolist() == [4, 0, 0, 5]


@pytest.mark.parametrize("k", BOUNDS)
def test_tier_boundaries(k):
    eb, mid = thresholds(k)
    c = get_codec("inceptionn", error_bound=k)
    lo8, lo16 = np.float32(2.0 ** (eb - 127)), np.float32(2.0 ** (mid - 127))
    zero, one = np.float32(0), np.float32(1)
    x = f32(np.nextafter(lo8, zero), lo8, np.nextafter(lo16, zero), lo16, np.nextafter(one, zero), 1.0)
    assert c.histogram(x).tolist() == [1, 2, 2, 1]
    ref = get_codec("inceptionn", error_bound=k, impl="numpy")
    assert c.histogram(x).tolist() == ref.histogram(x).tolist()


def test_8bit_hole_below_2_pow_minus_7():
    """SPEC: for k < -7, 8BIT values in [2^k, 2^-7) lose their leading one and decode to a
    (signed) zero while still costing 8 bits. The hardware does this; so do we."""
    c = get_codec("inceptionn", error_bound=-10)
    x = f32(2**-10, -2**-9, 2**-8 * 1.5)
    assert c.histogram(x).tolist() == [0, 3, 0, 0]
    assert bits(c.roundtrip(x)).tolist() == [0, 0x80000000, 0]


@pytest.mark.parametrize("k", BOUNDS)
def test_precision_per_tier(k):
    rng = np.random.default_rng(-k)
    x = (rng.standard_normal(50000) * 10.0 ** rng.uniform(-5, 0.5, 50000)).astype(np.float32)
    c = get_codec("inceptionn", error_bound=k)
    y = c.roundtrip(x)
    eb, mid = thresholds(k)
    e = (bits(x) >> 23) & 0xFF
    err = np.abs(x.astype(np.float64) - y)
    assert (err[(e >= mid) & (e < 127)] < 2**-15).all()
    assert (err[(e >= eb) & (e < mid)] < 2**-7).all()
    assert (bits(y[e < eb]) == 0).all()
    np.testing.assert_array_equal(bits(y[e >= 127]), bits(x[e >= 127]))
    # Truncation toward zero: never larger in magnitude.
    assert (np.abs(y) <= np.abs(x)).all()


@pytest.mark.parametrize("n", [0, 1, 8, 13, 1000])
def test_stream_size(n):
    rng = np.random.default_rng(n)
    x = mixed_values(rng, n)
    c = get_codec("inceptionn", error_bound=-8)
    h = c.histogram(x)
    expect = 2 * math.ceil(n / 8) + h[1] + 2 * h[2] + 4 * h[3]
    assert len(c.encode(x)) == expect == c.encoded_size(x)
    assert expect <= max_encoded_size(n) == 34 * math.ceil(n / 8)


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_decode_into_callers_buffer(impl):
    c = get_codec("inceptionn", error_bound=-10, impl=impl)
    x = f32(0.5, -0.25, 3.0, 0.001)
    out = np.full(4, 7.0, dtype=np.float32)
    assert c.decode_into(c.encode(x), out) is out
    np.testing.assert_array_equal(out, c.roundtrip(x))
    buf = bytearray(max_encoded_size(4))
    n = c.encode_into(x, buf)
    assert bytes(buf[:n]) == c.encode(x)


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_malformed_streams_raise_valueerror(impl):
    c = get_codec("inceptionn", error_bound=-10, impl=impl)
    x = f32(*([2.0] * 9))  # two groups, raw lanes
    blob = c.encode(x)
    for cut in range(len(blob)):
        with pytest.raises(ValueError, match="stream"):
            c.decode(blob[:cut], 9)
    with pytest.raises(ValueError, match="bytes left after the last group"):
        c.decode(blob + b"\0", 9)
    # Second group: lane 1 tagged raw (0x000C) although only lane 0 holds a value.
    with pytest.raises(ValueError, match="not 0BIT"):
        c.decode(blob[:34] + b"\x0c\x00" + blob[-4:], 9)
    with pytest.raises(ValueError):
        c.decode(b"\0\0", 10**12)  # a hostile count is refused, not allocated per group


def random_stream(rng, n):
    """A well-formed stream of n values with random tags and random payload bytes (so raw lanes
    hold every bit pattern: inf, NaN, subnormals); returns it with each lane's tag."""
    out, tags = bytearray(), []
    for g in range(-(-n // 8)):
        lanes = min(8, n - 8 * g)
        t = rng.integers(0, 4, lanes)
        out += int(sum(int(v) << (2 * j) for j, v in enumerate(t))).to_bytes(2, "little")
        out += rng.bytes(int(sum((0, 1, 2, 4)[v] for v in t)))
        tags += t.tolist()
    return bytes(out), np.array(tags)


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_only_raw_lanes_decode_non_finite(impl):
    """The rule for INCEPTIONN (docs/codecs.md): the compressed tiers always decode finite
    (8BIT and 16BIT below 1 in magnitude, 0BIT +0.0); inf/NaN only ever come out of a
    NO_COMPRESS lane, as its 4 bytes verbatim (the soft NIC relies on byte-exact transparency)."""
    rng = np.random.default_rng(11)
    c = get_codec("inceptionn", error_bound=-10, impl=impl)
    raw_nonfinite = 0
    for n in (1, 7, 8, 9, 100, 4099):
        for _ in range(20):
            blob, tags = random_stream(rng, n)
            y = c.decode(blob, n)
            packed = tags != 3
            assert np.isfinite(y[packed]).all() and (np.abs(y[packed]) < 1).all()
            assert (y.view(np.uint32)[tags == 0] == 0).all()
            raw = []
            pos = 0
            for g in range(-(-n // 8)):
                pos += 2
                for t in tags[8 * g: 8 * g + 8]:
                    if t == 3:
                        raw.append(blob[pos:pos + 4])
                    pos += (0, 1, 2, 4)[t]
            assert y[tags == 3].tobytes() == b"".join(raw)  # verbatim, NaN payloads included
            raw_nonfinite += int((~np.isfinite(y[tags == 3])).sum())
    assert raw_nonfinite > 0  # the random raw lanes did carry inf/NaN through


def test_padding_lane_rejected_message():
    c = get_codec("inceptionn", error_bound=-10)
    with pytest.raises(ValueError, match="not 0BIT.*byte 0"):
        c.decode(b"\x0c\x00" + b"\0\0\x20\x40", 1)  # lane 1 tagged raw but only 1 value


def test_api_refuses_wrong_input():
    c = get_codec("inceptionn", error_bound=-10)
    with pytest.raises(TypeError, match="float32"):
        c.encode(np.zeros(4, dtype=np.float64))
    with pytest.raises(TypeError, match="numpy"):
        c.encode([0.1, 0.2])
    with pytest.raises(ValueError, match="1-D"):
        c.encode(np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(TypeError, match="decode buffer"):
        c.decode_into(b"", np.zeros(0, dtype=np.float64))
    with pytest.raises(TypeError, match="bytes-like"):
        c.decode("abc", 1)
    with pytest.raises(ValueError, match=">= 0"):
        c.decode(b"", -1)
    with pytest.raises(ValueError, match="too small"):
        c.encode_into(f32(2.0, 2.0), bytearray(5))
    for bad in (0, 1, -31):
        with pytest.raises(ValueError, match="error_bound"):
            get_codec("inceptionn", error_bound=bad)
    with pytest.raises(TypeError, match="error_bound"):
        get_codec("inceptionn", error_bound=-10.0)
    with pytest.raises(ValueError, match="impl"):
        get_codec("inceptionn", impl="gpu")
    with pytest.raises(ValueError, match="unknown codec"):
        get_codec("zip")
    assert "inceptionn" in available_codecs()


def test_strided_input_is_accepted():
    c = get_codec("inceptionn", error_bound=-10)
    x = np.arange(20, dtype=np.float32) / 20
    assert c.encode(x[::2]) == c.encode(np.ascontiguousarray(x[::2]))


@pytest.mark.parametrize("k", [-30, -15, -10, -8, -6, -1])
def test_reconstruct_is_the_round_trip_without_a_stream(k):
    """reconstruct() (one C pass, used by the collective on every value it sends) equals
    decode(encode(x)) bit for bit, zeros made +0.0, on random bit patterns (NaN, inf and
    subnormals included) and real gradients; it is idempotent and works in place."""
    rng = np.random.default_rng(k & 0xFF)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.99999994, 2**-7, -2**-7,
                        2**-8, 2**-15, 2**-16, 1e-40, -1e-40], dtype=np.float32)
    c = get_codec("inceptionn", error_bound=k)
    for x in (bits, special, gradient_sample(2), gradient_sample(2) * np.float32(2**10)):
        want = c.roundtrip(x)
        want[want == 0] = 0.0
        got = c.reconstruct(x)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert np.array_equal(c.reconstruct(got).view(np.uint32), got.view(np.uint32))
        y = x.copy()
        assert c.reconstruct(y, out=y) is y and np.array_equal(y.view(np.uint32), got.view(np.uint32))
    with pytest.raises(ValueError):
        c.reconstruct(special, out=np.empty(3, dtype=np.float32))


def _stream_histogram(blob: bytes, n: int, impl: int) -> tuple[int, tuple[int, ...]]:
    from inceptionn.codecs._native import ffi, lib

    counts = ffi.new("uint64_t[4]")
    rc = lib.inc_stream_histogram_impl(ffi.from_buffer(blob), len(blob), n, counts, impl)
    return rc, tuple(counts)


def test_stream_histogram_popcnt_and_portable_builds_agree():
    """The stream histogram is built twice (POPCNT instruction, portable): forcing the portable
    build gives the counts and statuses the CPU's path gives, and both match the floats'."""
    from inceptionn.codecs._native import lib

    impls = [lib.INC_IMPL_AUTO, lib.INC_IMPL_SCALAR] + ([lib.INC_IMPL_AVX2] if have_avx2() else [])
    rng = np.random.default_rng(22)
    codec = get_codec("inceptionn", error_bound=-10)
    statuses = set()
    for n in (0, 1, 7, 8, 9, 100, 1001, 40000):
        x = mixed_values(rng, n)
        blob = codec.encode(x)
        want = tuple(int(v) for v in codec.histogram(x))
        for impl in impls:
            assert _stream_histogram(blob, n, impl) == (lib.INC_OK, want), (n, impl)
        # damaged streams: the same status (and, when it is OK, the same counts) from every build
        for _ in range(20):
            bad = bytearray(blob or b"\0")
            cut = int(rng.integers(0, len(bad) + 1))
            bad = bad[:cut] if rng.random() < 0.5 else bad
            if bad:
                bad[int(rng.integers(0, len(bad)))] ^= 1 << int(rng.integers(0, 8))
            got = {impl: _stream_histogram(bytes(bad), n, impl) for impl in impls}
            assert len(set(got.values())) == 1, (n, got)
            statuses.add(got[lib.INC_IMPL_SCALAR][0])
    assert lib.INC_OK in statuses and lib.INC_E_TRUNCATED in statuses  # both kinds were compared
