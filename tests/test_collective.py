"""The collectives over real sockets between real processes on loopback (no soft NIC: tagged
sockets pass raw, which is exactly the case the ring must also get right).

Each multi-rank test forks ``world`` processes, each builds a Group (FileStore rendezvous) and
runs a function; results come back through a queue. Expected values are computed here with the
same float32 operations in the same order, so most comparisons are bit for bit.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue as queue_mod
import shutil
import tempfile
import time

import numpy as np
import pytest

from inceptionn.codecs import Codec, available_codecs, get_codec
from inceptionn.codecs.base import Float32StreamCodec
from inceptionn.collective import scaling as sc
from inceptionn.collective import FileStore, Group
from inceptionn.codecs.blockscale import BLOCK_VALUES, wire_values
from inceptionn.collective.ring import block_bounds, chunk_list

CODEC = get_codec("inceptionn", error_bound=-10)


# --- running ranks -----------------------------------------------------------------------------

def _child(q, rank, world, store_dir, fn, args, group_kw):
    try:
        kw = dict(bind_addr="127.0.0.1", timeout=60)
        kw.update(group_kw)
        with Group(rank, world, FileStore(store_dir, timeout=60), **kw) as g:
            q.put((rank, True, fn(g, rank, *args)))
    except BaseException as e:  # noqa: BLE001
        q.put((rank, False, f"{type(e).__name__}: {e}"))


def run_ranks(world, fn, *args, timeout=120, group_kw=None, expect_ok=True):
    """Run fn(group, rank, *args) in ``world`` forked processes; returns [(ok, value)] by rank."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    d = tempfile.mkdtemp(prefix="inc-coll-")
    procs = [ctx.Process(target=_child, args=(q, r, world, d, fn, args, group_kw or {}), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        deadline = time.monotonic() + timeout
        while len(results) < world:
            try:
                rank, ok, value = q.get(timeout=0.5)
                results[rank] = (ok, value)
                continue
            except queue_mod.Empty:
                pass
            if all(not p.is_alive() for p in procs):   # a rank that exited without a word
                for r, p in enumerate(procs):
                    results.setdefault(r, (False, f"exited with code {p.exitcode}"))
            elif time.monotonic() > deadline:
                raise AssertionError(f"ranks {sorted(set(range(world)) - set(results))} did not finish "
                                     f"in {timeout}s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(d, ignore_errors=True)
    out = [results[r] for r in range(world)]
    if expect_ok:
        bad = [(r, v) for r, (ok, v) in enumerate(out) if not ok]
        assert not bad, bad
        return [v for _, v in out]
    return out


def data(rank: int, n: int, scale=0.01, seed=0) -> np.ndarray:
    return (np.random.default_rng([seed, rank]).standard_normal(n) * scale).astype(np.float32)


def same_bits(arrays) -> bool:
    return all(a.shape == arrays[0].shape and np.array_equal(a.view(np.uint32), arrays[0].view(np.uint32))
               for a in arrays)


# --- what the collectives must compute ---------------------------------------------------------

def nearest(v, codec=CODEC):
    """The value the codec represents nearest to each of ``v`` (|v| < 1; ties toward zero), from
    its tiers (docs/spec.md section 1): 0; multiples of 2^-7 from 2^max(k, -7); multiples of
    2^-15 from the 16-bit tier's start."""
    k = codec.error_bound
    t16 = 2.0 ** (k + (-k + 1) // 2)
    a = np.abs(v.astype(np.float64))
    lo = np.where(a >= t16, np.floor(a * 2**15) / 2**15,
                  np.where(a >= 2.0 ** max(k, -7), np.floor(a * 2**7) / 2**7, 0.0))
    hi = np.where(lo == 0, 2.0 ** max(k, -7), lo + np.where(lo < t16, 2.0**-7, 2.0**-15))
    r = np.where((hi < 1) & (hi - a < a - lo), hi, lo)
    r = np.where(a < 1, r, a)
    return (np.sign(v) * r).astype(np.float32) + np.float32(0)


def hop(acc, mode, scaling, codec=CODEC):
    """What the receiver of a partial sum ``acc`` (one pipeline chunk) gets: per block of
    BLOCK_VALUES, the sender's exponent from the block's max (frexp), the scaled values rounded
    to the nearest value the codec represents, times 2^-s at the receiver (wire format v2);
    without scaling the codec's reconstruction ('nic') or decode(encode()) ('app') of the values."""
    if mode == "raw":
        return acc.copy()
    if not scaling:
        return codec.reconstruct(acc) if mode == "nic" else codec.roundtrip(acc)
    out = np.empty_like(acc)
    for i in range(0, acc.size, BLOCK_VALUES):
        blk = acc[i:i + BLOCK_VALUES]
        m = float(np.abs(blk).max())
        s = 0 if m == 0 or not np.isfinite(m) else min(max(-math.frexp(m)[1], -126), 126)
        q = nearest((blk * np.float32(2.0**s)).astype(np.float32), codec)
        assert np.array_equal(codec.reconstruct(q).view(np.uint32), q.view(np.uint32))   # a fixed point
        out[i:i + BLOCK_VALUES] = q * np.float32(2.0**-s)
    return out


def ring_expected(xs, mode, scaling=True, codec=CODEC, chunk=65536):
    """The ring's result on loopback: phase-1 sums in ring order (block b starts at rank b, each
    next rank adds its own values to what it received from the last hop), then what the owner's
    payload decodes to. With or without soft NICs on the way: the values on the wire are fixed
    points of the codec."""
    world, n = len(xs), xs[0].size
    out = np.empty(n, dtype=np.float32)
    for b, (lo, hi) in enumerate(block_bounds(n, world)):
        for a, e in chunk_list(lo, hi, chunk):
            acc = xs[b][a:e].copy()
            for j in range(1, world):
                acc = xs[(b + j) % world][a:e] + hop(acc, mode, scaling, codec)
            out[a:e] = hop(acc, mode, scaling, codec)
    return out


def wa_expected(xs, mode, scaling=True, codec=CODEC, chunk=65536):
    total = xs[0].copy()
    for r in range(1, len(xs)):
        for a, e in chunk_list(0, total.size, chunk):
            total[a:e] = total[a:e] + hop(xs[r][a:e], mode, scaling, codec)
    return total


# --- unit: scaling and reconstruction ----------------------------------------------------------

def _all_exponents(n, seed=1):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 4, n))).astype(np.float32)
    x[:12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2**-7, -(2**-7), 1e-40, -1e-40, 0.99999994]
    return x


@pytest.mark.parametrize("k", [-6, -7, -8, -10, -12, -15])
def test_nic_reconstruction_is_idempotent(k):
    """rt(rt(x)) == rt(x) bit for bit once -0.0 is made +0.0: a reconstructed value arrives
    unchanged whether the NIC compresses its packet or sends it raw."""
    c = get_codec("inceptionn", error_bound=k)
    x = _all_exponents(400_000)
    q = c.reconstruct(x)
    assert not np.signbit(q[q == 0]).any()
    assert np.array_equal(c.roundtrip(q).view(np.uint32), q.view(np.uint32))
    assert np.array_equal(c.reconstruct(q).view(np.uint32), q.view(np.uint32))
    # the plain round trip is idempotent only up to the sign of zero (8BIT field 0 -> signed zero)
    raw = c.roundtrip(x)
    differ = raw.view(np.uint32) != c.roundtrip(raw).view(np.uint32)
    assert (raw[differ] == 0).all()


def test_scale_exponents_and_the_benchmarks_scaled_copy():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(5 * 1000 + 7) * 0.003).astype(np.float32)
    x[1000:2000] = 0.0                        # an all-zero bucket
    x[2000] = 0.125                           # a max that is an exact power of two
    x[3000:4000] *= 1e6                       # values far above 1
    for workers in (1, 2, 3, 4, 7):
        e = sc.exponents(sc.bucket_maxima(x, 1000), workers)
        y, e_copy = sc.scaled_copy(x, workers, 1000)    # what the benchmarks compare codecs on
        assert np.array_equal(e, e_copy)
        assert (workers * np.abs(y) < 1.0).all()
        m = sc.bucket_maxima(y, 1000)
        assert ((workers * m >= 0.5) | (m == 0)).all()   # the largest such power of two
        sc.apply(y, e, 1000, inverse=True)
        assert np.array_equal(y, x)           # exact


def test_bucket_maxima_edge_cases():
    assert sc.bucket_maxima(np.zeros(0, np.float32)).size == 0
    x = np.array([1, -3, 2, np.nan, 0.5, np.inf], dtype=np.float32)
    m = sc.bucket_maxima(x, 3)
    assert m[0] == 3 and np.isnan(m[1])
    assert list(sc.exponents(m, 1)) == [-2, 0]
    assert list(sc.exponents(np.array([np.inf, 0.0, 1e-300]), 2)) == [0, 0, sc.MAX_EXPONENT]


def test_exponents_exact_at_every_power_of_two_boundary():
    """At each power of two of the float32 range and its neighbours the exponent is exactly the
    largest s with headroom * max * 2^s < 1 (no log2, whose last bit depends on the CPU)."""
    import math
    peaks = []
    for k in range(-149, 128):
        p = np.float32(2.0**k)
        peaks += [np.nextafter(p, np.float32(0)), p, np.nextafter(p, np.float32(np.inf))]
    peaks = np.array([p for p in peaks if 0 < p < np.inf], dtype=np.float32)
    for headroom in (1, 2, 3, 4, 7, 8):
        got = sc.exponents(peaks.astype(np.float64), headroom)
        for m, s in zip(peaks.tolist(), got.tolist()):
            want = -math.frexp(m * headroom)[1]
            want = min(max(want, -sc.MAX_EXPONENT), sc.MAX_EXPONENT)
            assert s == want, (m, headroom, s)
            if abs(want) < sc.MAX_EXPONENT:
                assert math.ldexp(m * headroom, s) < 1.0 <= math.ldexp(m * headroom, s + 1)


# --- ring and WA over sockets ------------------------------------------------------------------

LENGTHS = [0, 1, 2, 7, 1001, 2 * 65536 + 13]


def _many(g, rank, lengths, ops):
    out = {}
    for n in lengths:
        x = data(rank, n)
        for op in ops:
            if op == "wa":
                r = g.wa_step(x, (lambda s: (s * np.float32(0.5)).astype(np.float32)) if rank == 0 else None,
                              error_feedback=False)
            else:
                mode = None if op == "raw" else op
                r = g.allreduce(x, compress=mode, error_feedback=False if mode else None, key=(op, n))
            out[(op, n)] = r
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_ring_and_wa_bit_exact_on_loopback(world):
    ops = ["raw", "nic", "app", "wa"]
    chunk = 1024 if world == 3 else 65536             # many chunks: the pipeline across steps
    res = run_ranks(world, _many, LENGTHS, ops, group_kw={"chunk_bytes": 4 * chunk})
    for n in LENGTHS:
        xs = [data(r, n) for r in range(world)]
        exact = np.sum(np.array(xs, dtype=np.float64), axis=0) if n else np.zeros(0)
        for op in ops:
            got = [res[r][(op, n)] for r in range(world)]
            assert all(g.dtype == np.float32 and g.shape == (n,) for g in got)
            assert same_bits(got), f"{op} n={n}: ranks differ"
            if world == 1:
                want = xs[0] * np.float32(0.5) if op == "wa" else xs[0]
            elif op == "wa":
                want = wa_expected(xs, "nic", chunk=chunk) * np.float32(0.5)
            else:
                want = ring_expected(xs, op, chunk=chunk)
            assert np.array_equal(got[0].view(np.uint32), want.view(np.uint32)), f"{op} n={n}"
            # and within the codec's error of the true sum: every lossy hop loses < 2^-7 of the
            # scaled value; unscaled, 2^-7 * 2^-s <= 2^-7 * 2 * (block max) <= 2^-7 * 2 * N * max|x|
            hops = {"raw": 0, "nic": world, "app": world, "wa": 1}[op]
            if n:
                m = max(float(np.abs(x).max()) for x in xs)
                tol = hops * 2.0**-7 * 2 * world * m + 1e-6 * world * m
                ref = exact * 0.5 if op == "wa" else exact
                assert np.abs(got[0] - ref).max() <= tol, (op, n)


def _stats(g, rank, n):
    x = data(rank, n)
    g.reset_stats()
    g.allreduce(x, compress="nic")
    nic = g.stats.last.as_dict()
    g.allreduce(x, compress=None)
    raw = g.stats.last.as_dict()
    g.wa_step(x, (lambda s: s) if rank == 0 else None, compress="nic")
    wa = g.stats.last.as_dict()
    return nic, raw, wa, g.connections(), g.stats.as_dict()


def test_planes_tos_and_byte_counts():
    world, n = 4, 100_003
    res = run_ranks(world, _stats, n)
    # each block crosses the ring 2(N-1) times, phase 1 and phase 2, as wire format v2: per chunk
    # of 65,536 values one exponent float per BLOCK_VALUES values more
    wire = sum(wire_values(e - a) for lo, hi in block_bounds(n, world) for a, e in chunk_list(lo, hi, 65536))
    assert wire == n + sum(-(-(hi - lo) // BLOCK_VALUES) for lo, hi in block_bounds(n, world))
    assert sum(r[0]["bytes_sent"]["gradient"] for r in res) == 4 * 2 * (world - 1) * wire
    for nic, raw, wa, conns, total in res:
        assert nic["bytes_sent"]["data"] == 0 and nic["bytes_received"]["data"] == 0
        assert nic["bytes_sent"]["control"] > 0
        assert raw["bytes_sent"]["gradient"] == 0 and raw["bytes_sent"]["data"] > 0
        assert nic["seconds"] >= nic["comm_seconds"] > 0
        assert total["by_op"]["allreduce"]["calls"] == 2
        for c in conns:
            tagged = c["kind"] in ("RING_TAGGED", "WA_TAGGED") and c["direction"] == "out"
            assert c["tos"] == (0x28 if tagged else 0), c
        kinds = {(c["kind"], c["direction"]) for c in conns}
        assert ("RING_TAGGED", "out") in kinds and ("RING_PLAIN", "out") in kinds
    # WA: only workers send on the gradient plane; the aggregator answers on the data plane
    assert res[0][2]["bytes_sent"]["gradient"] == 0
    assert res[0][2]["bytes_sent"]["data"] == (world - 1) * (8 + 4 * n)
    wa_wire = sum(wire_values(e - a) for a, e in chunk_list(0, n, 65536))
    assert all(r[2]["bytes_sent"]["gradient"] == 4 * wa_wire for r in res[1:])
    assert res[0][2]["bytes_received"]["gradient"] == (world - 1) * 4 * wa_wire


def _untagged(g, rank):
    g.allreduce(data(rank, 1000))
    return g.connections()


def test_tag_false_keeps_the_computation_but_not_the_mark():
    res = run_ranks(2, _untagged, group_kw={"tag": False})
    for conns in res:
        assert all(c["tos"] == 0 for c in conns)
        assert any(c["kind"] == "RING_TAGGED" for c in conns)


# --- error feedback ----------------------------------------------------------------------------

def _ef_steps(g, rank, steps, ef):
    x = np.full(3 * BLOCK_VALUES, 0.004, dtype=np.float32)   # 3 ranks: one scale block per ring block
    x[::BLOCK_VALUES] = 1.0   # sets each block's scale (2^-1..2^-2 as the sum grows): 0.004 .. 0.012 fall below 2^-7
    out = []
    for _ in range(steps):
        out.append(g.allreduce(x, compress="nic", error_feedback=ef))
    return np.array(out), g.error_feedback.residual(("allreduce", x.size))


def test_error_feedback_recovers_what_the_codec_drops():
    world, steps = 3, 24
    with_ef = run_ranks(world, _ef_steps, steps, True)
    without = run_ranks(world, _ef_steps, steps, False)
    exact = world * 0.004
    small = np.arange(3 * BLOCK_VALUES) % BLOCK_VALUES != 0
    plain = without[0][0][:, small]
    assert (plain == 0).all(), "without error feedback the small values vanish every step"
    hist = with_ef[0][0][:, small]
    assert same_bits([r[0] for r in with_ef])
    # over the steps the small values get through: cumulative error stays one quantum, not T of them
    quantum = 2.0**-7 * 4      # the codec's 2^-7 at the block's largest scale, 2^2 (sums up to 3.0)
    cum = hist.astype(np.float64).sum(axis=0)
    assert np.abs(cum - steps * exact).max() <= world * quantum
    assert hist.sum() > 0
    assert with_ef[1][1] is not None and without[1][1] is None


# --- codecs inside the collective --------------------------------------------------------------

class Int8Codec(Codec):
    """A test codec that needs agreement: int8 levels of the max over workers (like TernGrad's
    shared scaler). Records the rounds it was agreed on."""

    name = "int8test"
    needs_agreement = True

    def __init__(self):
        self.scale = None
        self.rounds = []

    def local_stat(self, x):
        return float(np.abs(x).max()) if x.size else 0.0

    def agree(self, shared, round_no):
        self.scale = shared * 4 or 1.0   # room for the partial sums of the ring
        self.rounds.append((round_no, shared))

    def encode(self, x):
        return np.clip(np.round(x / self.scale * 127), -127, 127).astype(np.int8).tobytes()

    def decode_into(self, blob, out):
        out[:] = np.frombuffer(bytes(blob), dtype=np.int8).astype(np.float32) * np.float32(self.scale / 127)
        return out


def _custom_codec(g, rank, n):
    c = Int8Codec()
    r1 = g.allreduce(data(rank, n), compress="app", codec=c)
    r2 = g.wa_step(data(rank, n), (lambda s: s) if rank == 0 else None, compress="app", codec=c)
    return r1, r2, c.rounds


def test_app_codec_with_agreement_hooks():
    world, n = 3, 20_000
    res = run_ranks(world, _custom_codec, n)
    assert same_bits([r[0] for r in res]) and same_bits([r[1] for r in res])
    assert res[0][2] == res[1][2] == res[2][2] and len(res[0][2]) == 2, "agree() must see the same rounds"
    xs = [data(r, n) for r in range(world)]
    exact = np.sum(xs, axis=0)
    shared = max(float(np.abs(x).max()) for x in xs)
    step = shared * 4 / 127
    assert res[0][2][0][1] == shared
    assert np.abs(res[0][0] - exact).max() <= world * step
    assert np.abs(res[0][1] - exact).max() <= world * step


class Float16Codec(Codec):
    """A test codec outside the registry, with no traits: float16 values. Records what it was
    given to encode, so a test sees how the collective treated it."""

    name = "float16test"

    def __init__(self):
        self.sizes, self.peaks = [], []

    def encode(self, x):
        self.sizes.append(x.size)
        self.peaks.append(float(np.abs(x).max()) if x.size else 0.0)
        return x.astype(np.float16).tobytes()

    def decode_into(self, blob, out):
        out[:] = np.frombuffer(bytes(blob), dtype=np.float16)
        return out


class EagerFloat16Codec(Float16Codec):
    """The same codec saying it is per-value and wants error feedback."""

    name = "eagerfloat16test"
    per_value = wants_error_feedback = True


class GridCodec(Float32StreamCodec):
    """A per-value codec of our own for the tagged path: its reconstruction is the nearest multiple
    of 2^-8 (as a soft NIC running it would deliver). Counts the values it reconstructs."""

    name = "grid8test"

    def __init__(self, fail=False):
        self._values, self._fail = 0, fail     # private: not part of the codec's identity (codec_id)

    def reconstruct(self, x, out=None):
        if self._fail:
            raise ArithmeticError("grid8test: refused")
        self._values += x.size
        return np.multiply(np.round(x * 256), np.float32(1 / 256), out=out, dtype=np.float32)


def _grid_run(g, rank, n, fail):
    c = GridCodec(fail=fail and rank == 1)
    try:
        return True, g.allreduce(data(rank, n, scale=0.1), compress="nic", codec=c, error_feedback=False), c._values
    except ArithmeticError as e:
        return False, str(e), c._values
    except (ConnectionError, TimeoutError) as e:      # the neighbours of the rank that failed
        return False, type(e).__name__, c._values


def test_nic_mode_runs_a_python_per_value_codec_inside_the_ring_engine():
    """compress="nic" with a per-value codec other than INCEPTIONN: the C ring engine calls its
    Python ``reconstruct`` at every hop (what every receiver gets on the tagged socket), so the
    ranks end bit-identical on the codec's grid, near the exact sum. An exception in the codec
    reaches the caller of the rank whose codec raised it, and the other ranks fail instead of
    returning a sum."""
    world, n = 3, 30_000
    res = run_ranks(world, _grid_run, n, False)                         # [(ok, sum, values seen)] by rank
    assert all(ok for ok, _, _ in res), res
    outs = [out for _, out, _ in res]
    assert same_bits(outs)
    assert np.array_equal(outs[0], np.round(outs[0] * 256) / 256)       # on the grid: the owner's reconstruction
    exact = sum(data(r, n, scale=0.1).astype(np.float64) for r in range(world))
    assert np.abs(outs[0] - exact).max() <= world * 2 ** -9 + 1e-6     # one rounding per hop, at most
    assert all(v >= n for _, _, v in res)                               # the codec saw every value
    res = run_ranks(world, _grid_run, n, True)
    assert res[1][:2] == (False, "grid8test: refused"), res[1]
    # its neighbours fail too (the ring's connections shut at once), none returns a sum
    assert [r[:2] for r in res[::2]] == [(False, "ConnectionError")] * 2, res


def _traits_run(g, rank, cls, n):
    c = cls()
    g.allreduce(data(rank, n), compress="app", codec=c)
    return max(c.sizes), min(p for p in c.peaks if p), g.error_feedback.residual(("allreduce", n)) is not None


def test_the_collective_follows_the_codecs_traits_not_its_name():
    world, n, chunk = 2, 10_000, 1024
    plain = run_ranks(world, _traits_run, Float16Codec, n, group_kw=dict(chunk_bytes=4 * chunk))
    eager = run_ranks(world, _traits_run, EagerFloat16Codec, n, group_kw=dict(chunk_bytes=4 * chunk))
    peak = max(float(np.abs(data(r, n)).max()) for r in range(world))
    for size, low_peak, has_residual in plain:
        assert size == n // world                    # one whole ring block per encode
        assert low_peak < 2 * peak < 0.1             # unscaled (a partial sum of two at most)
        assert not has_residual                      # no error feedback
    for size, low_peak, has_residual in eager:
        assert size <= chunk                         # cut into pipeline chunks
        assert low_peak < 2 * peak                   # unscaled: scaling serves absolute precision only
        assert has_residual                          # error feedback on by default


def test_codecs_describe_themselves():
    traits = {name: get_codec(name).traits() for name in available_codecs()}
    assert all(set(t) == set(Codec.TRAITS) for t in traits.values())
    assert [n for n, t in traits.items() if t["per_value"]] == ["inceptionn"]
    assert traits["inceptionn"]["wants_scaling"] and traits["inceptionn"]["thread_safe"]
    assert sorted(n for n, t in traits.items() if t["wants_error_feedback"]) == ["3lc", "inceptionn", "thc"]
    assert not get_codec("thc", error_feedback=False).traits()["wants_error_feedback"]
    assert traits["thc"]["needs_agreement"] and not traits["terngrad"]["needs_agreement"]
    assert get_codec("terngrad", share_scaler=True).traits()["needs_agreement"]


def _registered(g, rank, name, n):
    return g.allreduce(data(rank, n), compress="app", codec=name), g.wa_step(
        data(rank, n), (lambda s: s) if rank == 0 else None, compress="app", codec=name)


def _importable_codecs():
    names = []
    for name in available_codecs():
        try:
            get_codec(name)
        except Exception:   # other codecs are being written in parallel; test what imports
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("name", _importable_codecs())
def test_every_registered_codec_runs_in_the_collective(name):
    world, n = 3, 30_000
    res = run_ranks(world, _registered, name, n)
    assert same_bits([r[0] for r in res]) and same_bits([r[1] for r in res])
    exact = np.sum([data(r, n) for r in range(world)], axis=0)
    for got in res[0]:
        assert np.isfinite(got).all() and got.shape == exact.shape
        cosine = float(got @ exact / np.linalg.norm(got) / np.linalg.norm(exact))
        assert cosine > 0.2, (name, cosine)   # lossy (3LC's one round: ~0.3), but a sum, not noise


def _special(g, rank):
    x = data(rank, 70_000)
    x[5] = np.inf if rank == 1 else 1.0
    x[70_000 - 3] = np.nan if rank == 2 else 0.0
    x[100:200] = 0.0
    out = [g.allreduce(x, compress=mode) for mode in ("nic", "app", None)]
    r = g.error_feedback.residual(("allreduce", x.size))
    return out + [np.array(np.isfinite(r).all())]


def test_inf_nan_and_zero_buckets_keep_ranks_identical():
    res = run_ranks(3, _special)
    for i in range(3):
        got = [r[i] for r in res]
        assert same_bits(got)
        assert np.isinf(got[0][5]) and np.isnan(got[0][70_000 - 3])
        assert np.isfinite(got[0][:65536][np.arange(65536) != 5]).all()   # bucket 0: inf does not spread
    assert all(bool(r[3]) for r in res), "error feedback must not keep inf/NaN residuals"


# --- control plane -----------------------------------------------------------------------------

def _control(g, rank):
    g.barrier()
    m = g.max_scalar(rank * 1.5)
    s = g.sum_scalar(rank + 0.25)
    v = g.control_allreduce([rank, -rank], op="min")
    w = g.broadcast(np.arange(5, dtype=np.float32) + rank if rank == 2 else None, root=2)
    return m, s, list(v), w


def test_control_plane_operations():
    res = run_ranks(4, _control)
    for m, s, v, w in res:
        assert m == 4.5 and s == 7.0 and v == [0, -3]
        assert np.array_equal(w, np.arange(5, dtype=np.float32) + 2)


# --- mistakes ----------------------------------------------------------------------------------

def _mismatch(g, rank):
    g.allreduce(data(rank, 100 + rank))


def test_mismatched_lengths_raise_on_every_rank():
    res = run_ranks(3, _mismatch, expect_ok=False)
    for ok, msg in res:
        assert not ok and "RuntimeError: collective mismatch" in msg and "n=100" in msg and "n=101" in msg, msg


def _mismatch_op(g, rank):
    if rank == 1:
        g.barrier()
    else:
        g.allreduce(data(rank, 10))


def test_mismatched_operations_raise():
    res = run_ranks(2, _mismatch_op, expect_ok=False)
    assert all(not ok and "barrier" in msg and "allreduce" in msg for ok, msg in res), res


def _mismatch_table(g, rank):
    table = get_codec("thc").table
    if rank == 1:   # the mirror image: as good, but another table (what a host that broke the tie
        table = tuple(table[-1] - t for t in reversed(table))   # the other way would compute)
    g.allreduce(data(rank, 1000), compress="app", codec=get_codec("thc", table=table))


def test_ranks_holding_different_thc_tables_raise_at_the_first_call():
    res = run_ranks(2, _mismatch_table, expect_ok=False)
    for ok, msg in res:
        assert not ok and "RuntimeError: collective mismatch" in msg and "codec=" in msg, msg


def _thc_ring(g, rank, n):
    r = g.allreduce(data(rank, n), compress="app", codec=get_codec("thc", noise_seed=rank))
    return r, g.stats.last.bytes_sent["data"], g.error_feedback.residual(("allreduce", n)).copy()


@pytest.mark.parametrize("world", [4, 9])
def test_thc_runs_in_the_engine_summed_without_decoding(world):
    """THC through Group.allreduce runs in the C ring engine: every rank holds the same bits; a
    rank sends its own 4-bit indices once, then sums of table values in the narrowest width that
    holds them (8 bits up to 8 ranks at g = 30, then 16) and the owner's sum forwarded as it is;
    its error is no worse than that of the ring that decodes, adds and re-encodes per hop (ring.py's
    until now, its arithmetic in ring.simulate_ring with sum_encoded=False) on the same inputs, the
    simulator's summed ring within 10% of it; and the result plus every
    rank's residual is the inputs' sum (error feedback keeps x - what its own indices decode to)."""
    from inceptionn.codecs import thc_reference as ref
    from inceptionn.collective.ring import simulate_ring
    n = 100_000
    res = run_ranks(world, _thc_ring, n, timeout=240)
    xs = [data(r, n) for r in range(world)]
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    got = [r[0] for r in res]
    assert same_bits(got)
    codec = get_codec("thc", noise_seed=99)
    codec.agree(max(codec.local_stat(x) for x in xs), 1)
    sims = {kind: simulate_ring(n, world, lambda r, a, b: xs[r][a:b], chunk_values=n, mode="app", codec=codec,
                                sum_encoded=kind == "summed") for kind in ("hops", "summed")}
    nmse = {name: float((v - exact) @ (v - exact) / (exact @ exact))
            for name, v in (("engine", got[0]), *sims.items())}
    assert nmse["engine"] <= nmse["hops"] and nmse["engine"] < 0.012 * world, nmse
    assert abs(nmse["summed"] / nmse["engine"] - 1) < 0.1, nmse    # the simulator: the same algorithm
    held = got[0].astype(np.float64) + np.sum([r[2] for r in res], axis=0)
    assert float((held - exact) @ (held - exact)) <= 1e-9 * float(exact @ exact)
    bounds = block_bounds(n, world)

    def blob(b, width):
        return 4 + ref.blob_size(bounds[b][1] - bounds[b][0], 4, width)
    for rank, r in enumerate(res):
        own = [(rank - j) % world for j in range(2 * world - 2)]        # block sent at step j
        width = [8 if (j + 1) * 30 <= 255 else 16 for j in range(world)]
        want = blob(own[0], 4) + sum(blob(own[j], width[j]) for j in range(1, world - 1)) \
            + sum(blob(own[j], width[world - 1]) for j in range(world - 1, 2 * world - 2))
        assert r[1] == want, (rank, r[1], want)


APP_CODECS = {"3lc": {}, "fft": {}, "inceptionn": {"error_bound": -10}, "terngrad": {}}


def _app_in_engine(g, rank, n):
    return [g.allreduce(data(rank, n, seed=1), compress="app", codec=get_codec(name, **kw), scaling=False,
                        error_feedback=False) for name, kw in APP_CODECS.items()]


@pytest.mark.parametrize("world", [2, 5])
def test_app_mode_codecs_run_in_the_engine_with_the_python_rings_bits(world):
    """3LC, FFT and INCEPTIONN without scaling (deterministic) give in the ring engine the bits the
    Python ring's transforms give (ring.simulate_ring: decode, add, re-encode per hop, the owner's
    stream forwarded); TernGrad (stochastic rounding) the same bits on every rank and a sum."""
    from inceptionn.collective.ring import simulate_ring
    n = 30_011
    res = run_ranks(world, _app_in_engine, n)
    xs = [data(r, n, seed=1) for r in range(world)]
    exact = np.sum(xs, axis=0)
    for i, (name, kw) in enumerate(APP_CODECS.items()):
        got = [r[i] for r in res]
        assert same_bits(got), name
        if name == "terngrad":
            assert float(got[0] @ exact / np.linalg.norm(got[0]) / np.linalg.norm(exact)) > 0.2   # lossy per hop
            continue
        codec = get_codec(name, **kw)
        sim = simulate_ring(n, world, lambda r, a, b: xs[r][a:b], mode="app", codec=codec,
                            chunk_values=65536 if codec.per_value else n)
        assert np.array_equal(sim.view(np.uint32), got[0].view(np.uint32)), name


def _rotated(grads, rank, n, world):
    """Rank ``rank``'s n real gradient values: its own rotation of the captured ones."""
    start = rank * grads.size // world
    return np.ascontiguousarray(np.roll(grads, -start)[:n])


def _headrooms(g, rank, grads, n, world, hs):
    x = _rotated(grads, rank, n, world)
    out = []
    for h in hs:
        r = g.allreduce(x, compress="app", error_feedback=False, headroom=h)
        out.append((r, g.stats.last.bytes_sent["data"]))
    g.headroom = hs[-1]        # the Group's own setting, with no per-call value
    r = g.allreduce(x, compress="app", error_feedback=False)
    return out, (r, g.stats.last.bytes_sent["data"])


def test_headroom_trades_precision_for_bytes_on_real_gradients(grads):
    """On real gradients, each bit of headroom sends fewer bytes for a larger error, and the
    engine's bits are the simulator's (BlockScale at that headroom, decode-add-encode per hop)."""
    from inceptionn.collective.ring import simulate_ring
    world, n, hs, g_chunk = 3, 200_000, (0, 1, 3), 65536
    res = run_ranks(world, _headrooms, grads, n, world, hs)
    xs = [_rotated(grads, r, n, world) for r in range(world)]
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    sent, nmse = [], []
    for i, h in enumerate(hs):
        got = [r[0][i][0] for r in res]
        assert same_bits(got), h
        sim = simulate_ring(n, world, lambda r, a, b: xs[r][a:b], mode="app", codec=CODEC, scaled=True,
                            headroom=h, chunk_values=g_chunk)
        assert np.array_equal(sim.view(np.uint32), got[0].view(np.uint32)), h
        sent.append(sum(r[0][i][1] for r in res))
        err = got[0] - exact
        nmse.append(float(err @ err / (exact @ exact)))
    assert sent[0] > sent[1] > sent[2] and nmse[0] < nmse[1] < nmse[2], (sent, nmse)
    assert sent[0] / sent[2] > 1.2, sent         # the levers FIELD-NOTES measured: 3.2x -> 4.5x at h=3
    assert all(np.array_equal(r[1][0], r[0][-1][0]) and r[1][1] == r[0][-1][1] for r in res)   # Group(headroom=)


def _headroom_mismatch(g, rank):
    g.allreduce(data(rank, 1000), compress="app", headroom=rank)


def test_ranks_with_different_headrooms_raise_at_the_first_call():
    for ok, msg in run_ranks(2, _headroom_mismatch, expect_ok=False):
        assert not ok and "RuntimeError: collective mismatch" in msg and "headroom=0" in msg \
            and "headroom=1" in msg, msg


class FaultyAppCodec(GridCodec):
    """A whole-block codec for the app path: float32 as they are, but rank 1's ``encode`` raises
    (``fail="encode"``) or its stream is cut short so its right neighbour cannot decode it
    (``fail="stream"``)."""

    name = "faultytest"
    per_value = False

    def encode(self, x):
        if self._fail == "encode":
            raise ArithmeticError("faultytest: refused")
        blob = super().encode(x)
        return blob[:-4] if self._fail == "stream" else blob

    def decode_into(self, blob, out):
        if len(blob) != 4 * out.size:
            raise ValueError(f"faultytest: {len(blob)} bytes for {out.size} values")
        return super().decode_into(blob, out)


def _faulty_run(g, rank, fail):
    try:
        return True, g.allreduce(data(rank, 3000), compress="app", codec=FaultyAppCodec(rank == 1 and fail))
    except ArithmeticError as e:
        return False, str(e)
    except Exception as e:      # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"


def test_app_mode_python_codec_failures_in_the_engine():
    """compress="app" with a Python codec in the C engine (its encode/decode_into called back): a
    sum like the exact one when it works; an exception in its encode reaches that rank's caller
    and its neighbours fail instead of returning a sum; a stream its right neighbour cannot decode
    (ValueError) fails that neighbour with WireError naming the codec's reason (the rank that
    sent it fails too: as the owner it decodes its own stream, unless its neighbours' failure
    reaches it first)."""
    world = 3
    res = run_ranks(world, _faulty_run, False)
    exact = sum(data(r, 3000) for r in range(world))
    assert all(ok for ok, _ in res) and same_bits([v for _, v in res])
    assert np.allclose(res[0][1], exact, rtol=0, atol=1e-6)
    res = run_ranks(world, _faulty_run, "encode")
    assert res[1] == (False, "faultytest: refused"), res
    assert all(not ok and msg.startswith("ConnectionError") for ok, msg in res[::2]), res
    res = run_ranks(world, _faulty_run, "stream")
    assert not res[1][0] and not res[2][0] and res[2][1].startswith("WireError") and "faultytest: 3996 bytes for 1000 values" in res[2][1], res


def _terngrad_pair(g, rank, n):
    c = get_codec("terngrad", seed=100 + rank)
    out = g.allreduce(data(rank, n, seed=3), compress="app", codec=c, error_feedback=False)
    return out, c._draw


def test_terngrad_in_the_engine_gives_the_bits_of_its_python_codec():
    """TernGrad runs its C codec inside the engine, each encode taking the next draws of the rank's
    random stream as terngrad.py's encode does: on 2 ranks (each encodes its own block, then the
    block it owns) the result is what the Python codecs compute in that order, and the codecs'
    stream positions moved on by those two encodes."""
    n = 20_001
    res = run_ranks(2, _terngrad_pair, n)
    xs = [data(r, n, seed=3) for r in range(2)]
    codecs = [get_codec("terngrad", seed=100 + r) for r in range(2)]
    bounds = block_bounds(n, 2)
    first = [codecs[r].encode(xs[r][slice(*bounds[r])]) for r in range(2)]    # op 0 of every rank
    want = np.empty(n, np.float32)
    for b in range(2):                              # block b: from rank b to its owner 1 - b
        lo, hi = bounds[b]
        part = np.add(xs[1 - b][lo:hi], codecs[b].decode(first[b], hi - lo))
        want[lo:hi] = codecs[1 - b].decode(codecs[1 - b].encode(part), hi - lo)
    for r in range(2):
        assert np.array_equal(res[r][0].view(np.uint32), want.view(np.uint32))
        assert res[r][1] == codecs[r]._draw


def _bad_args(g, rank):
    errors = []
    x = data(rank, 10)
    for call in (lambda: g.allreduce(x.astype(np.float64)),
                 lambda: g.allreduce(x.reshape(2, 5)),
                 lambda: g.allreduce([1.0, 2.0]),
                 lambda: g.allreduce(x, compress="zip"),
                 lambda: g.allreduce(x, compress=None, error_feedback=True),
                 lambda: g.allreduce(x, out=np.empty(11, np.float32)),
                 lambda: g.allreduce(x, compress="nic", codec=Int8Codec()),
                 lambda: g.allreduce(x, codec=42),
                 lambda: g.allreduce(x, headroom=25),
                 lambda: g.wa_step(None, None) if rank == 1 else g.wa_step(x, None),
                 lambda: g.wa_step(x, aggregator=5),
                 lambda: g.control_allreduce([1], op="avg")):
        try:
            call()
            errors.append(None)
        except (TypeError, ValueError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    # none of these sent anything: the group still works
    return errors, g.allreduce(x, compress=None)


def test_user_mistakes_raise_clear_errors_and_leave_the_group_usable():
    res = run_ranks(2, _bad_args)
    errors, r = res[0]
    assert None not in errors, errors
    text = "\n".join(errors)
    for needle in ("float32", "1-D", "numpy", "compress must be", "error_feedback needs", "out must be",
                   "soft NIC cuts the stream into packets", "codec must be", "aggregator", "op must be",
                   "headroom must be an integer in 0..24"):
        assert needle in text, needle
    assert np.array_equal(r, res[1][1])


def test_constructor_errors():
    with pytest.raises(ValueError, match="rank must be in"):
        Group(2, 2, FileStore(tempfile.mkdtemp()))
    with pytest.raises(ValueError, match="needs a store"):
        Group(0, 2)
    with pytest.raises(TypeError, match="store must have"):
        Group(0, 2, object(), bind_addr="127.0.0.1")
    with pytest.raises(ValueError, match="bind_addr must be an address of this host"):
        Group(0, 1, bind_addr="198.18.255.254")
    with pytest.raises(ValueError, match="not the wildcard"):
        Group(0, 1, bind_addr="0.0.0.0")
    with pytest.raises(ValueError, match="compress must be"):
        Group(0, 1, compress="yes", bind_addr="127.0.0.1")
    for bad in (-1, 25, 1.5, True):
        with pytest.raises(ValueError, match=r"headroom must be an integer in 0\.\.24"):
            Group(0, 1, headroom=bad, bind_addr="127.0.0.1")
    with Group(0, 1, bind_addr="127.0.0.1") as g:   # a group of one needs no store
        x = data(0, 33)
        assert np.array_equal(g.allreduce(x), x)
        assert np.array_equal(g.wa_step(x, lambda s: s * np.float32(2)), x * 2)
    with pytest.raises(RuntimeError, match="closed"):
        g.allreduce(x)


def _dies(g, rank):
    if rank == 1:
        os._exit(0)          # gone without a word
    time.sleep(0.2)
    try:
        g.allreduce(data(rank, 1000))
    except ConnectionError as e:
        try:
            g.barrier()
        except RuntimeError as e2:
            return f"ConnectionError: {e} | then: {e2}"
    return "no error"


def test_a_dead_peer_raises_instead_of_hanging():
    res = run_ranks(2, _dies, expect_ok=False, timeout=60)
    ok, msg = res[0]
    assert ok and msg.startswith("ConnectionError") and "unusable" in msg, msg


# --- wire format v2: what a receiver refuses, and the simulator ---------------------------------

def test_wire_v2_refuses_chunks_that_cannot_belong_to_the_call():
    """Crafted payloads: every one raises WireError (one clear message) before a value is used."""
    from inceptionn.collective.ring import Wire, WireError, receive
    x = data(0, 1000)
    x[300:600] *= 1e-6
    out = np.empty(1000, dtype=np.float32)
    nic, app = Wire("nic", CODEC, scaled=True), Wire("app", CODEC, scaled=True)
    good, _ = nic.send(x)
    assert good.size == wire_values(1000) == 1000 + 4
    receive(nic, good, out)
    assert np.array_equal(out, hop(x, "nic", True))
    blob, _ = app.send(x)
    receive(app, blob, out)
    assert np.array_equal(out, hop(x, "nic", True))

    def bad(edit):
        w = good.copy()
        edit(w)
        return w
    crafted = {
        "short": good[:-1], "long": np.append(good, np.float32(0)),
        "exponent not an integer": bad(lambda w: w.__setitem__(0, 1024.5)),
        "exponent out of range": bad(lambda w: w.__setitem__(257, 1024 + 127)),
        "exponent NaN": bad(lambda w: w.__setitem__(514, np.nan)),
        "exponent below": bad(lambda w: w.__setitem__(771, 1024 - 127)),
        "value >= 1 in a scaled block": bad(lambda w: w.__setitem__(5, 1.0)),
        "inf in a scaled block": bad(lambda w: w.__setitem__(300, -np.inf)),
        "NaN in a scaled block": bad(lambda w: w.__setitem__(999, np.nan)),
    }
    for what, w in crafted.items():
        with pytest.raises(WireError, match="does not belong to this call"):
            receive(nic, w, out)
        if what in ("short", "long"):   # app mode: the codec stream's count (below)
            continue
        # app mode: the same floats as a valid codec stream
        with pytest.raises(WireError, match="does not belong to this call"):
            receive(app, CODEC.encode(w), out)
    for stream in (blob[:-3], CODEC.encode(good[:-100]), CODEC.encode(np.append(good, good[:50]))):
        with pytest.raises(WireError, match="malformed inceptionn stream"):
            receive(app, stream, out)
    # an unscaled block (s = 0: it held inf or NaN) may carry anything
    y = np.zeros(300, dtype=np.float32)
    y[7], y[280] = np.inf, 2.5
    w, _ = nic.send(y)
    assert w[0] == 1024 and w[257] == 1024 - 2
    receive(nic, w, out[:300])
    assert np.isinf(out[7]) and out[280] == 2.5


def test_wire_v2_exponents_at_the_edges():
    """frexp exponents: all-zero/inf/NaN blocks unscaled, the clamp keeps 2^s and 2^-s normal."""
    from inceptionn.codecs.blockscale import BlockScale, MAX_SHIFT, MIN_SHIFT
    bs = BlockScale(-10, block=4)
    x = np.array([0, 0, 0, 0, 1e-45, 0, 0, 0, 3e38, 1, 0, 0, 0.25, 0.125, 0, 0,
                  0.9999999, 0, 0, 0, 1.0, 0, 0, 0, np.nan, 1e-3, 0, 0], dtype=np.float32)
    w = bs.encode(x)
    assert list(w[::5] - 1024) == [0, MAX_SHIFT, MIN_SHIFT, 1, 0, -1, 0]
    assert np.array_equal(CODEC.reconstruct(w).view(np.uint32)[~np.isnan(w)], w.view(np.uint32)[~np.isnan(w)])
    out = np.empty_like(x)
    bs.decode_into(w, out)
    assert out[8] == np.float32(3e38) and out[12] == 0.25 and out[20] == 1.0 and np.isnan(out[24])


def _ring_for_sim(g, rank, n, seeds):
    return [g.allreduce(data(rank, n, seed=s), compress=mode, error_feedback=False)
            for s in seeds for mode in ("nic", "app")]


@pytest.mark.parametrize("world", [4, 16])
def test_simulator_gives_the_bits_of_the_real_ring(world):
    """bench scale's simulator (ring.simulate_ring) against Group rings over loopback sockets."""
    from inceptionn.collective.ring import simulate_ring
    n, chunk, seeds = 30_011, 4096, (0, 1)
    res = run_ranks(world, _ring_for_sim, n, seeds, group_kw={"chunk_bytes": 4 * chunk}, timeout=240)
    i = 0
    for s in seeds:
        xs = [data(r, n, seed=s) for r in range(world)]
        for mode in ("nic", "app"):
            got = [r[i] for r in res]
            assert same_bits(got)
            sim = simulate_ring(n, world, lambda r, a, b: xs[r][a:b], chunk_values=chunk, mode=mode,
                                codec=CODEC, scaled=True)
            assert np.array_equal(sim.view(np.uint32), got[0].view(np.uint32)), (world, s, mode)
            assert np.array_equal(sim.view(np.uint32), ring_expected(xs, mode, chunk=chunk).view(np.uint32))
            i += 1
