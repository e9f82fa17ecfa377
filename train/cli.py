"""``inceptionn train``: the paper's HDC model trained data-parallel on a testbed."""
from __future__ import annotations

import json

from .. import limits
from ..limits import DEFAULT_ERROR_BOUND, ERROR_BOUND_MAX, ERROR_BOUND_MIN

DESCRIPTION = """Train the paper's HDC model (5 fully connected layers, width 500; SGD lr 0.1,
momentum 0.9, weight decay 5e-5, batch 25 per worker unless --batch) data-parallel on a testbed of --hosts
network-namespace hosts joined by shaped links, one worker per host. --algo inc is the INCEPTIONN
ring (gradients on both legs, every replica applies the same update); --algo wa is the
worker-aggregator baseline (rank 0 aggregates, sums, updates and returns the weights); --algo ddp
is PyTorch DDP's exchange over gloo through torch's own hooks (--compress none, fp16, bf16,
powersgd-r1 or powersgd-r4).
--compress nic runs the soft NIC on every host and tags the gradient sockets; a codec name
compresses in the application instead. Reports test accuracy per epoch, time per iteration split
into compute, communicate and sum, and bytes on the wire. Progress goes to stderr, --json output
to stdout. Needs root; the testbed is removed afterwards, also on Ctrl-C."""


def _codec_choices() -> str:
    try:
        from ..codecs import available_codecs

        return ", ".join(available_codecs())
    except Exception:  # noqa: BLE001 - help text only
        return "inceptionn, ..."


def add_training_arguments(p, *, epochs_default: int | None, hosts_default: int = 4, switches: bool = True,
                           warmup_default: int = 0) -> None:
    """Options shared by train, demo and bench train (link, data, optimiser, testbed)."""
    p.add_argument("--hosts", type=int, default=hosts_default, help=f"workers, one per testbed host (default {hosts_default})")
    if epochs_default is not None:
        p.add_argument("--epochs", type=int, default=epochs_default, help=f"epochs (default {epochs_default})")
    p.add_argument("--max-iters", type=int, metavar="N",
                   help="at most N iterations per epoch (short runs and tests; default: whole epochs)")
    p.add_argument("--rate", default="100mbit", help="link rate, tc units; 'none' for unshaped (default 100mbit)")
    p.add_argument("--mtu", type=int, default=9000, help="link MTU (default 9000)")
    p.add_argument("--data", metavar="PATH",
                   help="MNIST as an IDX directory or images file (gzip or not) or an .npz with x and y "
                   "(default: scikit-learn's digits, shipped with the package); a single set is split 80/20, seeded")
    p.add_argument("--error-bound", type=int, default=DEFAULT_ERROR_BOUND, metavar="K",
                   help=f"INCEPTIONN codec error bound 2^K for compressed runs, K from {ERROR_BOUND_MIN} to "
                   f"{ERROR_BOUND_MAX} (default {DEFAULT_ERROR_BOUND})")
    if switches:
        add_switches(p)
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1, the paper's)")
    p.add_argument("--warmup-iters", type=int, default=warmup_default, metavar="N",
                   help="raise the learning rate linearly from --lr/N to --lr over the first N iterations; "
                   f"0: none, the paper's recipe (default {warmup_default})")
    p.add_argument("--name", default=None, metavar="NAME",
                   help="testbed name (namespaces inc-NAME-*); change it to run beside another testbed")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def add_switches(p) -> None:
    p.add_argument("--no-scaling", dest="scaling", action="store_const", const=False, default=None,
                   help="do not scale gradients before the codec (wire format v2: a power of two per block of 256 "
                   "values, chosen at every hop; on by default with the inceptionn codec)")
    p.add_argument("--no-error-feedback", dest="error_feedback", action="store_const", const=False, default=None,
                   help="do not add what compression dropped back into the next iteration's gradient "
                   "(on by default with the inceptionn codec)")
    p.add_argument("--headroom", type=int, default=0, metavar="H",
                   help="bits of precision each scaled block gives up for a higher compression ratio, "
                   f"0..{limits.MAX_HEADROOM} "
                   "(its max scaled into [2^(-1-H), 2^-H); default 0; docs/collectives.md, 'Headroom')")


def rate_arg(rate: str):
    return None if rate in ("none", "unshaped") else rate


def register(sub) -> None:
    p = sub.add_parser("train", help="train the HDC model data-parallel on a testbed (WA or INC, compressed or not)",
                       description=DESCRIPTION)
    p.defer(_add_arguments)  # the codec list in --compress's help imports numpy


def _add_arguments(p) -> None:
    add_training_arguments(p, epochs_default=1)
    p.add_argument("--algo", choices=["wa", "inc", "ddp"], default="inc",
                   help="inc: the INCEPTIONN ring (default); wa: worker-aggregator; ddp: PyTorch DDP's exchange "
                   "over gloo (needs torch), with --compress none, fp16, bf16, powersgd-r1 or powersgd-r4: DDP's own "
                   "compress hooks and powerSGD_hook at rank 1 / 4")
    p.add_argument("--compress", default="none", metavar="HOW",
                   help=f"none (default), nic (the soft NIC on every host, INCEPTIONN codec at --error-bound), "
                   f"nic-scaled (the soft NIC's per-packet scaled codec: the workers send raw values), "
                   f"with --algo ddp fp16, bf16, powersgd-r1 or powersgd-r4, "
                   f"or a codec name to compress in the application: {_codec_choices()}")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the initial weights and the shuffling (default 0)")
    p.add_argument("--batch", type=int, default=25, metavar="B",
                   help="examples per worker per iteration (default 25, the paper's; keep the global batch, "
                   "B x --hosts, near 100 when comparing job sizes)")
    p.add_argument("--decay-at", type=int, metavar="EPOCH", help="from this epoch on (counted from 1), the learning "
                   "rate times 0.1, so that the final accuracy says where training settled (default: no decay)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .job import TrainConfig, preflight, preflight_testbed, run_configs
    from .report import Progress

    cfg = TrainConfig(algo=args.algo, compress=args.compress, error_bound=args.error_bound, scaling=args.scaling,
                      error_feedback=args.error_feedback, headroom=args.headroom, epochs=args.epochs, max_iters=args.max_iters,
                      data=args.data, seed=args.seed, lr=args.lr, warmup=args.warmup_iters, decay_at=args.decay_at,
                      batch=args.batch)
    preflight_testbed(args.hosts, rate_arg(args.rate), args.mtu, args.name or "train")
    preflight(cfg)
    progress = Progress(prefix="[train] ")

    def on_event(c, ev):
        progress.event(c, ev)

    [result] = run_configs([cfg], hosts=args.hosts, rate=rate_arg(args.rate), mtu=args.mtu,
                           name=args.name or "train", on_event=on_event, progress=progress.line)
    progress.result(result)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    r = result
    print(f"{r.name} on {r.hosts} hosts, {r.rate or 'unshaped'} links, MTU {r.mtu}; {r.dataset}; "
          f"{r.iterations} iterations ({r.iters_per_epoch} per epoch), seed {cfg.seed}")
    print("test accuracy per epoch: " + ", ".join(f"{100 * a:.2f}%" for a in r.accuracy))
    t = r.times
    print(f"time per iteration: {1000 * t['iteration']:.1f} ms = compute {1000 * t['compute']:.1f} + communicate "
          f"{1000 * t['communicate']:.1f} + sum {1000 * t['sum']:.1f} + codec {1000 * t['codec']:.1f} ms "
          f"(mean over workers, first iteration left out); training {r.train_seconds:.1f} s")
    b = r.bytes
    line = (f"bytes on the wire: {b['wire_tx'] / 1e6:.1f} MB over all links ({b['wire_per_iteration'] / 1e6:.2f} MB "
            f"per iteration); the workers wrote {b['app_sent'] / 1e6:.1f} MB into their sockets")
    if b.get("nicd"):
        n = b["nicd"]
        line += (f"; soft NICs: {n['egress_orig_bytes'] / 1e6:.1f} MB of tagged payload sent as "
                 f"{n['egress_wire_bytes'] / 1e6:.1f} MB ({n['ratio']:.2f}x)")
    print(line)
    print(f"replicas: {'identical' if r.replicas_identical else 'DIFFERENT'} final parameters on all {r.hosts} "
          f"(checksum {r.replicas[0]['checksum']})")
    return 0
