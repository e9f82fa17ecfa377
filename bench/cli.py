"""``inceptionn bench ...``: benchmarks that print figures, side by side in one run.

Each benchmark is a module here with a module docstring, ``HELP`` (one line) and
``add_arguments(parser)`` (which sets ``func``); list it in BENCHMARKS.
"""
import importlib
import json

# (subcommand, module) in --help order
BENCHMARKS = [
    ("tiers", "tiers"),          # the INCEPTIONN codec: speed and bitwidth tiers
    ("codecs", "codecs"),        # all five codecs side by side
    ("nic", "nic"),              # soft NIC goodput
    ("allreduce", "allreduce"),  # ring vs gloo vs MPI
    ("latency", "latency"),      # a standard MPI allreduce benchmark, stock vs the library
    ("scale", "scale"),          # ring precision vs ranks, simulated
    ("train", "train"),          # WA / INC training time and accuracy
]


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks: " + ", ".join(n for n, _ in BENCHMARKS),
                       description=__doc__.split("\n\n")[0])
    p.defer(_add_benchmarks)  # the benchmark modules import numpy: only once bench is chosen


def _add_benchmarks(p) -> None:
    benches = p.add_subparsers(dest="bench", metavar="BENCH")
    benches.required = True
    for name, module_name in BENCHMARKS:
        try:
            module = importlib.import_module(f"{__package__}.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__package__}.{module_name}":  # not written yet
                continue
            raise
        module.add_arguments(benches.add_parser(name, help=module.HELP, description=module.__doc__))


def emit(report: dict, as_json: bool, *printers) -> int:
    """A benchmark's last step: its report as JSON (--json), else each printer's text of it."""
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for show in printers:
            show(report)
    return 0


def add_gradient_arguments(p, data_use: str) -> None:
    """--data and --captures of a benchmark that runs on gradients captured from training."""
    p.add_argument("--data", metavar="PATH", help=f"MNIST (IDX file or folder, or .npz) {data_use}; "
                   "default: scikit-learn's digits, shipped with the package")
    p.add_argument("--captures", type=int, default=8, help="gradients to capture from training (default 8)")
