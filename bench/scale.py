"""``inceptionn bench scale``: the ring's precision and compression against the number of ranks,
up to sizes this machine cannot host, simulated in one process.

The simulator (collective/ring.py ``simulate_ring``) runs the ring's exact arithmetic over N
virtual ranks: the same ring blocks, pipeline chunks and per-chunk transforms (``ring.Wire``) as
``Group.allreduce``, so it gives the bits a real ring of N ranks would (tests/test_collective.py
checks this against loopback rings of 4 and 16 ranks). Every codec runs as the ring runs it
(``inceptionn`` in nic mode, per-block scaled; the others in app mode, one ring block per
encode), one call, without error feedback. For inceptionn the ring as it was before wire format
v2 is measured too ("before": one power of two per 65,536-value bucket, agreed over the ranks so
that N x max|x| < 1, then the codec per hop).

Inputs, ``--values`` per rank:

  real   a gradient of the HDC model captured from training (train/gradients.py: the first of
         ``capture_gradients(2)``, about one epoch in; later ones hold more exact zeros and
         compress better, docs/codecs.md), every third value, shared by all ranks, plus per-rank noise: x_r = g + noise * |g| * z_r (data-
         parallel gradients are correlated: the same model, different samples)
  heavy  heavy-tailed synthetic values, independent per rank: random sign x 10^-3 x e^(2 z)

For inceptionn the wire transform's dials can be compared (simulated only; the ring runs the
defaults): ``--error-bound`` (the codec's bound), ``--block`` (values per exponent) and
``--headroom`` (each scaled block's max in [2^(-1-h), 2^-h) instead of [0.5, 1)).

Per (set, N, codec): NMSE of the result against the float64 sum of the inputs, and the
compression ratio: float32 bytes of the values every link carries / the bytes the codec puts on
the wire for them (for inceptionn what the soft NIC's codec makes of the wire floats, exponents
included; for the others the codec's stream), packet and frame headers not counted. For
inceptionn the JSON rows also give the codec bytes, the payloads (app mode frames each behind a
4-byte length) and the exponent floats' share of the codec bytes (34 bits each).
"""
from __future__ import annotations

HELP = "ring NMSE and compression ratio against the number of ranks (2 to 1024), simulated in one process"

import json
import sys
import time

import numpy as np

from ..errors import UserError
from ..limits import DEFAULT_ERROR_BOUND

SETS = ("real", "heavy")
POOL = 1_048_573          # prime: rank r reads noise pool entries (i + r * STRIDE) mod POOL
STRIDE = 7919             # coprime with POOL, so ranks never share an entry at the same index
EXPONENT_BITS = 34        # an exponent float (>= 1.0) in the codec's stream: NO_COMPRESS, 2-bit tag + 32 bits (spec.md)


def log(msg: str) -> None:
    print(f"[bench scale] {msg}", file=sys.stderr, flush=True)


class Inputs:
    """Rank r's values [a, b) of a set, made on demand (N x n values are never held at once)."""

    def __init__(self, kind: str, n: int, *, seed: int, noise: float, data=None):
        rng = np.random.default_rng(seed)
        self.kind, self.n, self.noise = kind, n, np.float32(noise)
        self.z = rng.standard_normal(POOL).astype(np.float32)
        if kind == "real":
            from ..train.gradients import capture_gradients
            g = np.concatenate(capture_gradients(2, data=data, seed=seed))[::3]
            if g.size < n:
                raise UserError(f"--values {n}: the captured gradients give {g.size} values at most")
            self.g = np.ascontiguousarray(g[:n])
            self.absg = np.abs(self.g)
        else:
            self.sign = np.where(rng.standard_normal(POOL) < 0, np.float32(-1), np.float32(1))

    def __call__(self, r: int, a: int, b: int) -> np.ndarray:
        idx = (np.arange(a, b) + r * STRIDE) % POOL
        z = self.z[idx]
        if self.kind == "real":
            return self.g[a:b] + self.noise * self.absg[a:b] * z
        return (self.sign[idx] * np.float32(1e-3) * np.exp(np.float32(2.0) * z)).astype(np.float32)


def exact_sum(x: Inputs, world: int, codec) -> tuple[np.ndarray, float]:
    """The float64 sum over ranks, and (for codecs that need agreement) the max of the ranks'
    local statistics, as the Group's agreement round gives it."""
    total = np.zeros(x.n, dtype=np.float64)
    stat = 0.0
    for r in range(world):
        v = x(r, 0, x.n)
        total += v
        if codec is not None and codec.needs_agreement:
            stat = max(stat, float(codec.local_stat(v)))
    return total, stat


def run_one(x: Inputs, world: int, name: str, variant: str, *, error_bound: int, chunk: int, block: int,
            ref: np.ndarray, seed: int, headroom: int | None = None) -> dict:
    from ..codecs import applicable, get_codec
    from ..collective import scaling as sc
    from ..collective.ring import simulate_ring
    codec = get_codec(name, **applicable(name, error_bound=error_bound, seed=seed))
    nbytes = [0, 0, 0, 0]                # float32 bytes carried, codec bytes sent, exponent floats, payloads

    if codec.c_nic:                      # the soft NIC's codec: per packet, what it makes of the wire floats
        mode, unit = "nic", chunk

        def count(payload, m, times):
            nbytes[0] += 4 * m * times
            nbytes[1] += codec.encoded_size(payload) * times
            nbytes[2] += (payload.size - m) * times      # v2's exponent floats (none in v1)
            nbytes[3] += times
    else:
        mode, unit = "app", max(x.n, 1)  # a non-per-value codec sees a whole ring block

        def count(payload, m, times):
            nbytes[0] += 4 * m * times
            nbytes[1] += len(payload) * times
    if codec.needs_agreement:
        _, stat = exact_sum(x, world, codec)
        codec.agree(stat, 1)
    values, factor = x, None
    if variant == "before":             # the agreed per-bucket scaling of wire format v1
        maxima = np.zeros(-(-x.n // sc.BUCKET_VALUES))
        for r in range(world):
            maxima = np.maximum(maxima, sc.bucket_maxima(x(r, 0, x.n)))
        exps = sc.exponents(maxima, world)
        factor = np.repeat(np.exp2(exps).astype(np.float32), sc.BUCKET_VALUES)[: x.n]

        def values(r, a, b):
            return x(r, a, b) * factor[a:b]
    t = time.perf_counter()
    from ..codecs.blockscale import HEADROOM
    out = simulate_ring(x.n, world, values, chunk_values=unit, mode=mode, codec=codec,
                        scaled=variant == "after" and codec.wants_scaling, block=block,
                        headroom=HEADROOM if headroom is None else headroom, count=count)
    seconds = time.perf_counter() - t
    if factor is not None:
        out = out / factor               # exact: powers of two
    err = out.astype(np.float64) - ref
    nmse = float(err @ err / (ref @ ref)) if ref @ ref > 0 else float(err @ err)
    row = {"codec": name, "variant": variant, "ranks": world, "nmse": nmse,
           "ratio": nbytes[0] / nbytes[1] if nbytes[1] else None, "seconds": round(seconds, 3)}
    if codec.c_nic:   # what the ring's app mode frames (a 4-byte length per payload), and the exponents' share
        row.update(codec_bytes=nbytes[1], payloads=nbytes[3],
                   exponent_share=nbytes[2] * EXPONENT_BITS / 8 / nbytes[1] if nbytes[1] else None)
    return row


def parse_list(text: str, what: str, lo: int, hi: int) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{what} takes comma-separated integers, got {text!r}") from None
    if not vals or any(not lo <= v <= hi for v in vals):
        raise UserError(f"{what} must be integers in {lo}..{hi}, got {text!r}")
    return vals


def run(args) -> int:
    from ..codecs import available_codecs, codec_class
    ranks = parse_list(args.ranks, "--ranks", 2, 1024)
    codecs = args.codecs.split(",") if args.codecs else available_codecs()
    unknown = [c for c in codecs if c not in available_codecs()]
    if unknown:
        raise UserError(f"--codecs: unknown {', '.join(unknown)}; available: {', '.join(available_codecs())}")
    sets = args.sets.split(",")
    if any(s not in SETS for s in sets):
        raise UserError(f"--sets takes {', '.join(SETS)}, got {args.sets!r}")
    blocks = parse_list(args.block, "--block", 1, 65536)
    from ..codecs.blockscale import MAX_HEADROOM
    headrooms = parse_list(args.headroom, "--headroom", 0, MAX_HEADROOM)
    bounds = parse_list(args.error_bound, "--error-bound", -30, -1)
    if args.values < 1:
        raise UserError("--values must be at least 1")
    if args.noise < 0:
        raise UserError("--noise must be >= 0")
    rows = []
    for kind in sets:
        x = Inputs(kind, args.values, seed=args.seed, noise=args.noise, data=args.data)
        for world in ranks:
            ref, _ = exact_sum(x, world, None)
            for name in codecs:
                # the scaled codec: the bound and block apply to it, and wire format v1 scaled it too
                per_value = codec_class(name).wants_scaling
                variants = ["before", "after"] if per_value and not args.after_only else ["after"]
                for variant in variants:
                    dials = [(k, b, h) for k in (bounds if per_value else [bounds[0]])
                             for b in (blocks if per_value and variant == "after" else [None])
                             for h in (headrooms if per_value and variant == "after" else [None])]
                    for k, block, h in dials:
                        row = run_one(x, world, name, variant, error_bound=k, chunk=args.chunk,
                                      block=block or blocks[0], ref=ref, seed=args.seed, headroom=h)
                        row.update(set=kind, block=block, headroom=h, error_bound=k if per_value else None)
                        rows.append(row)
                        dial = (f" 2^{k}" if per_value else "") + (f" block {block} headroom {h}" if block else "")
                        log(f"{kind} N={world} {name} {variant}{dial}: NMSE "
                            f"{row['nmse']:.3g}, ratio {row['ratio']:.2f}x ({row['seconds']:.1f} s)")
    if args.json:
        print(json.dumps({"values": args.values, "chunk": args.chunk,
                          "noise": args.noise, "seed": args.seed, "rows": rows}, indent=1))
        return 0
    print(f"ring simulated: {args.values} values per rank, chunk {args.chunk}, one call, no error feedback")
    print(f"{'set':6} {'codec':11} {'variant':7} {'bound':>5} {'block':>5} {'head':>4} "
          + " ".join(f"{'N=' + str(n):>17}" for n in ranks))
    fields = ("set", "codec", "variant", "error_bound", "block", "headroom")
    keys = sorted({tuple(r[f] for f in fields) for r in rows},
                  key=lambda k: (sets.index(k[0]), codecs.index(k[1]), k[2] != "before", -(k[3] or 0), k[4] or 0,
                                 k[5] or 0))
    for k in keys:
        cells = []
        for n in ranks:
            r = next(r for r in rows if tuple(r[f] for f in fields) == k and r["ranks"] == n)
            cells.append(f"{r['nmse']:8.2g} {r['ratio']:6.2f}x")
        bound = "" if k[3] is None else f"{k[3]}"
        print(f"{k[0]:6} {k[1]:11} {k[2]:7} {bound:>5} {k[4] or '':>5} {'' if k[5] is None else k[5]:>4} "
              + " ".join(f"{c:>17}" for c in cells))
    print("cells: NMSE against the float64 sum, compression ratio")
    return 0


def _default_headroom() -> int:
    from ..codecs.blockscale import HEADROOM
    return HEADROOM


def add_arguments(p) -> None:
    p.add_argument("--ranks", default="2,4,16,64,256,1024", help="numbers of ranks, 2..1024 (default 2,4,16,64,256,1024)")
    p.add_argument("--values", type=int, default=262144, help="values per rank (default 262144)")
    p.add_argument("--codecs", help="comma-separated codecs (default every codec: inceptionn,terngrad,3lc,thc,fft)")
    p.add_argument("--sets", default="real,heavy", help="input sets: real (HDC gradients), heavy (heavy-tailed); "
                   "default both")
    p.add_argument("--error-bound", default=str(DEFAULT_ERROR_BOUND), help="inceptionn error bound exponents, "
                   f"comma-separated to compare (write --error-bound=-10,-6; default {DEFAULT_ERROR_BOUND})")
    p.add_argument("--block", default="256", help="values per scaling block for inceptionn, comma-separated to compare "
                   "(default 256, what the ring uses; other sizes are simulated only)")
    p.add_argument("--headroom", default=str(_default_headroom()), help="inceptionn: octaves h below 1.0 for each "
                   "scaled block's max, which lands in [2^(-1-h), 2^-h); comma-separated to compare (default "
                   f"{_default_headroom()}, what the ring uses; others are simulated only)")
    p.add_argument("--chunk", type=int, default=65536, help="pipeline chunk in values (default 65536, the Group's)")
    p.add_argument("--noise", type=float, default=0.5, help="real set: per-rank noise relative to |g| (default 0.5)")
    p.add_argument("--after-only", action="store_true", help="skip inceptionn's before-v2 scaling")
    p.add_argument("--data", metavar="PATH", help="MNIST to capture gradients on (default: digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the captured gradients (default 0)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)
