"""``inceptionn bench codecs``: the five gradient codecs side by side on real gradients.

Every codec runs with its paper's settings on the same gradients, captured from real training
steps of the paper's HDC model (``train/gradients.py``), each in the unit its paper uses: the
INCEPTIONN codec value by value (on the wire floats of wire format v2 as one hop of the ring
sends them: a power of two per block of 256 values, its exponent float in the stream; and
raw), TernGrad and 3LC per tensor (layer weight or bias), THC and FFT per whole
gradient. 3LC and THC run with their error feedback over the sequence of captures (one key per
tensor, kept from step to step), as they are meant to run. Per row:

- compression ratio = float32 bytes in / bytes out, everything counted (headers, scalers, THC's
  table and power-of-two padding, FFT's bitmap, the values a codec must agree on with the other
  workers before it sends: 8 bytes each), with the paper's own figure beside it;
- NMSE of one round trip (for 3LC and THC without error feedback: what a first step costs),
  and for error-feedback rows the NMSE of the sum of everything decoded over the sequence
  against the sum of the gradients;
- encode and decode GB/s of float32 input, one thread, as the row runs (error feedback
  included), median of interleaved rounds [min-max] with memcpy of the same bytes in the same
  rounds;
- optionally (``--train-epochs E``) the final test accuracy of the HDC trained data-parallel on a
  testbed (``train/job.py``) with the codec inside the collective (``compress=<codec>``), and
  uncompressed, for the same epochs.
"""
from __future__ import annotations

HELP = "all five codecs on real gradients: ratio, NMSE, GB/s, training accuracy; papers' figures beside"

import os
import sys
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import UserError
from .cli import add_gradient_arguments, emit
from .timing import cpu_name
from .codecs_report import LAST_EPOCHS, build_rows, print_report

WORKERS = 4          # workers of the default training testbed
AGREE_BYTES = 8      # one float64 per value agreed among workers before sending


def log(msg: str) -> None:
    print(f"[bench codecs] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Row:
    id: str
    codec: str
    label: str
    params: dict
    unit: str                      # "value" (per value, whole gradient), "tensor", "gradient"
    paper: str                     # the paper's compression figure
    ef: bool = False               # error feedback over the sequence of captures
    scaled: bool = False           # INCEPTIONN: the ring's wire transform (wire format v2) before the codec
    train: dict | None = None      # TrainConfig fields of the accuracy run, None: not runnable
    train_as: str | None = None    # accuracy is that row's run (differs only losslessly)
    note: str = ""


ROWS = [
    Row("inc-scaled", "inceptionn", "INCEPTIONN 2^-10, scaled", {"error_bound": -10}, "value",
        "5.5-11.6x (Sec. VIII-C, 2^-10)", scaled=True, train={"compress": "inceptionn"},
        note="wire format v2 as a hop of the ring sends it (a power of two per 256 values, exponents counted); "
        "training: scaling + EF on"),
    Row("inc-raw", "inceptionn", "INCEPTIONN 2^-10, raw", {"error_bound": -10}, "value",
        "5.5-11.6x (Sec. VIII-C, 2^-10)",
        train={"compress": "inceptionn", "scaling": False, "error_feedback": False},
        note="the codec as printed on raw gradients; training: no scaling, no EF"),
    Row("terngrad-2bit", "terngrad", "TernGrad 2-bit, clip 2.5", {"packing": "2bit", "clip": 2.5}, "tensor",
        "16x", train={"compress": "terngrad"}),
    Row("terngrad-base3", "terngrad", "TernGrad base-3, clip 2.5", {"packing": "base3", "clip": 2.5}, "tensor",
        "~20x (20.18x bound)", train_as="terngrad-2bit", note="same values as 2-bit, other packing"),
    Row("3lc-nozre", "3lc", "3LC s=1.0, no ZRE, EF", {"sparsity": 1.0, "zre": False}, "tensor",
        "20x (Table 2)", ef=True, train_as="3lc-s1.0", note="ZRE is lossless: accuracy of s=1.0"),
    Row("3lc-s1.0", "3lc", "3LC s=1.0, EF", {"sparsity": 1.0}, "tensor", "39.4x (Table 2)", ef=True,
        train={"compress": "3lc"}, note="training: the collective's EF per ring block"),
    Row("3lc-s1.5", "3lc", "3LC s=1.5, EF", {"sparsity": 1.5}, "tensor", "70.9x (Table 2)", ef=True),
    Row("3lc-s1.75", "3lc", "3LC s=1.75, EF", {"sparsity": 1.75}, "tensor", "107x (Table 2)", ef=True),
    Row("3lc-s1.9", "3lc", "3LC s=1.9, EF", {"sparsity": 1.9}, "tensor", "160x (Table 2)", ef=True),
    Row("thc-nonuniform", "thc", "THC b=4 g=30 p=1/32, EF",
        {"bits": 4, "granularity": 30, "p": 1 / 32, "table": "nonuniform"}, "gradient",
        "8x per worker up", ef=True, train={"compress": "thc"}),
    Row("thc-uniform", "thc", "THC b=4 uniform g=15, EF",
        {"bits": 4, "granularity": 15, "p": 1 / 32, "table": "uniform"}, "gradient", "8x per worker up", ef=True),
    Row("fft", "fft", "FFT theta=0.85 N=10", {"theta": 0.85, "bits": 10}, "gradient",
        "21.3x (bitmap not counted)", train={"compress": "fft"}),
]
ROW_IDS = [r.id for r in ROWS]
CODEC_NAMES = list(dict.fromkeys(r.codec for r in ROWS))


def select_rows(text: str | None) -> list[Row]:
    """``--codecs``: codec names (all their rows) and/or row ids, comma-separated."""
    if text is None:
        return list(ROWS)
    tokens = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not tokens:
        raise UserError(f"--codecs is empty; choose codecs ({', '.join(CODEC_NAMES)}) or rows ({', '.join(ROW_IDS)})")
    bad = [t for t in tokens if t not in CODEC_NAMES and t not in ROW_IDS]
    if bad:
        raise UserError(f"--codecs: unknown {', '.join(repr(b) for b in bad)}; choose codecs "
                        f"({', '.join(CODEC_NAMES)}) or rows ({', '.join(ROW_IDS)})")
    return [r for r in ROWS if r.codec in tokens or r.id in tokens]


# --- the gradients and their units ------------------------------------------------------------------

@dataclass
class Gradients:
    dataset: str
    grads: list[np.ndarray]
    tensors: list[tuple[str, slice]]          # name and slice of each tensor in the flat vector
    scaled: list[np.ndarray] = field(default_factory=list)   # each gradient's wire floats (wire format v2)
    bs: object = None                                        # the BlockScale that made them

    @property
    def params(self) -> int:
        return int(self.grads[0].size)

    @property
    def values(self) -> int:
        return sum(int(g.size) for g in self.grads)

    @property
    def nbytes(self) -> int:
        return sum(int(g.nbytes) for g in self.grads)

    def units(self, row: Row) -> list[tuple[str, slice]]:
        n = self.params
        if row.unit == "tensor":
            return self.tensors
        return [("gradient", slice(0, n))]

    def inputs(self, row: Row) -> list[np.ndarray]:
        return self.scaled if row.scaled else self.grads

    def unscale(self, codec, blob: bytes, y: np.ndarray, wire: np.ndarray | None = None) -> None:
        """``y`` = what a receiver makes of a scaled row's blob: the codec's wire floats, unscaled."""
        wire = np.empty(self.bs.wire_values(y.size), dtype=np.float32) if wire is None else wire
        codec.decode_into(blob, wire)
        self.bs.decode_into(wire, y)


def load_gradients(data, captures: int, seed: int) -> Gradients:
    from ..train.data import load_dataset
    from ..train.gradients import capture_gradients
    from ..train.hdc import HDC
    from ..codecs.blockscale import BlockScale

    dataset = load_dataset(data, seed=seed)
    log(f"training the HDC model on {dataset.name} to capture {captures} real gradients ...")
    grads = capture_gradients(captures, data=dataset, seed=seed)
    model = HDC(dataset.n_features, dataset.n_classes)
    base = model.params.ctypes.data
    tensors = []
    for name, view in model.tensors(model.params):
        start = (view.ctypes.data - base) // view.itemsize
        tensors.append((name, slice(start, start + view.size)))
    g = Gradients(dataset.name, grads, tensors)
    g.bs = BlockScale(next(r for r in ROWS if r.scaled).params["error_bound"])
    g.scaled = [g.bs.encode(x) for x in grads]
    return g


# --- codecs as the rows run them ----------------------------------------------------------------------

def make_codec(row: Row, seed: int, ef: bool | None = None):
    """The row's codec, and its error-feedback memory (None: off)."""
    from ..codecs import ErrorFeedback, applicable, get_codec

    ef = row.ef if ef is None else ef
    # the seeds of codecs that draw random numbers, and whether error feedback runs
    p = applicable(row.codec, seed=seed, noise_seed=seed, error_feedback=ef)
    return get_codec(row.codec, **{**p, **row.params}), (ErrorFeedback() if ef else None)


def encode(codec, memory, x: np.ndarray, key: str) -> bytes:
    """One encode as the row runs it: with error feedback per tensor ``key`` when it has a memory."""
    return memory.encode(codec, x, key) if memory is not None else codec.encode(x)


def agreement_bytes(row: Row, codec, n: int) -> int:
    """Values the codec must agree on with the other workers before this encode (control plane)."""
    if codec.needs_agreement:
        return AGREE_BYTES                      # one statistic (THC: the norm l)
    return 0


def _nmse(err2: float, sig2: float) -> float:
    return float(err2 / sig2) if sig2 > 0 else float("nan")


def quality(row: Row, g: Gradients, seed: int) -> tuple[dict, list]:
    """Ratio and NMSE over the sequence of captures, as the row runs; blobs kept for decode timing."""
    codec, memory = make_codec(row, seed)
    units = g.units(row)
    wire = agree = 0
    err2 = sig2 = 0.0
    sum_x = np.zeros(g.params)
    sum_y = np.zeros(g.params)
    blobs = []
    for x, inp in zip(g.grads, g.inputs(row)):
        y = np.empty_like(x)
        step = []
        if row.scaled:                  # one blob of the gradient's wire floats
            blob = codec.encode(inp)
            step.append(blob)
            wire += len(blob)
            g.unscale(codec, blob, y)
        else:
            for key, sl in units:
                blob = encode(codec, memory, inp[sl], key)
                step.append(blob)
                wire += len(blob)
                agree += agreement_bytes(row, codec, sl.stop - sl.start)
                codec.decode_into(blob, y[sl])
        blobs.append(step)
        y64 = y.astype(np.float64)
        sum_x += x
        sum_y += y64
        err2 += float(np.sum((x - y64) ** 2))
        sig2 += float(np.sum(x.astype(np.float64) ** 2))
    out = {"wire_bytes": wire, "agreement_bytes": agree, "ratio": g.nbytes / (wire + agree),
           "bits_per_value": 8 * (wire + agree) / g.values, "nmse": _nmse(err2, sig2)}
    if row.ef:
        out["nmse_sequence"] = _nmse(err2, sig2)  # per step against that step's gradient, with EF
        out["nmse"] = stateless_nmse(row, g, seed)
        out["ef_sum_nmse"] = _nmse(float(np.sum((sum_x - sum_y) ** 2)), float(np.sum(sum_x ** 2)))
    return out, blobs


def stateless_nmse(row: Row, g: Gradients, seed: int) -> float:
    """One round trip of each capture with nothing accumulated (error feedback off)."""
    codec, _ = make_codec(row, seed, ef=False)
    err2 = sig2 = 0.0
    for x in g.grads:
        y = np.empty_like(x)
        for _, sl in g.units(row):
            codec.decode_into(codec.encode(x[sl]), y[sl])
        err2 += float(np.sum((x.astype(np.float64) - y) ** 2))
        sig2 += float(np.sum(x.astype(np.float64) ** 2))
    return _nmse(err2, sig2)


def speed_variants(rows: list[Row], g: Gradients, blobs: dict, seed: int) -> dict:
    """name -> (callable, bytes of float32 input): encode and decode of every capture per call."""
    from ..codecs._native import ffi

    flat = np.concatenate(g.grads)
    copy = np.empty_like(flat)
    src, dst = ffi.from_buffer(flat), ffi.from_buffer(copy, require_writable=True)
    variants = {"memcpy": (lambda: ffi.memmove(dst, src, flat.nbytes), flat.nbytes)}
    outs = [np.empty_like(x) for x in g.grads]
    for row in rows:
        codec, memory = make_codec(row, seed + 1)
        units = g.units(row)
        inputs = g.inputs(row)
        if row.scaled:                           # the wire transform, then the codec, as a hop of the ring
            buf = np.empty(codec.max_encoded_size(g.bs.wire_values(g.params)), dtype=np.uint8)

            def enc(codec=codec, buf=buf):
                for x in g.grads:
                    codec.encode_into(g.bs.encode(x), buf)
        elif row.unit == "value":                # the whole gradient into one reused buffer, as the NIC does
            buf = np.empty(codec.max_encoded_size(g.params), dtype=np.uint8)

            def enc(codec=codec, inputs=inputs, buf=buf):
                for x in inputs:
                    codec.encode_into(x, buf)
        else:
            def enc(codec=codec, memory=memory, inputs=inputs, units=units):
                for x in inputs:
                    for key, sl in units:
                        encode(codec, memory, x[sl], key)

        if row.scaled:                           # the codec, then the unscaling
            def dec(codec=codec, steps=blobs[row.id],
                    wire=np.empty(g.bs.wire_values(g.params), dtype=np.float32)):
                for step, y in zip(steps, outs):
                    g.unscale(codec, step[0], y, wire)
        else:
            def dec(codec=codec, steps=blobs[row.id], units=units):
                for step, y in zip(steps, outs):
                    for blob, (_, sl) in zip(step, units):
                        codec.decode_into(blob, y[sl])

        variants[f"encode {row.id}"] = (enc, g.nbytes)
        variants[f"decode {row.id}"] = (dec, g.nbytes)
    return variants


def speed(rows: list[Row], g: Gradients, blobs: dict, rounds: int, seed: int) -> dict:
    from .timing import interleaved

    variants = speed_variants(rows, g, blobs, seed)
    log(f"timing {len(variants)} variants over {g.nbytes / 1e6:.1f} MB of float32, {rounds} interleaved rounds ...")
    timings = interleaved(variants, rounds, progress=log)
    return {name: {"gbps": t.median_gbps, "min_gbps": t.spread_gbps[0], "max_gbps": t.spread_gbps[1],
                   "bytes": t.nbytes, "rounds": len(t.seconds)} for name, t in timings.items()}


# --- training accuracy ----------------------------------------------------------------------------------

def summed_in_ring(row: Row) -> bool:
    """Whether the ring engine sums this row's streams without decoding (its codec's trait)."""
    from ..codecs import table
    return row.ef and table.description(row.codec) is not None and table.traits(row.codec)["c_summed"]


def summed_ring(rows: list[Row], g: Gradients, calls: int, seed: int, ranks: int = WORKERS) -> dict | None:
    """The first error-feedback row whose codec the ring sums without decoding (trait ``c_summed``:
    THC today): its codec time per call in the ring engine (collective/ring_engine.c, the C
    Group.allreduce runs): ``ranks`` ranks as threads over socket pairs
    on this host, each allreducing one capture (rank r: capture k + r) per call, the whole gradient
    one block per rank as Group runs THC. Per call and rank: the thread CPU seconds of the whole call
    and the engine's codec + sum seconds (wall, struct re_stats); medians over ranks and calls, with
    [min-max]; and the NMSE of the result against the exact sum."""
    import socket
    import threading
    import time

    from ..codecs import applicable, get_codec
    from ..collective._engine import ffi, lib
    from ..collective.engine import _c_codec

    row = next((r for r in rows if summed_in_ring(r)), None)
    if row is None:
        return None
    n = g.params
    cpu, codec_s, err2, sig2 = [], [], 0.0, 0.0
    for call in range(calls):
        xs = [g.grads[(call + r) % len(g.grads)].astype(np.float32) for r in range(ranks)]
        # one rotation for every rank (the codec's seed, the call as its round), each its own noise
        codecs = [get_codec(row.codec, **{**applicable(row.codec, seed=seed, noise_seed=seed + 1000 * call + r),
                                          **row.params}) for r in range(ranks)]
        if codecs[0].needs_agreement:
            shared = max(c.local_stat(x) for c, x in zip(codecs, xs))
            for c in codecs:
                c.agree(shared, call)
        pairs = [socket.socketpair() for _ in range(ranks)]
        keep, results = [], [None] * ranks

        def rank(r):
            c = ffi.new("struct re_codec *")
            state = _c_codec(c, codecs[r], "app", False, ranks)   # the codec's C ring codec, from the table
            ring = ffi.new("struct re_ring *")
            ring.rank, ring.size, ring.chunk, ring.timeout_ms = r, ranks, n, 600_000
            ring.send_fd, ring.recv_fd = pairs[r][0].fileno(), pairs[(r - 1) % ranks][1].fileno()
            ring.tp, ring.codec = lib.re_transport_named(b"app"), c
            x, lost = xs[r].copy(), np.zeros(n, np.float32)
            stats, err = ffi.new("struct re_stats *"), ffi.new("char[256]")
            keep.append((c, state, ring))
            t0 = time.thread_time()
            st = lib.re_allreduce(ring, ffi.cast("float *", ffi.from_buffer(x)), n,
                                  ffi.cast("float *", ffi.from_buffer(lost)), stats, err, len(err))
            results[r] = (st, time.thread_time() - t0, stats.codec_seconds + stats.sum_seconds, x,
                          ffi.string(err).decode(errors="replace"))

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for a, b in pairs:
            a.close()
            b.close()
        for st, c_cpu, c_codec, _, msg in results:
            if st != 0:
                raise RuntimeError(f"{row.label} in the ring: {msg}")
            cpu.append(c_cpu)
            codec_s.append(c_codec)
        exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
        err2 += float(np.sum((results[0][3] - exact) ** 2))
        sig2 += float(np.sum(exact ** 2))

    def spread(v):
        return {"median": float(np.median(v)), "min": float(np.min(v)), "max": float(np.max(v))}
    return {"row": row.id, "ranks": ranks, "values": n, "calls": calls, "call_cpu_seconds": spread(cpu),
            "codec_seconds": spread(codec_s), "nmse": _nmse(err2, sig2)}


def train_configs(rows: list[Row], args) -> tuple[list, dict]:
    """One TrainConfig per distinct run: the uncompressed baseline first, then every selected row
    the training worker can run (it builds each codec with its defaults, which are the paper
    settings of the rows marked ``train``)."""
    from ..train.job import TrainConfig

    common = dict(algo="inc", epochs=args.train_epochs, max_iters=args.train_max_iters, data=args.data,
                  seed=args.seed)
    configs = {"baseline": TrainConfig(compress="none", label="float32 (uncompressed)", **common)}
    for row in rows:
        rid = row.train_as or row.id
        src = next(r for r in ROWS if r.id == rid)
        if src.train is not None and rid not in configs:
            configs[rid] = TrainConfig(label=src.label, **src.train, **common)
    return list(configs.values()), dict(zip(configs, range(len(configs))))


def training(rows: list[Row], args) -> dict:
    """The runs one after another on one testbed. A run that fails (a diverging model is a result
    too) is recorded with its error and the others go on."""
    from ..train.cli import rate_arg
    from ..train.job import TrainingTestbed, interrupt_on_sigterm, preflight, preflight_testbed
    from ..train.report import Progress

    rate = rate_arg(args.train_rate)
    preflight_testbed(args.train_hosts, rate, args.train_mtu, args.train_name)
    configs, index = train_configs(rows, args)
    data = preflight(configs[0])
    progress = Progress(prefix="[bench codecs] ")
    progress.line(f"accuracy: {len(configs)} training runs of {args.train_epochs} epoch(s) on {data.name}, "
                  f"{args.train_hosts} hosts, {rate or 'unshaped'} links, INC ring, codecs inside the collective")
    runs = {}
    info = None
    with interrupt_on_sigterm(), TrainingTestbed(args.train_hosts, rate, args.train_mtu, args.train_name,
                                                 progress.line) as bed:
        for key, i in index.items():
            cfg = configs[i]
            try:
                r = bed.run(cfg, progress.event)
            except UserError as exc:
                progress.line(f"{cfg.name}: FAILED: {exc}")
                runs[key] = {"name": cfg.name, "config": asdict(cfg), "error": str(exc), "final_accuracy": None,
                             "mean_last_epochs": None,
                             "diverged": "diverged" in str(exc)}
                continue
            progress.result(r)
            info = info or {"hosts": r.hosts, "dataset": r.dataset, "iters_per_epoch": r.iters_per_epoch,
                            "iterations": r.iterations}
            last = r.accuracy[-LAST_EPOCHS:] or [r.final_accuracy]
            runs[key] = {"name": r.name, "config": r.config, "accuracy": r.accuracy,
                         "final_accuracy": r.final_accuracy, "mean_last_epochs": sum(last) / len(last), "replicas_identical": r.replicas_identical,
                         "iteration_seconds": r.times.get("iteration"), "codec_seconds": r.times.get("codec"),
                         "app_bytes_sent": r.bytes.get("app_sent"), "error": None}
    info = info or {"hosts": args.train_hosts, "dataset": data.name, "iters_per_epoch": None, "iterations": None}
    return {"epochs": args.train_epochs, "rate": rate, "seed": args.seed, **info, "runs": runs}


def run(args) -> int:
    if args.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {args.rounds}")
    if args.captures < 1:
        raise UserError(f"--captures must be at least 1, got {args.captures}")
    if args.train_epochs < 0:
        raise UserError(f"--train-epochs must be 0 (no training) or more, got {args.train_epochs}")
    if args.train_epochs and args.train_hosts < 2:
        raise UserError(f"--train-hosts must be at least 2 for data-parallel training, got {args.train_hosts}")
    if args.train_max_iters is not None and args.train_max_iters < 1:
        raise UserError(f"--train-max-iters must be at least 1, got {args.train_max_iters}")
    rows = select_rows(args.codecs)
    if args.train_epochs:  # check the testbed settings before minutes of measuring
        from ..train.cli import rate_arg
        from ..train.job import preflight_testbed

        preflight_testbed(args.train_hosts, rate_arg(args.train_rate), args.train_mtu, args.train_name)
    load0 = os.getloadavg()
    g = load_gradients(args.data, args.captures, args.seed)
    qual, blobs = {}, {}
    for row in rows:
        log(f"{row.label}: ratio and NMSE over {len(g.grads)} gradients ...")
        qual[row.id], blobs[row.id] = quality(row, g, args.seed)
    times = speed(rows, g, blobs, args.rounds, args.seed)
    blobs.clear()
    ring = None
    if any(summed_in_ring(r) for r in rows):
        log(f"the summed codec in the ring engine: {WORKERS} ranks on this host, {args.rounds} calls ...")
        ring = summed_ring(rows, g, args.rounds, args.seed)
    train = training(rows, args) if args.train_epochs else None
    report = {
        "gradients": {"dataset": g.dataset, "captures": len(g.grads), "params": g.params, "values": g.values,
                      "bytes": g.nbytes, "tensors": [n for n, _ in g.tensors]},
        "cpu": cpu_name(), "cores": os.cpu_count(), "rounds": args.rounds, "seed": args.seed,
        "load_average": list(load0), "load_average_end": list(os.getloadavg()),
        "block": int(g.bs.block),
        "rows": build_rows(rows, qual, times, train),
        "summed_ring": ring,
        "training": train,
    }
    return emit(report, args.json, print_report)


def add_arguments(p) -> None:
    add_gradient_arguments(p, "for the gradients and the training runs")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    p.add_argument("--codecs", metavar="LIST", help=f"comma-separated codecs ({', '.join(CODEC_NAMES)}) and/or rows "
                   f"({', '.join(ROW_IDS)}); default: every row")
    p.add_argument("--seed", type=int, default=0, help="seed of the captures, the codecs' noise and the training "
                   "runs (default 0)")
    p.add_argument("--train-epochs", type=int, default=0, metavar="E",
                   help="also train the HDC data-parallel for E epochs per codec (and uncompressed) on a testbed and "
                   "report the final test accuracy; needs root, minutes per run (default 0: off)")
    p.add_argument("--train-hosts", type=int, default=WORKERS, help=f"training workers (default {WORKERS})")
    p.add_argument("--train-rate", default="none", help="training link rate, tc units, or none (default none: "
                   "unshaped; accuracy does not depend on it)")
    p.add_argument("--train-mtu", type=int, default=9000, help="training link MTU (default 9000)")
    p.add_argument("--train-max-iters", type=int, metavar="N", help="at most N iterations per epoch (short runs)")
    p.add_argument("--train-name", default="bcodecs", help="testbed name for the training runs (default bcodecs)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
