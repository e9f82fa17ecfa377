"""The 3LC codec against docs/spec.md section 5: exact bytes of the base-3^5 packing and the zero-run
encoding on known inputs, C and the numpy reference bit for bit, the error-accumulation loop
through the shared ErrorFeedback memory, and every malformed stream refused with ValueError."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inceptionn.codecs import ErrorFeedback, get_codec
from inceptionn.codecs import threelc_reference as ref
from inceptionn.codecs._native import lib
from inceptionn.codecs.threelc import max_encoded_size, min_encoded_size
from codec_checks import assert_decodes_like_reference_or_both_refuse

IMPLS = ["c", "numpy"]
SPARSITIES = [1.0, 1.5, 1.75, 1.9]


def f32(*vals):
    return np.array(vals, dtype=np.float32)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def header(m, n, zre):
    return bytes([0x33, 1, 1 if zre else 0, 0]) + f32(m).tobytes() + n.to_bytes(4, "little")


# 22 values: one byte of every kind of value, 15 zeros (three bytes 121), a 2-value tail.
KNOWN = f32(1.0, -0.25, 0.6, 0.0, -1.0, *[0.0] * 15, 0.5, -0.7)


@pytest.mark.parametrize("impl", IMPLS)
def test_known_bytes(impl):
    # s = 1: M = 1. Q = 1, 0, 1, 0, -1 -> digits 2,1,2,1,0 -> 81*2+27+9*2+3+0 = 210.
    # 15 zeros -> 121 121 121 -> ZRE 243+(3-2) = 244. Tail: 0.5 is a tie (2|A| = M) -> 0,
    # -0.7 -> -1: digits 1,0 + padding 0,0,0 -> 81.
    c = get_codec("3lc", impl=impl)
    assert c.encode(KNOWN) == header(1.0, 22, True) + bytes([210, 244, 81])
    raw = get_codec("3lc", zre=False, impl=impl)
    assert raw.encode(KNOWN) == header(1.0, 22, False) + bytes([210, 121, 121, 121, 81])
    want = f32(1, 0, 1, 0, -1, *[0] * 15, 0, -1)
    for blob in (c.encode(KNOWN), raw.encode(KNOWN)):
        np.testing.assert_array_equal(bits(c.decode(blob, 22)), bits(want))
    # s = 1.5: M = 1.5, only |A| > 0.75 survives.
    s15 = get_codec("3lc", sparsity=1.5, impl=impl)
    np.testing.assert_array_equal(s15.roundtrip(KNOWN), f32(1.5, 0, 0, 0, -1.5, *[0] * 17))


@pytest.mark.parametrize("impl", IMPLS)
def test_base3_packing_formula(impl):
    rng = np.random.default_rng(5)
    q = rng.integers(-1, 2, 1003)
    # Values that quantize to q exactly: q itself (M = 1 as long as some |q| = 1).
    x = q.astype(np.float32)
    blob = get_codec("3lc", zre=False, impl=impl).encode(x)
    d = np.concatenate([q + 1, np.zeros(2, np.int64)]).reshape(-1, 5)  # tail padded with digit 0
    want = 81 * d[:, 0] + 27 * d[:, 1] + 9 * d[:, 2] + 3 * d[:, 3] + d[:, 4]
    assert blob == header(1.0, 1003, False) + want.astype(np.uint8).tobytes()


def _zre_want(k):
    out = [255] * (k // 14)
    if k % 14 == 1:
        out.append(121)
    elif k % 14 >= 2:
        out.append(243 + k % 14 - 2)
    return out


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("k", [0, 1, 2, 3, 13, 14, 15, 16, 27, 28, 29, 30, 43])
def test_zero_run_bytes(impl, k):
    # k zero bytes, then one byte 122 (digits 1,1,1,1,2), a run, and a last 121 alone.
    x = np.zeros(5 * k + 5 + 5 * k + 5, np.float32)
    x[5 * k + 4] = 1.0
    c = get_codec("3lc", impl=impl)
    want = _zre_want(k) + [122] + _zre_want(k + 1)
    blob = c.encode(x)
    assert blob == header(1.0, x.size, True) + bytes(want)
    np.testing.assert_array_equal(c.decode(blob, x.size), x)


def test_all_zero_tensor():
    c = get_codec("3lc")
    blob = c.encode(np.zeros(70, np.float32))
    assert blob == header(0.0, 70, True) + bytes([255])
    assert not c.decode(blob, 70).any()
    assert c.encode(np.zeros(0, np.float32)) == header(0.0, 0, True)


@pytest.fixture(params=["simd", "baseline"])
def kernels(request):
    """Run the C library with its AVX2 kernels (where the CPU has them) and with the baseline ones."""
    was = lib.tlc_simd(1 if request.param == "simd" else 0)
    yield request.param
    lib.tlc_simd(was)


@pytest.mark.parametrize("s", SPARSITIES)
@pytest.mark.parametrize("zre", [True, False])
@pytest.mark.parametrize("n", [0, 1, 4, 5, 6, 69, 70, 71, 1000, 2047, 2048, 50001])
def test_c_and_numpy_bit_identical(s, zre, n, kernels):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 2)).astype(np.float32)
    x[rng.random(n) < 0.3] = 0.0
    if n > 3:
        m = np.abs(x).max()
        x[:3] = [m / 2, -m / 2, np.nextafter(m / 2, np.float32(1))]  # ties and just above
    c, r = get_codec("3lc", sparsity=s, zre=zre), get_codec("3lc", sparsity=s, zre=zre, impl="numpy")
    blob = c.encode(x)
    assert blob == r.encode(x)
    assert min_encoded_size(n) <= len(blob) <= max_encoded_size(n)
    y = c.decode(blob, n)
    np.testing.assert_array_equal(bits(y), bits(r.decode(blob, n)))
    np.testing.assert_array_equal(bits(y), bits(c.roundtrip(x)))  # recon == decode, bit for bit
    np.testing.assert_array_equal(bits(y), bits(r.roundtrip(x)))
    M = np.float32(s) * np.abs(x).max() if n else 0.0
    assert (np.abs(x.astype(np.float64) - y) <= M / 2).all()  # the paper's error bound


def test_ties_round_to_zero_and_sparsity_thins():
    x = f32(1.0, 0.5, -0.5, 0.50000006, -0.50000006)
    np.testing.assert_array_equal(get_codec("3lc").roundtrip(x), f32(1, 0, 0, 1, -1))
    rng = np.random.default_rng(1)
    g = (rng.standard_normal(100000) * 1e-3).astype(np.float32)
    nonzero = [np.count_nonzero(get_codec("3lc", sparsity=s).roundtrip(g)) for s in SPARSITIES]
    sizes = [len(get_codec("3lc", sparsity=s).encode(g)) for s in SPARSITIES]
    assert nonzero == sorted(nonzero, reverse=True) and sizes == sorted(sizes, reverse=True)
    assert nonzero[-1] < nonzero[0]


@pytest.mark.parametrize("impl", IMPLS)
def test_error_feedback_accumulates_per_tensor(impl):
    """SPEC: A += T; M = s*max|A|; Q = round(A/M); A -= M*Q, one buffer per tensor."""
    rng = np.random.default_rng(9)
    c = get_codec("3lc", sparsity=1.5, impl=impl)
    mem = ErrorFeedback()
    assert c.wants_error_feedback
    steps = [(rng.standard_normal(997) * 1e-3).astype(np.float32) for _ in range(30)]
    other = (rng.standard_normal(50) * 1e-3).astype(np.float32)
    A = np.zeros(997, np.float32)
    sent = np.zeros(997, np.float64)
    for t in steps:
        blob = mem.encode(c, t, "w1")
        mem.encode(c, other, "b1")  # another tensor: its own buffer
        A = (A + t).astype(np.float32)
        m, q = ref.quantize(A, 1.5)
        assert blob == ref.encode_quantized(m, q)  # the codec saw exactly the spec's A
        A = (A - ref.dequantize(m, q)).astype(np.float32)
        np.testing.assert_array_equal(bits(mem.residual("w1")), bits(A))
        sent += c.decode(blob, 997)
    # Nothing is lost, only delayed: sum of inputs = sum of what was sent + what is pending.
    np.testing.assert_allclose(sum(s.astype(np.float64) for s in steps), sent + A, atol=1e-6)
    assert len(mem) == 2
    with pytest.raises(ValueError, match="shape"):
        mem.encode(c, other, "w1")
    mem.reset()
    assert len(mem) == 0


def test_the_codec_is_stateless():
    x = (np.random.default_rng(2).standard_normal(300) * 1e-3).astype(np.float32)
    c = get_codec("3lc")
    assert c.encode(x) == c.encode(x)
    np.testing.assert_array_equal(c.roundtrip(x), c.decode(c.encode(x), x.size))
    blob, decoded = c.encode_decoded(x)    # what error feedback gets: the same bytes, their decode
    assert blob == c.encode(x)
    np.testing.assert_array_equal(bits(decoded), bits(c.decode(blob, x.size)))
    shared = ErrorFeedback()                # one memory serves several codecs, a key per tensor
    shared.encode(get_codec("3lc"), x, "k")
    shared.encode(get_codec("3lc", sparsity=1.9), x, "k2")
    assert shared.residual("k") is not None and len(shared) == 2


def test_error_feedback_on_real_gradients_beats_plain_quantization():
    from inceptionn.train.gradients import capture_gradients
    gs = capture_gradients(4)
    c = get_codec("3lc")
    mem = ErrorFeedback()
    sent = np.zeros(gs[0].size, np.float64)
    plain = np.zeros(gs[0].size, np.float64)
    for g in gs:
        sent += c.decode(mem.encode(c, g, 0), g.size)
        plain += c.roundtrip(g)
    truth = sum(g.astype(np.float64) for g in gs)
    err_ef = np.linalg.norm(sent - truth) / np.linalg.norm(truth)
    err_plain = np.linalg.norm(plain - truth) / np.linalg.norm(truth)
    assert err_ef < err_plain


# --- malformed streams -------------------------------------------------------------------------

def _mutate(blob, i, v):
    b = bytearray(blob)
    b[i] = v
    return bytes(b)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("zre", [True, False])
def test_every_truncation_and_trailing_byte_refused(impl, zre):
    c = get_codec("3lc", zre=zre, impl=impl)
    blob = c.encode(KNOWN)
    for k in range(len(blob)):
        with pytest.raises(ValueError):
            c.decode(blob[:k], 22)
    for extra in (b"\0", b"\x79", b"\xf3"):
        with pytest.raises(ValueError):
            c.decode(blob + extra, 22)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_fields_refused(impl):
    c = get_codec("3lc", impl=impl)
    blob = c.encode(KNOWN)  # header + [210, 244, 81]
    raw = get_codec("3lc", zre=False).encode(KNOWN)
    bad = [
        _mutate(blob, 0, 0x54),                        # magic
        _mutate(blob, 1, 0),                           # version
        _mutate(blob, 2, 3),                           # unknown flag
        _mutate(blob, 3, 1),                           # reserved
        blob[:4] + f32(np.nan).tobytes() + blob[8:],     # NaN M
        blob[:4] + f32(-np.inf).tobytes() + blob[8:],    # infinite M
        blob[:4] + f32(-0.5).tobytes() + blob[8:],       # negative M
        _mutate(blob, 8, 21),                          # count
        _mutate(blob, 13, 255),                        # zero run of 14 past the last value
        _mutate(blob, 13, 246),                        # zero run of 5: past by two
        _mutate(blob, 14, 82),                         # padding digit of the last byte
        _mutate(blob, 14, 121),                        # ... all five digits 1
        _mutate(raw, 13, 243),                         # a run byte without ZRE
        header(1.0, 22, True) + bytes([210, 245]),     # run of 4 over the partial last byte
    ]
    for i, b in enumerate(bad):
        with pytest.raises(ValueError):
            c.decode(b, 22)
        print(i, "refused")


def test_hostile_count_is_refused_before_allocating():
    c = get_codec("3lc")
    with pytest.raises(ValueError, match="values take"):
        c.decode(header(1.0, 0, True) + bytes([255]), 10**15)
    # 14 values per byte at most: 1 byte of runs cannot hold 71 values.
    with pytest.raises(ValueError, match="values take"):
        c.decode(header(1.0, 71, True) + bytes([255]), 71)
    assert c.decode(header(1.0, 70, True) + bytes([255]), 70).size == 70


@settings(max_examples=400, deadline=None)
@given(blob=st.binary(max_size=40), n=st.integers(0, 200), zre=st.booleans(), header_first=st.booleans(),
       m=st.one_of(st.just(0x3E800000), st.sampled_from([0x7F7FFFFF, 0x7F800000, 0xFFC00000, 1]),
                   st.integers(0, 2**32 - 1)))
def test_arbitrary_bytes_decode_or_raise_valueerror(blob, n, zre, header_first, m):
    if header_first:  # a valid header with any scaler bits
        head = header(0.25, n, zre)
        blob = head[:4] + m.to_bytes(4, "little") + head[8:] + blob
    assert_decodes_like_reference_or_both_refuse("3lc", blob, n)


# --- parameters -------------------------------------------------------------------------------

def test_bad_parameters():
    for s in (0.5, 2.0, 1.99999999, float("nan"), -1.0):
        with pytest.raises(ValueError, match="sparsity"):
            get_codec("3lc", sparsity=s)
    with pytest.raises(TypeError, match="sparsity"):
        get_codec("3lc", sparsity="1.5")
    with pytest.raises(TypeError, match="zre"):
        get_codec("3lc", zre=1)
    with pytest.raises(TypeError, match="memory"):
        get_codec("3lc", memory={})
    with pytest.raises(ValueError, match="impl"):
        get_codec("3lc", impl="gpu")
    c = get_codec("3lc")
    with pytest.raises(TypeError, match="float32"):
        c.encode(np.ones(3, np.float64))
    for impl in IMPLS:
        c = get_codec("3lc", sparsity=1.5, impl=impl)
        with pytest.raises(ValueError, match="NaN or infinity"):
            c.encode(f32(0.0, np.nan))
        with pytest.raises(ValueError, match="overflows"):
            c.encode(f32(np.finfo(np.float32).max))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("zre", [True, False])
def test_bad_bytes_in_long_streams_refused(impl, zre):
    """Long streams decode through a lookup table: its path must check every byte too."""
    n = 5003
    x = (np.random.default_rng(8).standard_normal(n)).astype(np.float32)
    blob = get_codec("3lc", zre=zre).encode(x)
    c = get_codec("3lc", impl=impl)
    np.testing.assert_array_equal(bits(c.decode(blob, n)), bits(ref.decode(blob, n)))
    if not zre:
        for at in (12, 12 + 700, len(blob) - 2):
            with pytest.raises(ValueError):
                c.decode(_mutate(blob, at, 243), n)
    with pytest.raises(ValueError):  # n % 5 = 3: the last byte's two padding digits must be 0
        c.decode(_mutate(blob, len(blob) - 1, 242), n)
    with pytest.raises(ValueError):
        c.decode(blob[:-1], n)


# --- inside the collective --------------------------------------------------------------------

def test_inside_the_collective(tmp_path):
    """Ring allreduce and WA with 3LC in the app, error feedback by the collective's memory: the
    same result on every rank, and what is sent over many calls adds up to the true sum."""
    import threading

    from inceptionn.collective import FileStore, Group

    world, n, calls = 3, 2003, 40
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(n) * 1e-3).astype(np.float32) for _ in range(world)]
    truth = sum(x.astype(np.float64) for x in xs)
    out, errors = [None] * world, []

    def rank(r):
        try:
            with Group(r, world, FileStore(tmp_path), bind_addr="127.0.0.1", codec=get_codec("3lc"),
                       compress="app", timeout=60) as g:
                ring = [g.allreduce(xs[r].copy(), error_feedback=True) for _ in range(calls)]
                wa = g.wa_step(xs[r].copy(), lambda s: s)
            out[r] = ring, wa
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    for ring, wa in out[1:]:
        for a, b in zip(ring, out[0][0]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(wa, out[0][1])
    mean = np.mean(out[0][0], axis=0)
    assert np.sum((mean - truth) ** 2) / np.sum(truth**2) < 0.05  # stateless 3LC: ~1.4
