"""``inceptionn bench tiers``: the INCEPTIONN codec on real gradients, its speed and its bitwidth tiers.

1. Encode and decode GB/s of float32 input for the scalar C path, the AVX2 path and the numpy
   reference, with memcpy of the same bytes measured in the same rounds.
2. The paper's Table III / Fig. 14a: bitwidth distribution and compression ratio for error
   bounds 2^-10, 2^-8, 2^-6, on the raw gradients and on the gradients under wire format v1's
   power-of-two scale (one per --bucket values, for --workers), with the reconstruction error
   (NMSE) that each costs. v2's per-block scale: ``bench codecs`` (its inc-scaled row).
"""
from __future__ import annotations

HELP = "INCEPTIONN codec speed and bitwidth distribution on real gradients"

import sys

import numpy as np

from ..codecs import get_codec
from ..codecs._native import ffi
from ..codecs.inceptionn import have_avx2, max_encoded_size
from ..collective.scaling import scaled_copy
from ..errors import UserError
from ..limits import DEFAULT_ERROR_BOUND, error_bound_problem
from .cli import add_gradient_arguments, emit
from .timing import cpu_name, interleaved

PAPER_TARGET_GBPS = 3.2  # one 256-bit burst per 100 MHz cycle (INCEPTIONN Sec. VI)


def log(msg: str) -> None:
    print(f"[bench tiers] {msg}", file=sys.stderr, flush=True)


def load_gradients(data, captures: int, seed: int) -> tuple[np.ndarray, list[np.ndarray], str]:
    from ..train.data import load_dataset
    from ..train.gradients import capture_gradients

    dataset = load_dataset(data, seed=seed)
    log(f"training the HDC model on {dataset.name} to capture {captures} real gradients ...")
    grads = capture_gradients(captures, data=dataset, seed=seed)
    return np.concatenate(grads), grads, dataset.name


def throughput(x: np.ndarray, rounds: int, error_bound: int) -> dict:
    impls = ["scalar"] + (["avx2"] if have_avx2() else [])
    codecs = {i: get_codec("inceptionn", error_bound=error_bound, impl=i) for i in impls}
    enc = np.empty(max_encoded_size(x.size), dtype=np.uint8)
    dec = np.empty_like(x)
    copy = np.empty_like(x)
    blob = codecs["scalar"].encode(x)
    src, dst = ffi.from_buffer(x), ffi.from_buffer(copy, require_writable=True)
    variants = {"memcpy": (lambda: ffi.memmove(dst, src, x.nbytes), x.nbytes)}
    for i, c in codecs.items():
        variants[f"encode {i}"] = (lambda c=c: c.encode_into(x, enc), x.nbytes)
        variants[f"decode {i}"] = (lambda c=c: c.decode_into(blob, dec), x.nbytes)
    # The numpy reference is orders of magnitude slower: a slice of the same data, fewer rounds.
    part = x[: max(8, x.size // 16)]
    ref = get_codec("inceptionn", error_bound=error_bound, impl="numpy")
    part_blob = ref.encode(part)
    part_out = np.empty_like(part)
    ref_variants = {"encode numpy": (lambda: ref.encode(part), part.nbytes),
                    "decode numpy": (lambda: ref.decode_into(part_blob, part_out), part.nbytes)}
    log(f"timing {len(variants)} variants over {x.nbytes / 1e6:.1f} MB, {rounds} interleaved rounds ...")
    timings = interleaved(variants, rounds)
    timings.update(interleaved(ref_variants, max(1, min(3, rounds))))
    memcpy = timings["memcpy"].median_gbps
    return {name: {"gbps": t.median_gbps, "min_gbps": t.spread_gbps[0], "max_gbps": t.spread_gbps[1],
                   "vs_memcpy": t.median_gbps / memcpy, "bytes": t.nbytes, "rounds": len(t.seconds)}
            for name, t in timings.items()}


def tier_table(grads: list[np.ndarray], bounds, workers: int, bucket: int) -> list[dict]:
    rows = []
    x = np.concatenate(grads)
    scaled, exps = zip(*(scaled_copy(g, workers, bucket) for g in grads))
    for label, inputs in (("raw", grads), ("scaled", scaled)):
        xs = np.concatenate(inputs)
        for k in bounds:
            c = get_codec("inceptionn", error_bound=k)
            h = c.histogram(xs)
            size = c.encoded_size(xs)
            y = np.concatenate([np.ldexp(c.roundtrip(s).astype(np.float64), -np.repeat(e, bucket)[: s.size])
                                for s, e in zip(inputs, exps)]) if label == "scaled" else c.roundtrip(xs)
            err = x.astype(np.float64) - y
            nmse = float(np.sum(err**2) / max(np.sum(x.astype(np.float64) ** 2), 1e-300))
            ratios = [s.nbytes / c.encoded_size(s) for s in inputs]
            rows.append({"input": label, "error_bound": k, "fractions": (h / h.sum()).tolist(),
                         "ratio": x.nbytes / size, "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "bits_per_value": 8 * size / x.size, "nmse": nmse})
    return rows


def print_report(r: dict) -> None:
    print(f"INCEPTIONN codec on real gradients: {r['gradients']['values']:,} float32 values "
          f"({r['gradients']['captures']} gradients of the HDC model on {r['gradients']['dataset']}, "
          f"{r['gradients']['params']:,} parameters each)")
    print(f"CPU: {r['cpu']}, AVX2: {'yes' if r['avx2'] else 'no'}; one core; GB/s of float32 input, "
          f"median of {r['rounds']} interleaved rounds [min-max]; error bound 2^{r['throughput_error_bound']}\n")
    print(f"{'variant':<15}{'GB/s':>8}{'spread':>17}{'x memcpy':>10}")
    for name, t in r["throughput"].items():
        spread = f"[{t['min_gbps']:.2f}-{t['max_gbps']:.2f}]"
        print(f"{name:<15}{t['gbps']:>8.2f}{spread:>17}{t['vs_memcpy']:>10.2f}")
    best = r["throughput"].get("encode avx2", r["throughput"]["encode scalar"])
    bestd = r["throughput"].get("decode avx2", r["throughput"]["decode scalar"])
    print(f"\npaper's FPGA engine: {PAPER_TARGET_GBPS} GB/s -> encode {best['gbps']:.2f} "
          f"({'meets' if best['gbps'] >= PAPER_TARGET_GBPS else 'BELOW'}), decode {bestd['gbps']:.2f} "
          f"({'meets' if bestd['gbps'] >= PAPER_TARGET_GBPS else 'BELOW'})\n")
    print("Bitwidth distribution and compression ratio (paper: Table III, Fig. 14a)")
    print(f"{'input':<14}{'bound':>6}{'0bit':>8}{'8bit':>8}{'16bit':>8}{'32bit':>8}"
          f"{'ratio':>8}{'per-grad range':>17}{'bits/val':>9}{'NMSE':>10}")
    for row in r["tiers"]:
        tiers = "".join(f"{100 * v:>7.1f}%" for v in row["fractions"])
        bound = f"2^{row['error_bound']}"
        spread = f"{row['ratio_min']:.2f}-{row['ratio_max']:.2f}x"
        print(f"{row['input']:<14}{bound:>6}{tiers}{row['ratio']:>7.2f}x{spread:>17}"
              f"{row['bits_per_value']:>9.2f}{row['nmse']:>10.2e}")
    print(f"\nscaled = each bucket of {r['bucket']:,} values multiplied by the exact power of two that keeps a "
          f"sum over {r['workers']} workers below 1.0 (what the collective did before wire format v2); NMSE of the "
          f"unscaled result.")
    print("Paper (Table III): 75-94% of values 0bit at 2^-10, over 90% at 2^-6; ratio up to 14.9x at 2^-6.")


def run(args) -> int:
    if args.rounds < 1:
        raise UserError("--rounds must be at least 1")
    if args.workers < 1 or args.bucket < 1:
        raise UserError("--workers and --bucket must be at least 1")
    if args.captures < 1:
        raise UserError("--captures must be at least 1")
    try:
        bounds = [int(b) for b in args.bounds.split(",")]
    except ValueError:
        raise UserError(f"--bounds takes comma-separated negative integers such as -10,-8,-6, got {args.bounds!r}") from None
    for k in bounds + [args.error_bound]:
        if problem := error_bound_problem(k):
            raise UserError(f"error bounds {problem}")
    x, grads, name = load_gradients(args.data, args.captures, args.seed)
    report = {
        "gradients": {"dataset": name, "captures": len(grads), "params": int(grads[0].size), "values": int(x.size)},
        "cpu": cpu_name(), "avx2": have_avx2(), "rounds": args.rounds,
        "throughput_error_bound": args.error_bound,
        "throughput": throughput(x, args.rounds, args.error_bound),
        "workers": args.workers, "bucket": args.bucket,
        "tiers": tier_table(grads, bounds, args.workers, args.bucket),
        "paper_target_gbps": PAPER_TARGET_GBPS,
    }
    return emit(report, args.json, print_report)


def add_arguments(p) -> None:
    add_gradient_arguments(p, "to train on")
    p.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds (default 9)")
    p.add_argument("--error-bound", type=int, default=DEFAULT_ERROR_BOUND,
                   help=f"bound exponent for the timing (default {DEFAULT_ERROR_BOUND})")
    p.add_argument("--bounds", default="-10,-8,-6", help="bound exponents for the tier table (default -10,-8,-6)")
    p.add_argument("--workers", type=int, default=4, help="workers the scaled rows assume (default 4)")
    p.add_argument("--bucket", type=int, default=65536, help="values per scaling bucket (default 65536)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data split and the captured gradients (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
