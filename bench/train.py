"""``inceptionn bench train``: WA, WA+C, INC and INC+C training side by side on one testbed, over
several seeds, and INC+C with and without gradient scaling and error feedback.

One testbed (N hosts, shaped links) serves every run; runs are interleaved (seed after seed, every
configuration within a seed) so a change in the machine's load spreads over all of them. Reported
per configuration: time per iteration split into compute, communication, summation and codec
work, communication change and speedup against WA, bytes on the wire, and the final test accuracy
as mean, standard deviation and range over the seeds, with its difference to the uncompressed
ring (INC) after the same epochs, and the time to reach INC's final accuracy minus 0.3 point.
"""
from __future__ import annotations

HELP = "training time breakdown and accuracy: WA, WA+C, INC, INC+C over seeds, scaling / error feedback on and off"

import json
import math
import os
import re
import statistics

# name on the command line -> (algo, compress, scaling, error_feedback)
CONFIGS = {
    "wa": ("wa", "none", None, None),
    "wa+c": ("wa", "nic", None, None),
    "inc": ("inc", "none", None, None),
    "inc+c": ("inc", "nic", None, None),
    "inc+c-no-scaling": ("inc", "nic", False, None),
    "inc+c-no-ef": ("inc", "nic", None, False),
    "inc+c-neither": ("inc", "nic", False, False),
    # the workers send raw values, as an unmodified program would; the soft NICs scale per packet
    "inc+c-scaled": ("inc", "nic-scaled", False, False),
    # on request (need torch): what a PyTorch user runs, DDP's exchange over gloo with torch's hooks
    "ddp": ("ddp", "none", None, None),
    "ddp-fp16": ("ddp", "fp16", None, None),
    "ddp-bf16": ("ddp", "bf16", None, None),
    "ddp-powersgd-r1": ("ddp", "powersgd-r1", None, None),
    "ddp-powersgd-r4": ("ddp", "powersgd-r4", None, None),
}
DEFAULT_CONFIGS = ",".join(c for c in CONFIGS if not c.startswith("ddp"))
CONFIG_SYNTAX = ("wa+CODEC or inc+CODEC (that codec inside the collective, error feedback as its traits ask), "
                 "then @ef or @noef to turn error feedback on or off, and @hN after inc+c or inc+inceptionn for "
                 "headroom N (the scaled wire)")


def config_spec(name: str) -> tuple[str, str, bool | None, bool | None, int] | None:
    """(algo, compress, scaling, error_feedback, headroom) of a --configs entry, None if unknown:
    a CONFIGS name or ``wa+CODEC`` / ``inc+CODEC`` (the codec in the application), then
    modifiers: ``@ef`` / ``@noef`` (error feedback on / off, lossy rings only) and ``@hN`` where
    the wire is scaled (headroom N, checked by limits.headroom_problem)."""
    from ..codecs import available_codecs

    base, *mods = name.split("@")
    if base in CONFIGS:
        algo, compress, scaling, feedback = CONFIGS[base]
    elif (m := re.fullmatch(r"(wa|inc)\+([a-z0-9]+)", base)) and m[2] in available_codecs():
        algo, compress, scaling, feedback = m[1], m[2], None, None
    else:
        return None
    headroom, seen = 0, set()
    for mod in mods:
        kind = "h" if mod[:1] == "h" else mod
        if kind in seen or (kind in ("ef", "noef") and seen & {"ef", "noef"}):
            return None
        seen.add(kind)
        if mod in ("ef", "noef") and algo != "ddp" and compress != "none":
            feedback = mod == "ef"
        elif kind == "h" and mod[1:].isdigit() and compress in ("nic", "inceptionn"):
            headroom = int(mod[1:])
        else:
            return None
    return algo, compress, scaling, feedback, headroom


def parse_configs(text: str) -> list[str]:
    from ..errors import UserError
    from ..limits import headroom_problem

    names = [c.strip().lower() for c in text.split(",") if c.strip()]
    bad = [c for c in names if config_spec(c) is None]
    if bad or not names:
        raise UserError(f"--configs: unknown {', '.join(bad) or 'empty list'}; choose {', '.join(CONFIGS)}, "
                        f"or {CONFIG_SYNTAX}")
    for c in names:
        if problem := headroom_problem(config_spec(c)[4]):
            raise UserError(f"--configs {c}: headroom {problem}")
    return list(dict.fromkeys(names))


def parse_seeds(args) -> list[int]:
    from ..errors import UserError

    if args.seed_list:
        try:
            return [int(s) for s in args.seed_list.split(",") if s.strip()]
        except ValueError:
            raise UserError(f"--seed-list takes comma-separated integers, got {args.seed_list!r}") from None
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    return list(range(args.seed, args.seed + args.seeds))


def accuracy_rows(results, diverged=(), baseline: str = "INC") -> list[dict]:
    """Final accuracy per configuration over seeds, and the mean paired difference to
    ``baseline`` (same seed, same epochs; seeds where either diverged are left out of it).
    ``diverged``: (name, seed) of runs whose loss went non-finite."""
    by: dict[str, dict[int, float]] = {}
    for r in results:
        by.setdefault(r.name, {})[r.config["seed"]] = r.final_accuracy
    failed: dict[str, list[int]] = {}
    for name, seed in diverged:
        failed.setdefault(name, []).append(seed)
        by.setdefault(name, {})
    base = by.get(baseline, {})
    rows = []
    for name, accs in by.items():
        vals = list(accs.values())
        diffs = [accs[s] - base[s] for s in accs if s in base]
        rows.append({"name": name, "seeds": sorted(accs), "diverged": sorted(failed.get(name, [])),
                     "mean": statistics.mean(vals) if vals else None,
                     "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                     "min": min(vals) if vals else None, "max": max(vals) if vals else None,
                     "vs_baseline": statistics.mean(diffs) if diffs and name != baseline else None,
                     "per_seed": {str(s): a for s, a in sorted(accs.items())}})
    return rows


TTA_MARGIN = 0.003   # time to accuracy: the baseline's final accuracy minus 0.3 point


def time_to_accuracy(curve, target: float, seconds_per_epoch: float) -> float | None:
    """Seconds until the accuracy ``curve`` (one value per epoch) first reaches ``target``, at
    ``seconds_per_epoch`` per epoch; None if it never does."""
    for epoch, acc in enumerate(curve, start=1):
        if acc >= target:
            return epoch * seconds_per_epoch
    return None


def time_to_accuracy_rows(results, baseline_names=("INC", "DDP"), per_iteration: dict | None = None) -> dict:
    """Per configuration: the epoch-wise accuracy curve (mean over seeds), and the measured time
    (mean seconds per iteration x iterations) at which it first reaches the first present
    baseline's mean final accuracy minus ``TTA_MARGIN``. ``per_iteration`` (name -> seconds)
    replaces the runs' own times with those measured on another link (``time_per_iteration``):
    the accuracy per epoch does not depend on the link, the runs being deterministic."""
    by: dict[str, list] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    base = next((b for b in baseline_names if b in by), None)
    if base is None:
        return {"baseline": None, "target": None, "rows": []}
    target = statistics.mean(r.final_accuracy for r in by[base]) - TTA_MARGIN
    rows = []
    for name, runs in by.items():
        epochs = min(len(r.accuracy) for r in runs)
        curve = [statistics.mean(r.accuracy[e] for r in runs) for e in range(epochs)]
        if per_iteration is not None and name not in per_iteration:
            continue
        iteration = per_iteration[name] if per_iteration is not None else statistics.mean(r.times["iteration"] for r in runs)
        per_epoch = iteration * runs[0].iters_per_epoch
        secs = time_to_accuracy(curve, target, per_epoch)
        rows.append({"name": name, "curve": curve, "seconds": secs, "iteration": iteration,
                     "epoch": None if secs is None else round(secs / per_epoch)})
    return {"baseline": base, "target": target, "rows": rows}


def parse_time_rates(text: str | None) -> list[str]:
    from ..errors import UserError
    from ..kernel_tc.units import parse_rate

    rates = [r.strip() for r in (text or "").split(",") if r.strip()]
    for r in rates:
        try:
            ok = parse_rate(r) > 0
        except (UserError, ValueError):
            ok = False
        if not ok:
            raise UserError(f"--time-at: bad rate {r!r} (tc units, e.g. 100mbit,1gbit)")
    return list(dict.fromkeys(rates))


def time_per_iteration(configs, iters_per_epoch: int, iters: int, **bed) -> dict[str, float]:
    """Mean seconds per iteration of each configuration over ``iters`` iterations on a testbed of
    its own (``bed``: run_configs' keywords, the link rate among them), the first iterations
    included as in the accuracy runs."""
    from dataclasses import replace

    from ..train.job import run_configs

    epochs = math.ceil(iters / iters_per_epoch)
    short = [replace(c, epochs=epochs, max_iters=min(iters_per_epoch, iters), decay_at=None) for c in configs]
    return {r.name: r.times["iteration"] for r in run_configs(short, **bed, on_diverged=lambda exc: None)}


def print_report(report: dict, results) -> None:
    from ..train.report import format_table, table_notes

    s = report["settings"]
    print(f"Training benchmark: HDC on {s['dataset']}, {s['hosts']} hosts, {s['rate'] or 'unshaped'} links "
          f"(MTU {s['mtu']}), {s['epochs']} epoch(s) x {s['iters_per_epoch']} iterations, seeds "
          f"{', '.join(map(str, s['seeds']))}, error bound 2^{s['error_bound']}; runs interleaved by seed")
    print()
    print("Time per iteration (mean over seeds and workers):")
    print(format_table(results))
    print()
    print(f"Final test accuracy over {len(s['seeds'])} seed(s), and the mean paired difference to INC "
          "(uncompressed ring, same seed, same epochs):")
    print(f"{'config':<28}{'mean':>8}{'std':>7}{'min-max':>16}{'vs INC':>9}   per seed")
    for r in report["accuracy"]:
        vs = f"{100 * r['vs_baseline']:+.2f}" if r["vs_baseline"] is not None else "-"
        per = "  ".join(f"{100 * a:.2f}" for a in r["per_seed"].values())
        if r["diverged"]:
            per += f"  (diverged: seed {', '.join(map(str, r['diverged']))})"
        if r["mean"] is None:
            print(f"{r['name']:<28}{'-':>8}{'-':>7}{'-':>16}{vs:>9}   {per}")
            continue
        span = f"{100 * r['min']:.2f}-{100 * r['max']:.2f}"
        print(f"{r['name']:<28}{100 * r['mean']:>7.2f}%{100 * r['std']:>7.2f}{span:>16}{vs:>9}   {per}")
    tta = report["time_to_accuracy"]
    if tta["baseline"]:
        print()
        print(f"Time to accuracy: measured time per iteration x iterations until the accuracy per epoch "
              f"(mean over seeds) first reaches {tta['baseline']}'s final accuracy minus "
              f"{100 * TTA_MARGIN:.1f} point ({100 * tta['target']:.2f}%):")
        for r in tta["rows"]:
            when = "never" if r["seconds"] is None else f"{r['seconds']:.1f} s (epoch {r['epoch']})"
            print(f"{r['name']:<28}{when}")
    for t_rate, tta in report["time_to_accuracy_at"].items():
        if not tta["baseline"]:
            continue
        print()
        print(f"Time to accuracy at {t_rate} (same target; the epochs of the runs above x their time per iteration "
              f"measured at {t_rate} over {s['time_iters']} iterations):")
        for r in sorted(tta["rows"], key=lambda r: math.inf if r["seconds"] is None else r["seconds"]):
            when = "never" if r["seconds"] is None else f"{r['seconds']:.1f} s (epoch {r['epoch']})"
            print(f"{r['name']:<28}{1000 * r['iteration']:8.1f} ms/iteration   {when}")
    print()
    print(table_notes())
    print("Accuracy target: INC+C within 0.5 point of INC (mean over seeds). no-scaling / no-EF: the soft NIC "
          "compresses the raw gradients / drops what it loses each iteration.")


def build_report(settings: dict, results, diverged, timed: dict) -> dict:
    """What ``--json`` prints and ``--report`` reads back: the settings, the tables computed from
    ``results`` (``diverged``: (name, seed) pairs; ``timed``: rate -> name -> seconds per
    iteration from ``time_per_iteration``) and every run."""
    from ..train.report import comparison_rows

    return {
        "settings": settings,
        "time": comparison_rows(results),
        "accuracy": accuracy_rows(results, diverged),
        "time_to_accuracy": time_to_accuracy_rows(results),
        "time_to_accuracy_at": {rate: time_to_accuracy_rows(results, per_iteration=t) for rate, t in timed.items()},
        "diverged": [{"name": n, "seed": sd} for n, sd in diverged],
        "runs": [r.to_dict() for r in results],
    }


def load_report(path: str):
    """The report and its runs from a file that ``--json`` wrote (``--report``), checked enough
    that a wrong file is one clear error."""
    from dataclasses import fields

    from ..errors import UserError
    from ..train.job import RunResult

    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except OSError as e:
        raise UserError(f"--report: cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"--report: {path} is not JSON ({e})") from None
    keys = ("settings", "accuracy", "time_to_accuracy", "time_to_accuracy_at", "runs")
    if not isinstance(report, dict) or any(k not in report for k in keys):
        raise UserError(f"--report: {path} is not what 'inceptionn bench train --json' writes")
    names = {f.name for f in fields(RunResult)}
    try:
        results = [RunResult(**{k: v for k, v in r.items() if k in names}) for r in report["runs"]]
    except (TypeError, AttributeError) as e:
        raise UserError(f"--report: a run in {path} is not a bench train run ({e})") from None
    return report, results


def run(args) -> int:
    from ..errors import UserError
    from ..train.cli import rate_arg
    from ..train.job import TrainConfig, preflight, preflight_testbed, run_configs
    from ..train.report import Progress, write_chart

    if args.report:
        report, results = load_report(args.report)
        print_report(report, results)
        return 0
    names = parse_configs(args.configs)
    seeds = parse_seeds(args)
    preflight_testbed(args.hosts, rate_arg(args.rate), args.mtu, args.name or "btrain")
    configs = []
    for seed in seeds:
        for n in names:
            algo, compress, scaling, feedback, headroom = config_spec(n)
            configs.append(TrainConfig(algo=algo, compress=compress, scaling=scaling, error_feedback=feedback,
                                       headroom=headroom, error_bound=args.error_bound, epochs=args.epochs,
                                       max_iters=args.max_iters, data=args.data, seed=seed, lr=args.lr,
                                       warmup=args.warmup_iters))
    time_rates = parse_time_rates(args.time_at)
    if args.time_iters < 2:
        raise UserError(f"--time-iters must be at least 2, got {args.time_iters}")
    data = preflight(configs[0])
    if args.chart and not args.chart.lower().endswith(".png"):
        raise UserError(f"--chart must name a .png file, got {args.chart}")
    rate = rate_arg(args.rate)
    progress = Progress(prefix="[bench train] ")
    progress.line(f"{len(configs)} runs: {', '.join(names)} x seeds {', '.join(map(str, seeds))}, "
                  f"{args.epochs} epoch(s) each, {args.hosts} hosts, {rate or 'unshaped'} MTU {args.mtu}; {data.name}")
    done, diverged = [], []

    def on_result(r):
        done.append(r)
        progress.result(r)
        progress.line(f"{len(done) + len(diverged)}/{len(configs)} runs done")

    def on_diverged(exc):
        diverged.append((exc.cfg.name, exc.cfg.seed))
        progress.line(f"{exc} -- recorded, going on")
        progress.line(f"{len(done) + len(diverged)}/{len(configs)} runs done")

    results = run_configs(configs, hosts=args.hosts, rate=rate, mtu=args.mtu, name=args.name or "btrain",
                          on_event=progress.event, progress=progress.line, on_result=on_result,
                          on_diverged=on_diverged)
    if not results:
        raise UserError("every run diverged; try a lower --lr")
    r0 = results[0]
    timed = {}
    for t_rate in time_rates:
        progress.line(f"timing every configuration at {t_rate}: {args.time_iters} iterations, seed {seeds[0]}")
        timed[t_rate] = time_per_iteration(configs[:len(names)], r0.iters_per_epoch, args.time_iters,
                                           hosts=args.hosts, rate=t_rate, mtu=args.mtu, name=args.name or "btrain",
                                           on_event=progress.event, progress=progress.line)
    report = build_report({"dataset": r0.dataset, "hosts": r0.hosts, "rate": rate, "mtu": args.mtu,
                           "epochs": args.epochs, "iters_per_epoch": r0.iters_per_epoch, "seeds": seeds,
                           "configs": names, "error_bound": args.error_bound, "lr": args.lr,
                           "warmup_iters": args.warmup_iters, "time_at": time_rates, "time_iters": args.time_iters,
                           "load_average": os.getloadavg()}, results, diverged, timed)
    if args.chart:
        report["chart"] = write_chart(results, os.path.abspath(args.chart),
                                      f"bench train: HDC on {r0.dataset}, {r0.hosts} hosts, {rate or 'unshaped'}, "
                                      f"seeds {', '.join(map(str, seeds))}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report, results)
        if args.chart:
            print(f"chart: {report['chart']}")
    return 0


def add_arguments(p) -> None:
    from ..train.cli import add_training_arguments

    add_training_arguments(p, epochs_default=20, switches=False)  # digits: converged, so seeds agree to ~1 point
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated configurations (default {DEFAULT_CONFIGS}); ddp, ddp-fp16, ddp-bf16, "
                   "ddp-powersgd-r1, ddp-powersgd-r4 on request: DDP's exchange over gloo without a hook, with its "
                   "fp16 / bf16 compress hooks and with powerSGD_hook at rank 1 / 4 (need torch); also "
                   f"{CONFIG_SYNTAX} (e.g. inc+thc, inc+c@h2)")
    p.add_argument("--seeds", type=int, default=3, help="number of seeds, from --seed on (default 3)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--seed-list", metavar="S,S,...", help="explicit seeds instead of --seeds/--seed")
    p.add_argument("--chart", metavar="PNG", help="also write a chart (time breakdown, accuracy per epoch)")
    p.add_argument("--time-at", metavar="RATE,RATE", help="after the accuracy runs, time each configuration at these "
                   "link rates (e.g. 100mbit,1gbit) and give its time to accuracy there: the same epochs, that "
                   "link's time per iteration (run the accuracy runs unshaped, --rate none, to save time)")
    p.add_argument("--time-iters", type=int, default=30, metavar="N",
                   help="iterations of each --time-at run (default 30; seed of the first accuracy run)")
    p.add_argument("--report", metavar="JSON", help="print the tables of an earlier run from the file its --json "
                   "wrote, and run nothing (no root needed)")
    p.set_defaults(func=run)
