"""THC (docs/spec.md section 6): the C library and the numpy reference bit for bit, the offline table,
the randomized Hadamard transform, unbiased stochastic quantization, the homomorphic sum and its
overflow limits, error feedback, and refusal of malformed blobs."""
import itertools
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inceptionn.codecs import ErrorFeedback, get_codec
from inceptionn.codecs import thc_reference as ref
from inceptionn.codecs import thc_table_generator as gen
from inceptionn.codecs.thc import round_seed
from inceptionn.codecs.thc_table_generated import TABLES
from codec_checks import assert_decodes_like_reference_or_both_refuse

IMPLS = ["c", "numpy"]
PAPER_TABLE = (0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 21, 23, 25, 27, 30)


def grads(rng, n, scale=0.01):
    return (rng.standard_normal(n) * scale * rng.lognormal(0, 1, n)).astype(np.float32)


def codecs(workers, **kw):
    kw.setdefault("seed", 1234)
    return [get_codec("thc", noise_seed=100 + w, **kw) for w in range(workers)]


def run_round(cs, xs, round_no=0):
    shared = max(c.local_stat(x) for c, x in zip(cs, xs))
    for c in cs:
        c.agree(shared, round_no)
    return [c.encode(x) for c, x in zip(cs, xs)]


# --- the offline table --------------------------------------------------------------------------

def test_default_table_is_the_optimal_one():
    c = get_codec("thc")
    assert (c.bits, c.granularity, c.p) == (4, 30, 1 / 32)
    assert c.table == PAPER_TABLE == gen.optimal_table(4, 30, 1 / 32)


@pytest.mark.parametrize("bits,g,p", [(2, 10, 1 / 32), (2, 13, 1 / 8), (3, 12, 1 / 64), (3, 14, 1 / 512)])
def test_table_solver_matches_brute_force(bits, g, p):
    levels = 1 << bits
    cands = [(0,) + c + (g,) for c in itertools.combinations(range(1, g), levels - 2)]
    costs = [gen.expected_variance(t, g, p) for t in cands]
    best = min(costs)
    got = gen.optimal_table(bits, g, p)
    assert gen.expected_variance(got, g, p) == pytest.approx(best, rel=1e-12)


def test_shipped_tables_equal_a_fresh_computation():
    assert gen.render(gen.shipped_tables()) == (Path(gen.__file__).parent / gen.GENERATED).read_text()
    for (bits, g, p), t in TABLES.items():
        assert len(t) == 1 << bits and t[0] == 0 and t[-1] == g and all(a < b for a, b in zip(t, t[1:]))


def _all_shipped_costs():
    for bits in gen.SHIPPED_BITS:
        for g in range((1 << bits) - 1, gen.SHIPPED_MAX_GRANULARITY + 1):
            for p in gen.SHIPPED_P:
                if bits > 1:
                    yield (bits, g, p), gen.interval_costs(g, p)


def test_ties_and_distinct_optima_are_far_apart():
    """Why the canonical choice cannot flip with the CPU: at every level the solver places, the
    candidates it treats as tied are within 1e-12 of the best objective (float noise: mirror
    images), and the others at least 1e-7 worse, far on either side of TIE_TOLERANCE."""
    worst_tie, closest_other = 0.0, np.inf
    for (bits, g, p), cost in _all_shipped_costs():
        levels = 1 << bits
        tail = [np.full(g + 1, np.inf)]
        tail[0][g] = 0.0
        for _ in range(levels - 1):
            tail.append(np.min(cost + tail[-1][None, :], axis=1))
        best = tail[-1][0]
        spent, table = 0.0, TABLES[(bits, g, p)]
        for here, nxt, left in zip(table, table[1:], range(levels - 2, -1, -1)):
            excess = (spent + cost[here] + tail[left]) / best - 1.0
            excess = excess[np.isfinite(excess)]
            worst_tie = max(worst_tie, excess[excess < gen.TIE_TOLERANCE].max())
            others = excess[excess >= gen.TIE_TOLERANCE]
            closest_other = min(closest_other, others.min()) if others.size else closest_other
            spent += cost[here, nxt]
    assert worst_tie < 1e-12 and closest_other > 1e-7, (worst_tie, closest_other)


@pytest.mark.parametrize("seed", range(3))
def test_tables_survive_rounding_noise_in_the_objective(seed):
    """Every shipped table comes out the same when each interval cost moves by a few ulps (what
    another exp, another BLAS kernel for the quadrature nodes, or another summation order does)."""
    rng = np.random.default_rng(seed)
    for key, cost in _all_shipped_costs():
        noisy = cost * (1.0 + rng.uniform(-8, 8, cost.shape) * np.finfo(np.float64).eps)
        assert gen.canonical_table(noisy, 1 << key[0]) == TABLES[key], key


def test_tables_from_another_summation_order():
    """The quadrature summed in reverse node order (a different rounding of every cost)."""
    nodes, weights = gen._GL_NODES, gen._GL_WEIGHTS
    try:
        gen._GL_NODES, gen._GL_WEIGHTS = nodes[::-1].copy(), weights[::-1].copy()
        assert gen.shipped_tables() == TABLES
    finally:
        gen._GL_NODES, gen._GL_WEIGHTS = nodes, weights


def test_tables_with_numpy_simd_and_blas_kernels_limited():
    """The shipped file, regenerated in a process whose numpy runs its baseline (no AVX2/AVX-512
    exp) and whose OpenBLAS runs its oldest x86-64 kernels (the quadrature nodes' eigensolver)."""
    import os
    import subprocess
    import sys
    import numpy
    found = numpy._core._multiarray_umath.__cpu_features__
    dispatched = [f for f in numpy._core._multiarray_umath.__cpu_dispatch__ if found.get(f)]
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=" ".join(dispatched), OPENBLAS_CORETYPE="Prescott")
    code = ("import numpy, sys; from inceptionn.codecs import thc_table_generator as gen; "
            "sys.stdout.write(gen.render(gen.shipped_tables()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout == (Path(gen.__file__).parent / gen.GENERATED).read_text()


def test_t_p_does_not_follow_the_last_bit_of_log(monkeypatch):
    """t_p (and through it the header's range and the codec_id ranks compare) stays the same
    float when the inverse CDF's log rounds its last bits differently."""
    from statistics import NormalDist
    exact = {p: gen.t_p(p) for p in gen.SHIPPED_P + (0.01, 0.05, 0.1)}
    real = NormalDist.inv_cdf
    for ulps in (-4, -1, 1, 4):
        monkeypatch.setattr(NormalDist, "inv_cdf", lambda self, q, u=ulps: real(self, q) * (1 + u * 2.0**-52))
        assert {p: gen.t_p(p) for p in exact} == exact, ulps


def test_nonuniform_table_beats_the_uniform_grid():
    # On g = 30 the uniform 16 levels are every other grid point.
    assert gen.expected_variance(PAPER_TABLE, 30, 1 / 32) < gen.expected_variance(tuple(range(0, 31, 2)), 30, 1 / 32)


def test_unshipped_combination_is_computed():
    c = get_codec("thc", bits=5, granularity=70, p=0.01)
    assert c.table == gen.optimal_table(5, 70, 0.01) and len(c.table) == 32


# --- transform ------------------------------------------------------------------------------------

def test_fwht_is_the_hadamard_matrix():
    h = np.array([[1.0]])
    for _ in range(6):
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(ref.fwht(x), h @ x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d", [1, 2, 8, 1024, 65536])
def test_rht_c_equals_reference_and_inverts(d):
    from inceptionn.codecs._native import ffi, lib
    x = np.random.default_rng(d).standard_normal(d).astype(np.float32)
    y = x.copy()
    lib.thc_rht(ffi.cast("float *", ffi.from_buffer(y)), d, 77)
    r = ref.rht(x, 77)
    np.testing.assert_array_equal(y.view(np.uint32), r.view(np.uint32))
    assert np.linalg.norm(r) == pytest.approx(np.linalg.norm(x), rel=1e-5)
    np.testing.assert_allclose(ref.irht(r, 77), x, atol=1e-5)


# --- bit identity C vs numpy ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 3, 31, 1000, 4097])
@pytest.mark.parametrize("params", [dict(), dict(bits=2, table="uniform"), dict(bits=3, granularity=12),
                                    dict(bits=8, granularity=255, table="uniform"), dict(bits=1, granularity=5)])
def test_c_and_numpy_bit_identical(n, params):
    rng = np.random.default_rng(n)
    x = grads(rng, n)
    c, r = (get_codec("thc", impl=i, **params) for i in IMPLS)
    M = c.range_for(float(np.linalg.norm(x)), n)
    blob = c.encode_with(x, M, 99, 123456789)
    assert blob == r.encode_with(x, M, 99, 123456789)
    for codec in (c, r):
        np.testing.assert_array_equal(codec.decode(blob, n).view(np.uint32), r.decode(blob, n).view(np.uint32))
        np.testing.assert_array_equal(codec.decode_rotated(blob, n).view(np.uint32),
                                      r.decode_rotated(blob, n).view(np.uint32))
    other = c.encode_with(x * 2, M, 99, 5)
    s = c.sum_encoded([blob, other, blob], width=16)
    assert s == r.sum_encoded([blob, other, blob], width=16)
    np.testing.assert_array_equal(c.decode_sum(s, n).view(np.uint32), r.decode_sum(s, n).view(np.uint32))


@pytest.mark.parametrize("n", [1, 3, 1000, 4097, 250_000])
@pytest.mark.parametrize("params", [dict(), dict(bits=2, table="uniform"), dict(bits=8, granularity=255,
                                                                             table="uniform")])
def test_ring_fast_path_writes_what_encode_sum_and_decode_write(n, params):
    """The ring's one-pass hop (codecs_c/thc_codec.c, "in the ring"): thc_rotate_unscaled + thc_quantize +
    thc_pack_indices write thc_encode's blob; thc_add_indices writes thc_sum's bytes of a received
    blob plus those indices; thc_decode_rotated_sum is the rotated mean times the count, and
    thc_unrotate the first n values of thc_irht; the rounding residual left by thc_quantize, inverse-
    rotated, is x - decode(blob) up to float rounding. SIMD and portable paths alike."""
    from inceptionn.codecs._native import ffi, lib
    rng = np.random.default_rng(n)
    x, other = grads(rng, n), grads(rng, n)
    c = get_codec("thc", impl="c", **params)
    M = c.range_for(float(np.linalg.norm(x)), n)
    blob = c.encode_with(x, M, 99, 4242)
    d = ref.padded_dim(n)
    f = lambda a: ffi.cast("float *", ffi.from_buffer(a))      # noqa: E731
    u = lambda a: ffi.cast("uint8_t *", ffi.from_buffer(a))    # noqa: E731
    work, z = np.empty(d, np.float32), np.empty(d, np.uint8)
    table = ffi.new("uint8_t[]", list(c.table))
    assert lib.thc_rotate_unscaled(f(x), n, d, 99, f(work)) == 0
    assert lib.thc_quantize(f(work), d, lib.thc_rht_scale(d), M, 4242, c.bits, c.granularity, table, u(z)) == 0
    out = np.zeros(len(blob), np.uint8)
    assert lib.thc_pack_indices(u(z), d, M, 99, c.bits, c.granularity, table, u(out), len(out)) == len(blob)
    assert out.tobytes() == blob
    resid = np.empty(n, np.float32)
    assert lib.thc_unrotate(f(work), d, 99, f(resid), n) == 0
    np.testing.assert_allclose(resid, x - c.decode(blob, n), rtol=0, atol=1e-6 * M * np.sqrt(d))
    received = c.sum_encoded([c.encode_with(other, M, 99, 1), c.encode_with(x, M, 99, 2)], width=16)
    for src, count in ((c.encode_with(other, M, 99, 1), 1), (received, 2)):
        for width in (8, 16, 32):
            if (count + 1) * c.granularity >= 1 << width:
                continue
            want = c.sum_encoded([src, blob], width=width)
            got = np.zeros(len(want), np.uint8)
            assert lib.thc_add_indices(src, len(src), u(z), d, width, u(got), len(got), ffi.NULL) == len(want)
            assert got.tobytes() == want
            rot = np.empty(d, np.float32)
            assert lib.thc_decode_rotated_sum(want, len(want), n, f(rot), ffi.NULL) == 0
            mean = c.decode_rotated(want, n)
            np.testing.assert_array_equal(rot, mean * np.float32(count + 1))
            full = rot.copy()
            lib.thc_irht(f(full), d, 99)
            part = rot.copy()
            lib.thc_unrotate(f(part), d, 99, f(resid), n)
            np.testing.assert_array_equal(resid.view(np.uint32), full[:n].view(np.uint32))
    bad = z.copy()
    bad[d // 2] = 1 << c.bits if c.bits < 8 else 0
    if c.bits < 8:
        got = np.zeros(len(blob) * 8, np.uint8)
        assert lib.thc_add_indices(blob, len(blob), u(bad), d, 16, u(got), len(got), ffi.NULL) == lib.THC_E_ARG


def test_same_noise_seed_same_bytes_through_the_full_api():
    x = grads(np.random.default_rng(5), 3000)
    a = get_codec("thc", noise_seed=7, impl="c").encode(x)
    b = get_codec("thc", noise_seed=7, impl="numpy").encode(x)
    assert a == b


def test_known_blob():
    c = get_codec("thc", error_feedback=False)
    blob = c.encode_with(np.zeros(3, np.float32), 1.0, 0x0102030405060708, 5)
    head = bytes([0x54, 1, 0, 4, 30, 4, 2, 0]) + struct.pack("<If", 1, 1.0) + bytes(range(8, 0, -1))
    assert blob == head + bytes(PAPER_TABLE) + b"\x77\x77"  # y = g/2 = 15 = T[7]: always index 7
    assert c.decode(blob, 3).tolist() == [0.0, 0.0, 0.0]
    assert c.info(blob)["table"] == PAPER_TABLE


def test_blob_size_counts_padding_header_and_table():
    c = get_codec("thc")
    n = 100_000
    x = grads(np.random.default_rng(1), n)
    assert len(c.encode(x)) == c.encoded_size(x) == c.max_encoded_size(n) == 24 + 16 + 131072 // 2


# --- unbiasedness -------------------------------------------------------------------------------------

@pytest.mark.parametrize("table", ["nonuniform", "uniform"])
def test_unbiased_within_the_clamp_range(table):
    """Averaging many independent roundings converges to the input: with l = 3 ||x|| nothing is
    clamped (M is 6.5 standard deviations of a rotated coordinate)."""
    rng = np.random.default_rng(11)
    n, trials = 200, 3000
    x = grads(rng, n, 1.0)
    c = get_codec("thc", table=table, error_feedback=False, noise_seed=3,
                  **({} if table == "nonuniform" else {"bits": 4}))
    c.agree(3 * float(np.linalg.norm(x)), 0)
    acc = np.zeros(n)
    for _ in range(trials):
        acc += c.decode(c.encode(x), n)
    mean = acc / trials
    # One draw per rotated coordinate has std <= gap/2 * 2M/g; the inverse RHT is orthonormal.
    M = float(c.range_for(3 * np.linalg.norm(x), n))
    gap = max(np.diff(c.table))
    sigma = gap / 2 * 2 * M / c.granularity / np.sqrt(trials)
    assert np.abs(mean - x).max() < 5 * sigma
    # And it is not trivially loose: the error of a single draw is far larger.
    single = c.decode(c.encode(x), n)
    assert np.abs(single - x).max() > 10 * np.abs(mean - x).max()


def test_unbiased_to_the_clamped_value_in_the_rotated_domain():
    rng = np.random.default_rng(12)
    n, trials = 256, 3000
    x = grads(rng, n, 1.0)
    c = get_codec("thc", error_feedback=False, noise_seed=4, p=0.2)  # p = 0.2: many clamped
    M = c.range_for(float(np.linalg.norm(x)), n)
    clamped = np.clip(ref.rht(x, 5), -M, M)
    assert (np.abs(ref.rht(x, 5)) > M).sum() > 20
    acc = np.zeros(n)
    for t in range(trials):
        acc += c.decode_rotated(c.encode_with(x, M, 5, 1000 + t), n)
    sigma = 3 / 2 * 2 * M / 30 / np.sqrt(trials)
    assert np.abs(acc / trials - clamped).max() < 5 * sigma


# --- the homomorphic sum --------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n", [1, 1000, 5000])
def test_sum_decodes_to_the_mean_of_the_decodes(impl, n):
    rng = np.random.default_rng(n)
    xs = [grads(rng, n) * (w + 1) for w in range(8)]
    cs = codecs(8, impl=impl)
    blobs = run_round(cs, xs)
    summed = cs[0].sum_encoded(blobs)
    assert cs[0].info(summed)["width"] == 8 and cs[0].info(summed)["count"] == 8
    mean = cs[0].decode_sum(summed, n, count=8)
    individual = np.mean([cs[0].decode(b, n) for b in blobs], axis=0, dtype=np.float64)
    M = cs[0].info(blobs[0])["range"]
    # Exactly equal in exact arithmetic; float32 rounding of the rotated values and the RHT only.
    np.testing.assert_allclose(mean, individual, rtol=0, atol=1e-6 * M * np.sqrt(ref.padded_dim(n)))
    rot = np.mean([cs[0].decode_rotated(b, n) for b in blobs], axis=0, dtype=np.float64)
    np.testing.assert_allclose(cs[0].decode_rotated(summed, n), rot, rtol=0, atol=1e-6 * M)
    s = cs[0].decode_sum(summed, n, reduce="sum")
    np.testing.assert_allclose(s, mean * 8, rtol=1e-6, atol=1e-9)


def test_sum_is_order_free_and_ring_steps_compose():
    rng = np.random.default_rng(3)
    xs = [grads(rng, 777) for _ in range(5)]
    cs = codecs(5)
    blobs = run_round(cs, xs, round_no=9)
    c = cs[0]
    whole = c.sum_encoded(blobs, width=16)
    assert c.sum_encoded(blobs[::-1], width=16) == whole
    partial = c.sum_encoded(blobs[:1], width=16)
    for b in blobs[1:]:  # a ring: each peer adds its own blob to the partial sum it received
        partial = c.sum_encoded([partial, b], width=16)
    assert partial == whole


def test_overflow_limits():
    rng = np.random.default_rng(4)
    xs = [grads(rng, 64) for _ in range(9)]
    cs = codecs(9)
    blobs = run_round(cs, xs)
    c = cs[0]
    assert c.max_workers(8) == 8 and c.max_workers(16) == 2184  # floor(255/30), floor(65535/30)
    c.sum_encoded(blobs[:8], width=8)
    with pytest.raises(ValueError, match="overflow.*at most 8"):
        c.sum_encoded(blobs, width=8)
    assert c.info(c.sum_encoded(blobs))["width"] == 16  # the smallest width that holds 9
    eight = c.sum_encoded(blobs[:8], width=8)
    with pytest.raises(ValueError, match="overflow"):
        c.sum_encoded([eight, blobs[8]], width=8)
    assert c.info(c.sum_encoded([eight, blobs[8]], width=16))["count"] == 9
    u = get_codec("thc", bits=4, table="uniform")  # g = 15: 17 workers in 8 bits
    assert u.max_workers(8) == 17
    with pytest.raises(ValueError, match="width"):
        c.sum_encoded(blobs[:2], width=12)


def test_sum_refuses_mismatched_blobs():
    rng = np.random.default_rng(6)
    x = grads(rng, 100)
    a, b = codecs(2)
    a.agree(1.0, 0)
    b.agree(1.0, 1)  # another round: another rotation
    with pytest.raises(ValueError, match="differ"):
        a.sum_encoded([a.encode(x), b.encode(x)])
    b.agree(2.0, 0)  # another range
    with pytest.raises(ValueError, match="differ"):
        a.sum_encoded([a.encode(x), b.encode(x)])
    with pytest.raises(ValueError, match="differ|dimension"):
        a.sum_encoded([a.encode(x), a.encode(grads(rng, 300))])
    with pytest.raises(ValueError, match="expects a summed"):
        a.decode_sum(a.encode(x), 100)
    with pytest.raises(ValueError, match="holds 1 contributions, expected 2"):
        a.decode_sum(a.sum_encoded([a.encode(x)]), 100, count=2)


def test_round_seed_is_shared():
    assert round_seed(5, 3) == round_seed(5, 3) != round_seed(5, 4)
    a, b = codecs(2)
    for c in (a, b):
        c.agree(1.0, 3)
    x = grads(np.random.default_rng(0), 10)
    assert a.info(a.encode(x))["seed"] == b.info(b.encode(x))["seed"] == round_seed(1234, 3)


# --- error feedback -------------------------------------------------------------------------------------

def test_error_feedback_carries_the_residual():
    rng = np.random.default_rng(8)
    n = 3000
    c = get_codec("thc", noise_seed=1, p=0.3)  # heavy clamping: a biased quantizer
    plain = get_codec("thc", noise_seed=1, p=0.3, error_feedback=False)
    assert c.wants_error_feedback and not plain.wants_error_feedback
    mem = ErrorFeedback()
    sent, got, got_plain = np.zeros(n), np.zeros(n), np.zeros(n)
    for r in range(30):
        x = grads(rng, n)
        sent += x
        c.agree(c.local_stat(mem.compensate("g", x)), r)     # l = ||x + e||
        got += c.decode(mem.encode(c, x, "g"), n)
        plain.agree(plain.local_stat(x), r)
        got_plain += plain.decode(plain.encode(x), n)
    residual = mem.residual("g")
    # What was sent and not yet delivered is exactly the residual (up to float32 rounding).
    np.testing.assert_allclose(got + residual, sent, atol=1e-5 * np.abs(sent).max())
    assert np.linalg.norm(got - sent) < 0.5 * np.linalg.norm(got_plain - sent)


def test_error_feedback_memory_can_be_shared_and_keyed():
    mem = ErrorFeedback()
    c = get_codec("thc")
    x = grads(np.random.default_rng(2), 50)
    mem.encode(c, x, "layer1")
    mem.encode(c, x, "layer2")
    assert len(mem) == 2
    r1 = mem.residual("layer1").copy()
    blob = mem.encode(c, np.zeros(50, np.float32), "layer1")  # sends the residual alone
    np.testing.assert_allclose(mem.residual("layer1"), r1 - c.decode(blob, 50), atol=1e-7)
    mem.reset()
    assert len(mem) == 0


def test_local_stat_of_the_compensated_vector_is_its_norm():
    c = get_codec("thc")
    mem = ErrorFeedback()
    x = grads(np.random.default_rng(2), 500)
    assert c.local_stat(x) == pytest.approx(np.linalg.norm(x.astype(np.float64)))
    mem.encode(c, x, "k")
    assert c.local_stat(mem.compensate("k", x)) == pytest.approx(
        np.linalg.norm(x.astype(np.float64) + mem.residual("k")), rel=1e-6)


# --- malformed input ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def valid():
    c = get_codec("thc", noise_seed=1, error_feedback=False)
    x = grads(np.random.default_rng(0), 37)
    c.agree(c.local_stat(x), 0)
    blob = c.encode(x)
    return blob, c.sum_encoded([blob, c.encode(x)])


@pytest.mark.parametrize("impl", IMPLS)
def test_malformed_blobs_raise_valueerror(impl, valid):
    blob, summed = valid
    c = get_codec("thc", impl=impl)
    for cut in range(len(blob)):
        with pytest.raises(ValueError, match="THC"):
            c.decode(blob[:cut], 37)
    with pytest.raises(ValueError):
        c.decode(blob + b"\0", 37)
    for off, val in [(0, 0), (1, 2), (2, 7), (3, 0), (4, 14), (5, 3), (6, 9), (7, 1), (8, 2), (24, 1), (30, 30)]:
        bad = bytearray(blob)
        bad[off] = val
        with pytest.raises(ValueError):
            c.decode(bytes(bad), 37)
    nan = bytearray(blob)
    nan[12:16] = np.float32(np.nan).tobytes()
    with pytest.raises(ValueError):
        c.decode(bytes(nan), 37)
    with pytest.raises(ValueError):
        c.decode(blob, 65)  # wrong padded dimension
    over = bytearray(summed)
    over[-1] = 61  # 2 * 30 = 60
    with pytest.raises(ValueError):
        c.decode(bytes(over), 37)
    with pytest.raises(ValueError):
        c.sum_encoded([bytes(over)])


# CI's fuzz finding (issue 11): M = 1.55e38 with d = 4; the inverse transform summed it to inf.
FOUND_RANGE_OVERFLOW = bytes.fromhex("54010002030202000100000" "03ee4e97eafcd1d7b30a820e2000102035f")


def all_top_blob(range_: np.float32) -> bytes:
    """d = 4, b = 2, g = 3, every index 3: the largest partial sum (4 M) any payload gives."""
    return ref.header(ref.KIND_INDEX, 2, 3, 2, 2, 1, range_, 7, [0, 1, 2, 3]) + b"\xff"


@pytest.mark.parametrize("impl", IMPLS)
def test_range_above_fltmax_over_d_is_refused(impl):
    c = get_codec("thc", impl=impl)
    with pytest.raises(ValueError, match="range"):
        c.decode(FOUND_RANGE_OVERFLOW, 3)
    with pytest.raises(ValueError, match="range"):
        c.info(FOUND_RANGE_OVERFLOW)
    edge = np.float32(np.finfo(np.float32).max / 4)
    y = c.decode(all_top_blob(edge), 4)
    assert np.isfinite(y).all() and abs(y).max() == np.finfo(np.float32).max / 2
    with pytest.raises(ValueError, match="range"):
        c.decode(all_top_blob(np.nextafter(edge, np.float32(np.inf))), 4)
    with pytest.raises(ValueError, match="range"):
        c.encode_with(np.ones(4, np.float32), np.nextafter(edge, np.float32(np.inf)), 1, 2)
    assert c.decode(c.encode_with(np.ones(4, np.float32), edge, 1, 2), 4).size == 4


def test_hostile_count_is_refused_before_allocating(valid):
    c = get_codec("thc")
    with pytest.raises(ValueError):
        c.decode(valid[0], 10**12)
    with pytest.raises(ValueError):
        c.decode(valid[0], 2**31 + 1)


@settings(max_examples=400, deadline=None)
@given(blob=st.binary(max_size=90), n=st.integers(0, 70), prefix=st.booleans())
def test_arbitrary_bytes_decode_or_raise_valueerror(blob, n, prefix):
    if prefix:  # get past the magic and version often enough to reach the deeper checks
        blob = bytes([0x54, 1]) + blob
    assert_decodes_like_reference_or_both_refuse("thc", blob, n)


@settings(max_examples=300, deadline=None)
@given(mbits=st.one_of(st.integers(0x7E000000, 0x7F7FFFFF), st.integers(0, 2**32 - 1)),
       log2d=st.integers(0, 7), seed=st.integers(0, 2**64 - 1), data=st.data())
def test_any_range_and_payload_decode_finite_or_raise(mbits, log2d, seed, data):
    """Well-formed index blobs with any range bits (dense near FLT_MAX, where CI's finding was)
    and any indices: C and numpy agree, and a decode is finite or a ValueError."""
    d = 1 << log2d
    z = np.array(data.draw(st.lists(st.integers(0, 3), min_size=d, max_size=d)))
    M = np.uint32(mbits).view(np.float32)
    blob = ref.header(ref.KIND_INDEX, 2, 3, 2, log2d, 1, M, seed, [0, 1, 2, 3]) + ref.pack_bits(z, 2)
    assert_decodes_like_reference_or_both_refuse("thc", blob, d)


# --- API --------------------------------------------------------------------------------------------------

def test_api_refuses_bad_parameters_and_input():
    with pytest.raises(ValueError, match="bits"):
        get_codec("thc", bits=9)
    with pytest.raises(TypeError, match="bits"):
        get_codec("thc", bits=4.0)
    with pytest.raises(ValueError, match="granularity"):
        get_codec("thc", granularity=14)
    with pytest.raises(ValueError, match="granularity 2\\^bits - 1"):
        get_codec("thc", table="uniform", granularity=30)
    with pytest.raises(ValueError, match="p "):
        get_codec("thc", p=0)
    with pytest.raises(ValueError, match="table"):
        get_codec("thc", table="fancy")
    with pytest.raises(ValueError, match="lookup table"):
        get_codec("thc", table=list(range(15)) + [29])
    with pytest.raises(ValueError, match="impl"):
        get_codec("thc", impl="gpu")
    with pytest.raises(TypeError, match="error_feedback"):
        get_codec("thc", error_feedback="yes")
    c = get_codec("thc")
    with pytest.raises(TypeError, match="float32"):
        c.encode(np.zeros(4))
    with pytest.raises(ValueError, match="non-finite"):
        c.encode(np.array([1, np.nan], np.float32))
    with pytest.raises(ValueError, match="agreed norm"):
        c.agree(float("inf"), 0)
    with pytest.raises(ValueError, match="round_no"):
        c.agree(1.0, -1)
    with pytest.raises(TypeError, match="sequence"):
        c.sum_encoded(b"abc")
    custom = get_codec("thc", table=list(range(0, 31, 2)))
    assert custom.table_kind == "custom"
    x = grads(np.random.default_rng(0), 10)
    assert custom.roundtrip(x).shape == (10,)
