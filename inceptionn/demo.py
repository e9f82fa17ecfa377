"""``inceptionn demo``: the main job. A 4-host testbed with shaped links trains the paper's HDC model
four ways: WA (worker-aggregator), WA+C (its gradient leg compressed by the soft NIC), INC (the
INCEPTIONN ring) and INC+C (the ring, both legs compressed by the soft NIC, error bound 2^-10),
and, when PyTorch is installed, the way a PyTorch user would cut traffic instead: DDP's
fp16_compress_hook over gloo. It prints the time per iteration split into compute, communication
and summation, the communication reduction and speedup against WA (the paper's Fig. 12), and the
final test accuracy over seeds (Fig. 13), writes the same as a PNG chart, and removes its testbeds
afterwards, also on Ctrl-C. Data: scikit-learn's digits, shipped with the package (no download);
--data for MNIST. Needs root (network namespaces, netfilter).

Times come from --timed-epochs on the shaped links; accuracy from whole runs of --epochs for
--seeds seeds on a second testbed with unshaped links, which finishes them in a fraction of the
time: what a run computes does not depend on the link (the replicas end identical, the soft NICs'
decode is what the sender predicted), only how long it takes.
"""
from __future__ import annotations

import json
import os

DEFAULT_EPOCHS = 10
DEFAULT_TIMED_EPOCHS = 2   # 30 iterations on digits: the mean time per iteration settles well before
DEFAULT_SEEDS = 3
# 2 epochs of digits on 4 workers: without it lr 0.1 with momentum 0.9 overshoots, and every
# configuration falls to about 25% at epoch 3 before it climbs (docs/training.md, "The demo's recipe")
DEFAULT_WARMUP = 30
DEFAULT_CHART = "inceptionn-demo.png"
PAPER = ("paper (4 workers, 10 Gb Ethernet, FPGA NICs): INC+C communication -70.9 to -80.7% and "
         "2.2-3.1x training speedup vs WA; INC alone 31-52% faster than WA")


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def demo_configs(args, epochs: int, seed: int, torch: bool) -> list:
    from .train.job import TrainConfig

    common = dict(epochs=epochs, max_iters=args.max_iters, data=args.data, seed=seed, lr=args.lr,
                  warmup=args.warmup_iters, error_bound=args.error_bound, scaling=args.scaling,
                  error_feedback=args.error_feedback)
    configs = [TrainConfig(algo="wa", compress="none", **common),
               TrainConfig(algo="wa", compress="nic", **common),
               TrainConfig(algo="inc", compress="none", **common),
               TrainConfig(algo="inc", compress="nic", **common)]
    if torch:
        configs.append(TrainConfig(algo="ddp", compress="fp16", **common))
    return configs


def register(sub) -> None:
    from .train.cli import add_training_arguments

    p = sub.add_parser("demo", help="the main job: WA, WA+C, INC, INC+C (and DDP's fp16 hook) side by side on a "
                       "4-host testbed", description=__doc__)
    add_training_arguments(p, epochs_default=DEFAULT_EPOCHS, warmup_default=DEFAULT_WARMUP)
    p.add_argument("--timed-epochs", type=int, default=DEFAULT_TIMED_EPOCHS, metavar="N",
                   help=f"epochs each configuration runs on the shaped links for the time columns "
                   f"(default {DEFAULT_TIMED_EPOCHS})")
    p.add_argument("--seed", type=int, default=0, help="first seed of the split, initial weights and shuffling "
                   "(default 0)")
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS,
                   help=f"seeds of whole runs for the accuracy, from --seed on (default {DEFAULT_SEEDS})")
    p.add_argument("--out", default=DEFAULT_CHART, metavar="PNG",
                   help=f"where to write the chart (default ./{DEFAULT_CHART})")
    p.set_defaults(func=run)


def spread_line(rows: list[dict], name: str, base: str) -> str | None:
    """Where ``name``'s mean accuracy lies against ``base``'s seeds."""
    by = {r["name"]: r for r in rows}
    a, b = by.get(name), by.get(base)
    if not (a and b):
        return None
    where = "BELOW" if a["accuracy"] < b["accuracy_min"] else "above" if a["accuracy"] > b["accuracy_max"] else "within"
    return (f"{name} {100 * a['accuracy']:.2f}% (mean of {a['accuracy_runs']} seeds) is {where} the range of {base}'s "
            f"seeds, {100 * b['accuracy_min']:.2f}-{100 * b['accuracy_max']:.2f}% "
            f"({100 * (a['accuracy'] - b['accuracy']):+.2f} points against its mean)")


def falls(runs) -> list[str]:
    """Runs whose test accuracy fell below their first epoch's at some later epoch."""
    return [f"{r.name} seed {r.config['seed']}" for r in runs if r.accuracy and min(r.accuracy) < r.accuracy[0]]


def run(args) -> int:
    from .errors import UserError
    from .train.cli import rate_arg
    from .train.job import preflight, preflight_testbed, run_configs
    from .train.report import Progress, comparison_rows, format_table, table_notes, write_chart

    if args.timed_epochs < 1:
        raise UserError(f"--timed-epochs must be at least 1, got {args.timed_epochs}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    torch = have_torch()
    seeds = list(range(args.seed, args.seed + args.seeds))
    timed = demo_configs(args, args.timed_epochs, args.seed, torch)
    trained = [c for s in seeds for c in demo_configs(args, args.epochs, s, torch)]
    name = args.name or "demo"
    preflight_testbed(args.hosts, rate_arg(args.rate), args.mtu, name)
    data = preflight(timed[0])
    for c in trained:
        c.check()
    out = os.path.abspath(args.out)
    if not out.lower().endswith(".png"):
        raise UserError(f"--out must name a .png file, got {args.out}")
    if not os.path.isdir(os.path.dirname(out)):
        raise UserError(f"--out: directory {os.path.dirname(out)} does not exist")
    rate = rate_arg(args.rate)
    progress = Progress(prefix="[demo] ")
    progress.line(f"{', '.join(c.name for c in timed)}: {args.timed_epochs} epoch(s) each timed on {args.hosts} "
                  f"hosts over {rate or 'unshaped'} links, MTU {args.mtu}; then {args.epochs} epoch(s) for seeds "
                  f"{', '.join(map(str, seeds))} on unshaped links for the accuracy; {data.name}")
    if not torch:
        progress.line("PyTorch is not installed: the DDP fp16 hook column is skipped "
                      "(pip install 'inceptionn[torch]' to add it)")

    def on_event(cfg, ev):
        progress.event(cfg, ev)

    timings = run_configs(timed, hosts=args.hosts, rate=rate, mtu=args.mtu, name=name, on_event=on_event,
                          progress=progress.line, on_result=progress.result)
    results = run_configs(trained, hosts=args.hosts, rate=None, mtu=args.mtu, name=name, on_event=on_event,
                          progress=progress.line, on_result=progress.result)
    r0 = timings[0]
    title = (f"INCEPTIONN demo: HDC on {r0.dataset}, {r0.hosts} hosts, {rate or 'unshaped'} links (MTU {r0.mtu}), "
             f"{args.epochs} epoch(s) x {r0.iters_per_epoch} iterations, seeds {seeds[0]}-{seeds[-1]}, "
             f"error bound 2^{args.error_bound}")
    chart = write_chart(timings, out, title, accuracy_runs=results)
    rows = comparison_rows(timings, accuracy_runs=results)
    fell = falls(results)
    if args.json:
        print(json.dumps({"title": title, "chart": chart, "rows": rows, "fell": fell,
                          "timed": [r.to_dict() for r in timings], "runs": [r.to_dict() for r in results]},
                         indent=2))
        return 0
    print(title)
    print(format_table(timings, accuracy_runs=results))
    print()
    print(table_notes() + f" Times: {args.timed_epochs} epoch(s) per configuration on the {rate or 'unshaped'} "
          f"links, seed {args.seed}; accuracy: after {args.epochs} epoch(s), mean ± standard deviation over seeds "
          f"{', '.join(map(str, seeds))}, trained on unshaped links (the same values, sooner). "
          f"DDP fp16 hook = torch's fp16_compress_hook over gloo (16-bit values on the wire)."
          + ("" if torch else " (skipped: no PyTorch)"))
    for line in (spread_line(rows, "INC+C", "INC"), spread_line(rows, "WA+C", "WA")):
        if line:
            print("accuracy: " + line)
    print("curves: " + (f"accuracy fell below its first epoch's in {', '.join(fell)}" if fell else
                        f"no run's accuracy fell below its first epoch's (warm-up over {args.warmup_iters} "
                        f"iterations, lr {args.lr})"))
    by = {r["name"]: r for r in rows}
    incc, fp16 = by.get("INC+C"), by.get("DDP fp16 hook")
    if incc and incc["comm_reduction"] is not None:
        print(f"INC+C vs WA: communication {-100 * incc['comm_reduction']:+.1f}%, speedup {incc['speedup']:.2f}x; "
              + PAPER)
    if incc and fp16:
        print(f"INC+C vs DDP's fp16 hook: {fp16['iteration'] / incc['iteration']:.2f}x faster per iteration")
    same = all(r.replicas_identical for r in timings + results)
    print(f"replicas: {'identical final parameters on every host in every run' if same else 'DIFFER in some run'}")
    print(f"chart: {chart}")
    return 0
