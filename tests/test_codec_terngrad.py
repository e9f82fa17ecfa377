"""The TernGrad codec against docs/spec.md section 4: C and the numpy reference give the same bytes for
the same seed and draw, the deterministic parts are exact, the stochastic rounding is unbiased
(averaged over many trials), scaler sharing gives at most 2N+1 levels, and every malformed
stream is refused with ValueError."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inceptionn.codecs import get_codec
from inceptionn.codecs import terngrad_reference as ref
from inceptionn.codecs._native import lib
from inceptionn.codecs.terngrad import encoded_size
from codec_checks import assert_decodes_like_reference_or_both_refuse

IMPLS = ["c", "numpy"]
PACKINGS = ["2bit", "base3"]


def f32(*vals):
    return np.array(vals, dtype=np.float32)


def bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def grads(rng, n, scale=1e-3):
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    x[rng.random(n) < 0.1] = 0.0
    return x


@pytest.fixture(params=["simd", "baseline"])
def kernels(request):
    """Run the C library with its AVX2 kernels (where the CPU has them) and with the baseline ones."""
    was = lib.tg_simd(1 if request.param == "simd" else 0)
    yield request.param
    lib.tg_simd(was)


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("clip", [2.5, None, 1.0])
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 9, 640, 641, 1283, 2048, 20000])
def test_c_and_numpy_bit_identical(packing, clip, n, kernels):
    rng = np.random.default_rng(n)
    x = grads(rng, n) * np.float32(10.0 ** rng.integers(-4, 3))
    seed = int(rng.integers(0, 2**64, dtype=np.uint64))
    codecs = {impl: get_codec("terngrad", packing=packing, clip=clip, seed=seed, impl=impl) for impl in IMPLS}
    for _ in range(3):  # the draw counter advances identically
        blobs = {impl: c.encode(x) for impl, c in codecs.items()}
        assert blobs["c"] == blobs["numpy"]
        assert len(blobs["c"]) == encoded_size(n, packing)
        for impl, c in codecs.items():
            np.testing.assert_array_equal(bits(c.decode(blobs["c"], n)), bits(ref.decode(blobs["c"], n)))
    assert codecs["c"].draw == codecs["numpy"].draw == 3 * math.ceil(n / 2)


def test_random_bits_are_splitmix64():
    # splitmix64's published outputs for seeds 0 and 1234567.
    assert int(ref.random_draws(0, 0, 1)[0]) == 0xE220A8397B1DCDAF
    assert ref.random_draws(1234567, 0, 3).tolist() == [6457827717110365317, 3203168211198807973,
                                                        9817491932198370423]
    np.testing.assert_array_equal(ref.random_draws(5, 10, 4)[2:], ref.random_draws(5, 12, 2))


@pytest.mark.parametrize("impl", IMPLS)
def test_known_bytes(impl):
    # No clipping and values in {0, +-S}: ternarization is deterministic. S = 1.0 = 0x3F800000.
    x = f32(1.0, -1.0, 0.0, 1.0, -1.0)
    head = bytes([0x54, 1, 0, 0, 0x00, 0x00, 0x80, 0x3F, 5, 0, 0, 0])
    c2 = get_codec("terngrad", clip=None, seed=3, impl=impl)
    # codes 01 11 00 01 | 11 (two's complement of t, value i in bits 2i+1..2i)
    assert c2.encode(x) == head + bytes([0b01_00_11_01, 0b11])
    c3 = get_codec("terngrad", packing="base3", clip=None, seed=3, impl=impl)
    # digits t+1 = 2,0,1,2,0 -> 81*2 + 27*0 + 9*1 + 3*2 + 0 = 177
    assert c3.encode(x) == bytes([0x54, 1, 1, 0, 0x00, 0x00, 0x80, 0x3F, 5, 0, 0, 0, 177])
    np.testing.assert_array_equal(c3.decode(c3.encode(x), 5), x)


@pytest.mark.parametrize("impl", IMPLS)
def test_clipping_and_scaler(impl):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(10001)).astype(np.float32)
    x[17] = 40.0  # an outlier far beyond 2.5 sigma
    c = get_codec("terngrad", impl=impl)
    sigma = float(np.std(x.astype(np.float64)))
    bound = ref.clip_bound(x, 2.5)
    assert bound == pytest.approx(2.5 * sigma, rel=1e-6)
    assert c.scaler(x) == float(bound)  # the outlier is clipped: scaler = bound, not 40
    assert get_codec("terngrad", clip=None, impl=impl).scaler(x) == 40.0
    y = c.decode(c.encode(x), x.size)
    assert set(np.unique(np.abs(y)).tolist()) == {0.0, float(bound)}
    # A constant tensor has sigma 0: the spec's clipping takes every value to 0.
    const = np.full(7, 0.5, np.float32)
    assert c.scaler(const) == 0.0
    assert not c.roundtrip(const).any()


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("clip", [2.5, None])
def test_unbiased_over_many_trials(packing, clip):
    """E[decode(encode(x))] = clip(x): the mean of T decodes is within a few standard errors."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(300) * 1e-2).astype(np.float32)
    x[:5] = [0.05, -0.05, 0.0, 1e-6, -1e-6]  # outliers (clipped when clip is on), zero, tiny
    c = get_codec("terngrad", packing=packing, clip=clip, seed=11)
    bound = ref.clip_bound(x, clip)
    target = np.clip(x, -bound, bound).astype(np.float64)
    trials = 4000
    acc = np.zeros(x.size)
    for _ in range(trials):
        acc += c.decode(c.encode(x), x.size)
    S = c.scaler(x)
    p = np.abs(target) / S
    se = S * np.sqrt(p * (1 - p) / trials)
    z = np.abs(acc / trials - target) / np.maximum(se, 1e-30)
    assert z.max() < 5.0
    assert np.mean(z**2) < 1.3  # the z-scores are ~N(0,1): mean square ~1, not just bounded
    assert acc[2] == 0.0  # a zero is always 0


def test_unbiased_with_a_larger_agreed_scaler():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(200) * 1e-2).astype(np.float32)
    c = get_codec("terngrad", clip=None, share_scaler=True, seed=5)
    S = 3.0 * c.local_stat(x)
    c.agree(S, 1)
    trials = 4000
    acc = np.zeros(x.size)
    for _ in range(trials):
        blob = c.encode(x)
        assert np.frombuffer(blob[4:8], np.float32)[0] == np.float32(S)
        acc += c.decode(blob, x.size)
    p = np.abs(x) / np.float32(S)
    se = np.float32(S) * np.sqrt(p * (1 - p) / trials)
    assert (np.abs(acc / trials - x) / se).max() < 5.0


def test_scaler_sharing_gives_2n_plus_1_levels():
    rng = np.random.default_rng(4)
    workers = [get_codec("terngrad", share_scaler=True) for _ in range(4)]
    assert all(w.needs_agreement for w in workers)
    assert not get_codec("terngrad").needs_agreement
    assert len({w.seed for w in workers}) == 4  # independent noise by default
    xs = [(rng.standard_normal(5000) * 10.0 ** -k).astype(np.float32) for k in range(4)]
    shared = max(w.local_stat(x) for w, x in zip(workers, xs))
    for w in workers:
        w.agree(shared, 7)
    assert workers[0].agreed_scaler == pytest.approx(shared) and workers[0].round_no == 7
    total = sum(w.decode(w.encode(x), x.size).astype(np.float64) for w, x in zip(workers, xs))
    levels = np.unique(np.round(total / np.float32(shared)))
    assert set(levels.tolist()) <= set(range(-4, 5))
    assert np.allclose(total / np.float32(shared), np.round(total / np.float32(shared)))
    # Without sharing, each worker's own scale: many more distinct sums.
    own = sum(w.decode(w.encode(x), x.size).astype(np.float64)
              for w, x in zip([get_codec("terngrad") for _ in range(4)], xs))
    assert len(np.unique(own)) > 9


def test_agreed_scaler_is_a_floor():
    x = f32(1.0, -1.0, 0.0, 1.0)
    c = get_codec("terngrad", clip=None, share_scaler=True, seed=1)
    c.agree(0.25, 1)  # below this tensor's own scaler (e.g. a ring partial sum)
    blob = c.encode(x)
    assert np.frombuffer(blob[4:8], np.float32)[0] == 1.0
    np.testing.assert_array_equal(c.decode(blob, 4), x)
    with pytest.raises(ValueError):
        c.agree(float("nan"), 2)
    with pytest.raises(ValueError):
        c.agree(-1.0, 2)
    plain = get_codec("terngrad", clip=None)
    plain.agree(100.0, 1)  # not sharing: ignored
    assert np.frombuffer(plain.encode(x)[4:8], np.float32)[0] == 1.0


def test_seeds_and_draws():
    x = (np.random.default_rng(0).standard_normal(1001) * 1e-3).astype(np.float32)
    a, b = get_codec("terngrad", seed=9), get_codec("terngrad", seed=9)
    assert a.encode(x) == b.encode(x)
    assert a.draw == 501
    assert a.encode(x) != get_codec("terngrad", seed=9).encode(x)  # next draws, new rounding
    assert get_codec("terngrad", seed=10).encode(x) != get_codec("terngrad", seed=9).encode(x)
    assert get_codec("terngrad").encode(x) != get_codec("terngrad").encode(x)  # fresh entropy


@pytest.mark.parametrize("packing,ratio", [("2bit", 16.0), ("base3", 20.0)])
def test_stream_size(packing, ratio):
    n = 100000
    blob = get_codec("terngrad", packing=packing).encode(np.ones(n, np.float32))
    assert len(blob) == 12 + math.ceil(n * 32 / ratio / 8)


def test_roundtrip_values_and_signs():
    rng = np.random.default_rng(2)
    x = grads(rng, 5000)
    for impl in IMPLS:
        c = get_codec("terngrad", impl=impl)
        y = c.roundtrip(x)
        S = c.scaler(x)
        assert set(np.unique(y).tolist()) <= {-S, 0.0, S}
        assert (y * x >= 0).all()  # never flips a sign
        assert not y[x == 0].any()


# --- malformed streams -------------------------------------------------------------------------

def _valid(packing="2bit", n=9):
    x = f32(*([0.5, -1.0, 0.0, 0.25] * 3)[:n])
    return get_codec("terngrad", packing=packing, clip=None, seed=2).encode(x), n


def _mutate(blob, i, v):
    b = bytearray(blob)
    b[i] = v
    return bytes(b)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("packing", PACKINGS)
def test_every_truncation_and_trailing_byte_refused(impl, packing):
    blob, n = _valid(packing)
    c = get_codec("terngrad", impl=impl)
    assert c.decode(blob, n).size == n
    for k in range(len(blob)):
        with pytest.raises(ValueError):
            c.decode(blob[:k], n)
    with pytest.raises(ValueError):
        c.decode(blob + b"\0", n)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_fields_refused(impl):
    c = get_codec("terngrad", impl=impl)
    blob2, n = _valid("2bit")
    blob3, _ = _valid("base3")
    bad = [
        _mutate(blob2, 0, 0x33),                       # magic
        _mutate(blob2, 1, 2),                          # version
        _mutate(blob2, 2, 2),                          # packing
        _mutate(blob2, 3, 1),                          # reserved
        blob2[:4] + f32(np.nan).tobytes() + blob2[8:],   # NaN scaler
        blob2[:4] + f32(np.inf).tobytes() + blob2[8:],   # inf scaler
        blob2[:4] + f32(-1.0).tobytes() + blob2[8:],     # negative scaler
        blob2[:4] + f32(-0.0).tobytes() + blob2[8:],     # sign bit set
        _mutate(blob2, 8, n + 1),                      # count
        _mutate(blob2, 11, 1),                         # count, high byte
        _mutate(blob2, 12, 0b10),                      # code 10
        _mutate(blob2, 14, 0b0100),                    # padding field of the last byte
        _mutate(blob3, 12, 243),                       # base-3 byte above 242
        _mutate(blob3, 13, 81 * 2 + 1),                # base-3 padding digit
        _mutate(blob3, 2, 0),                          # base-3 payload read as 2-bit: wrong size
    ]
    for i, b in enumerate(bad):
        with pytest.raises(ValueError):
            c.decode(b, n)
        print(i, "refused")
    with pytest.raises(ValueError):
        c.decode(blob2, n - 1)


def test_hostile_count_is_refused_before_allocating():
    c = get_codec("terngrad")
    with pytest.raises(ValueError, match="values take"):
        c.decode(b"\x54\x01\x00\x00" + bytes(8), 10**15)
    with pytest.raises(ValueError):
        c.decode(_valid()[0], 2**32 + 9)


@settings(max_examples=400, deadline=None)
@given(blob=st.binary(max_size=40), n=st.integers(0, 100), header=st.booleans(),
       scaler=st.one_of(st.just(0x3F000000), st.sampled_from([0x7F7FFFFF, 0x7F800000, 0x7FC00000, 1]),
                        st.integers(0, 2**32 - 1)))
def test_arbitrary_bytes_decode_or_raise_valueerror(blob, n, header, scaler):
    if header:  # a valid header (any scaler bits) so the payload checks get exercised
        packing = n % 2
        blob = bytes([0x54, 1, packing, 0]) + scaler.to_bytes(4, "little") + n.to_bytes(4, "little") + blob
    assert_decodes_like_reference_or_both_refuse("terngrad", blob, n)


# --- parameters -------------------------------------------------------------------------------

def test_bad_parameters():
    with pytest.raises(ValueError, match="packing"):
        get_codec("terngrad", packing="3bit")
    with pytest.raises(ValueError, match="clip"):
        get_codec("terngrad", clip=-1.0)
    with pytest.raises(ValueError, match="clip"):
        get_codec("terngrad", clip=float("inf"))
    with pytest.raises(TypeError, match="clip"):
        get_codec("terngrad", clip="2.5")
    with pytest.raises(ValueError, match="seed"):
        get_codec("terngrad", seed=-1)
    with pytest.raises(TypeError, match="seed"):
        get_codec("terngrad", seed=1.5)
    with pytest.raises(TypeError, match="share_scaler"):
        get_codec("terngrad", share_scaler=1)
    with pytest.raises(ValueError, match="impl"):
        get_codec("terngrad", impl="avx512")
    c = get_codec("terngrad")
    with pytest.raises(TypeError, match="float32"):
        c.encode(np.ones(4))
    with pytest.raises(ValueError, match="1-D"):
        c.encode(np.ones((2, 2), np.float32))
    for impl in IMPLS:
        with pytest.raises(ValueError, match="NaN or infinity"):
            get_codec("terngrad", impl=impl).encode(f32(1.0, np.nan))
        with pytest.raises(ValueError, match="NaN or infinity"):
            get_codec("terngrad", impl=impl).local_stat(f32(np.inf))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("packing", PACKINGS)
def test_bad_codes_in_long_streams_refused(impl, packing):
    """Long streams decode through a lookup table: its path must check every byte too."""
    n = 5003
    x = (np.random.default_rng(8).standard_normal(n)).astype(np.float32)
    blob = get_codec("terngrad", packing=packing, seed=1).encode(x)
    c = get_codec("terngrad", impl=impl)
    np.testing.assert_array_equal(bits(c.decode(blob, n)), bits(ref.decode(blob, n)))
    bad_code = 0b10 if packing == "2bit" else 250
    for at in (12, 12 + 700, len(blob) - 1):
        with pytest.raises(ValueError):
            c.decode(_mutate(blob, at, bad_code), n)
    pad = 0xFF if packing == "2bit" else 242  # n % 4 = 3 / n % 5 = 3: padding digits not 0
    with pytest.raises(ValueError):
        c.decode(_mutate(blob, len(blob) - 1, pad), n)


# --- inside the collective --------------------------------------------------------------------

def _ranks(world, fn):
    """Run fn(rank) in one thread per rank; re-raise the first failure."""
    import threading
    out, errors = [None] * world, []

    def run(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("share_scaler", [False, True])
def test_inside_the_collective(tmp_path, share_scaler):
    """Ring allreduce and WA with TernGrad in the app: the same result on every rank, unbiased."""
    from inceptionn.collective import FileStore, Group

    world, n, calls = 3, 2003, 60
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(n) * 1e-3).astype(np.float32) for _ in range(world)]
    truth = sum(x.astype(np.float64) for x in xs)

    def rank(r):
        codec = get_codec("terngrad", clip=None, share_scaler=share_scaler, seed=100 + r)
        with Group(r, world, FileStore(tmp_path), bind_addr="127.0.0.1", codec=codec,
                   compress="app", timeout=60) as g:
            ring = [g.allreduce(xs[r].copy()) for _ in range(calls)]
            wa = g.wa_step(xs[r].copy(), lambda s: s)
        return ring, wa

    results = _ranks(world, rank)
    for ring, wa in results[1:]:
        for a, b in zip(ring, results[0][0]):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(wa, results[0][1])
    mean = np.mean(results[0][0], axis=0)
    assert np.sum((mean - truth) ** 2) / np.sum(truth**2) < 0.15  # one call: ~3; unbiased: /calls
