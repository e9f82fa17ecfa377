"""``inceptionn demo``: the main job. A 4-host testbed with shaped links trains the paper's HDC model
four ways for the same epochs: WA (worker-aggregator), WA+C (its gradient leg compressed by the
soft NIC), INC (the INCEPTIONN ring) and INC+C (the ring, both legs compressed by the soft NIC,
error bound 2^-10). It prints the time per iteration split into compute, communication and
summation, the communication reduction and speedup against WA, and the final test accuracy (the
paper's Fig. 12 and 13), writes the same as a PNG chart, and removes the testbed afterwards, also
on Ctrl-C. Data: scikit-learn's digits, shipped with the package (no download); --data for MNIST.
Needs root (network namespaces, netfilter).
"""
from __future__ import annotations

import json
import os

DEFAULT_EPOCHS = 10   # about 8-9 minutes on an idle 2-core VM at 100 Mbit; WA takes half of it
DEFAULT_CHART = "inceptionn-demo.png"
PAPER = ("paper (4 workers, 10 Gb Ethernet, FPGA NICs): INC+C communication -70.9 to -80.7% and "
         "2.2-3.1x training speedup vs WA; INC alone 31-52% faster than WA")


def demo_configs(args) -> list:
    from .train.job import TrainConfig

    common = dict(epochs=args.epochs, max_iters=args.max_iters, data=args.data, seed=args.seed, lr=args.lr,
                  error_bound=args.error_bound, scaling=args.scaling, error_feedback=args.error_feedback)
    return [TrainConfig(algo="wa", compress="none", **common),
            TrainConfig(algo="wa", compress="nic", **common),
            TrainConfig(algo="inc", compress="none", **common),
            TrainConfig(algo="inc", compress="nic", **common)]


def register(sub) -> None:
    from .train.cli import add_training_arguments

    p = sub.add_parser("demo", help="the main job: WA, WA+C, INC, INC+C trained side by side on a 4-host testbed",
                       description=__doc__)
    add_training_arguments(p, epochs_default=DEFAULT_EPOCHS)
    p.add_argument("--seed", type=int, default=0, help="seed of the split, initial weights and shuffling (default 0)")
    p.add_argument("--out", default=DEFAULT_CHART, metavar="PNG",
                   help=f"where to write the chart (default ./{DEFAULT_CHART})")
    p.set_defaults(func=run)


def run(args) -> int:
    from .errors import UserError
    from .train.cli import rate_arg
    from .train.job import preflight, preflight_testbed, run_configs
    from .train.report import Progress, comparison_rows, format_table, table_notes, write_chart

    configs = demo_configs(args)
    preflight_testbed(args.hosts, rate_arg(args.rate), args.mtu, args.name or "demo")
    data = preflight(configs[0])
    out = os.path.abspath(args.out)
    if not out.lower().endswith(".png"):
        raise UserError(f"--out must name a .png file, got {args.out}")
    if not os.path.isdir(os.path.dirname(out)):
        raise UserError(f"--out: directory {os.path.dirname(out)} does not exist")
    rate = rate_arg(args.rate)
    progress = Progress(prefix="[demo] ")
    progress.line(f"{len(configs)} runs (WA, WA+C, INC, INC+C), {args.epochs} epoch(s) each, on {args.hosts} hosts "
                  f"over {rate or 'unshaped'} links, MTU {args.mtu}; {data.name}")
    results = []

    def on_event(cfg, ev):
        progress.event(cfg, ev)

    def on_result(r):
        results.append(r)
        progress.result(r)

    run_configs(configs, hosts=args.hosts, rate=rate, mtu=args.mtu, name=args.name or "demo",
                on_event=on_event, progress=progress.line, on_result=on_result)
    r0 = results[0]
    title = (f"INCEPTIONN demo: HDC on {r0.dataset}, {r0.hosts} hosts, {rate or 'unshaped'} links (MTU {r0.mtu}), "
             f"{args.epochs} epoch(s) x {r0.iters_per_epoch} iterations, error bound 2^{args.error_bound}")
    chart = write_chart(results, out, title)
    rows = comparison_rows(results)
    if args.json:
        print(json.dumps({"title": title, "chart": chart, "rows": rows, "runs": [r.to_dict() for r in results]},
                         indent=2))
        return 0
    print(title)
    print(format_table(results))
    print()
    print(table_notes())
    by = {r["name"]: r for r in rows}
    inc, incc = by.get("INC"), by.get("INC+C")
    if inc and incc:
        print(f"accuracy: INC+C {100 * incc['accuracy']:.2f}% vs INC {100 * inc['accuracy']:.2f}% "
              f"({100 * (incc['accuracy'] - inc['accuracy']):+.2f} points) after the same {args.epochs} epoch(s), "
              f"seed {args.seed}; one seed moves by points from epoch to epoch at lr 0.1: `inceptionn bench "
              f"train` compares the mean over seeds")
    if incc and incc["comm_reduction"] is not None:
        print(f"INC+C vs WA: communication {-100 * incc['comm_reduction']:+.1f}%, speedup {incc['speedup']:.2f}x; "
              + PAPER)
    same = all(r.replicas_identical for r in results)
    print(f"replicas: {'identical final parameters on every host in every run' if same else 'DIFFER in some run'}")
    print(f"chart: {chart}")
    return 0
