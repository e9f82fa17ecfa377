"""The training launcher: a testbed of N hosts with shaped links, the soft NIC on every host when
compression is on, one worker process per host (``train/worker.py``), progress streamed while
they run, results collected, and everything torn down afterwards, also on Ctrl-C or an error.

    from inceptionn.train.job import TrainConfig, TrainingTestbed
    with TrainingTestbed(hosts=4, rate="100mbit", mtu=9000) as bed:
        result = bed.run(TrainConfig(algo="inc", compress="nic", epochs=2))

One testbed serves any number of runs (the demo and ``bench train`` run all their configurations
on the same links); the daemons live for one run each, so every run's counters are its own and
uncompressed runs go through hosts without any queue rule at all.

Rendezvous: the workers meet through a ``FileStore`` in a fresh directory (testbed hosts are
network namespaces of one machine and share its filesystem), so training needs no torch.

Bytes on the wire are read three ways: the bytes each worker's group put into its sockets
(application level), each host's ``eth0`` transmit counter (what the shaped link carried, headers
included) and, when the soft NIC runs, its egress counters (tagged payload before and after
compression).
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..errors import UserError
from ..limits import DEFAULT_ERROR_BOUND, error_bound_problem, headroom_problem
from ..procs import cpu_seconds, stop
from .worker import Diverged

ALGOS = ("wa", "inc", "ddp")   # ddp: DistributedDataParallel's exchange over gloo, torch's hooks
GLOO_PORT = 29520             # rank 0's rendezvous port for ddp runs, plus the run number
STALL_SECONDS = 300.0   # no word from any worker for this long: the run is declared stuck
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "PYTHONUNBUFFERED": "1"}


@dataclass
class TrainConfig:
    """One training run. ``compress``: ``none``, ``nic`` (tagged sockets, the soft NICs compress
    with the INCEPTIONN codec at ``error_bound``) or a codec name (compressed in the application);
    with ``algo="ddp"``: ``none`` or a DDP hook, ``fp16`` / ``bf16`` / ``powersgd-r1`` /
    ``powersgd-r4`` (train/torch_hooks.py).
    ``warmup``: the learning rate rises linearly to ``lr`` over the first iterations."""

    algo: str = "inc"
    compress: str = "none"
    error_bound: int = DEFAULT_ERROR_BOUND
    scaling: bool | None = None        # None: the collective's default (on where it helps)
    error_feedback: bool | None = None
    headroom: int = 0                  # bits of precision the scaled wire gives up for ratio (limits.headroom_problem)
    epochs: int = 1
    max_iters: int | None = None      # per epoch
    data: str | None = None
    seed: int = 0
    lr: float = 0.1
    warmup: int = 0                   # iterations
    decay_at: int | None = None       # from this epoch on (counted from 1), lr x 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-5
    batch: int = 25
    label: str | None = None

    @property
    def compressed(self) -> bool:
        return self.compress != "none"

    @property
    def name(self) -> str:
        """WA, WA+C, INC, INC+C as in the paper; app-level codecs and switched-off helpers say so."""
        if self.label:
            return self.label
        base = self.algo.upper()
        if self.algo == "ddp":
            return f"DDP {self.compress} hook" if self.compressed else "DDP"
        if not self.compressed:
            return base
        name = {"nic": f"{base}+C", "nic-scaled": f"{base}+C scaled"}.get(self.compress, f"{base}+{self.compress}")
        off = [w for w, on in (("scaling", self.scaling), ("EF", self.error_feedback)) if on is False]
        name += f" h={self.headroom}" if self.headroom else ""
        name += " +EF" if self.error_feedback else ""   # asked for: the codec's traits may not
        return name + (f" (no {', no '.join(off)})" if off else "")

    def check(self) -> None:
        if self.algo not in ALGOS:
            raise UserError(f"unknown algorithm {self.algo!r}; choose wa, inc or ddp")
        if problem := headroom_problem(self.headroom):
            raise UserError(f"--headroom {problem}")
        if self.algo == "ddp":
            from .torch_hooks import HOOKS

            if self.compress not in HOOKS:
                raise UserError(f"ddp runs DDP's hooks: --compress none, {', '.join(h for h in HOOKS if h != 'none')}; "
                                f"got {self.compress!r}")
            try:
                import torch  # noqa: F401
            except ImportError:
                raise UserError("ddp needs PyTorch: pip install 'inceptionn[torch]'") from None
        elif self.compress not in ("none", "nic", "nic-scaled"):
            from ..codecs import available_codecs

            if self.compress not in available_codecs():
                raise UserError(f"unknown compression {self.compress!r}; choose none, nic or a codec: "
                                f"{', '.join(available_codecs())}")
        if problem := error_bound_problem(self.error_bound):
            raise UserError(f"--error-bound {problem}")
        if self.epochs < 1:
            raise UserError(f"--epochs must be at least 1, got {self.epochs}")
        if self.max_iters is not None and self.max_iters < 1:
            raise UserError(f"--max-iters must be at least 1, got {self.max_iters}")
        if self.batch < 1:
            raise UserError(f"--batch must be at least 1, got {self.batch}")
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if self.warmup < 0:
            raise UserError(f"--warmup-iters must be 0 or more, got {self.warmup}")
        if self.decay_at is not None and not 1 <= self.decay_at <= self.epochs:
            raise UserError(f"--decay-at must be an epoch from 1 to --epochs ({self.epochs}), got {self.decay_at}")


@dataclass
class RunResult:
    config: dict
    name: str
    hosts: int
    rate: str | None
    mtu: int
    dataset: str
    iters_per_epoch: int
    iterations: int
    accuracy: list            # test accuracy after each epoch (rank 0)
    final_accuracy: float     # rank 0's; every replica's is in replicas
    replicas_identical: bool  # same parameter checksum and accuracy on every rank
    replicas: list            # per rank: final accuracy, checksum, cpu seconds
    times: dict               # mean seconds per iteration: compute, communicate, sum, codec, iteration
    train_seconds: float      # wall time of the training loop (evaluation excluded), rank 0
    wall_seconds: float       # the whole run: start of the workers to the last result
    bytes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def check_root() -> None:
    if os.geteuid() != 0:
        raise UserError("training runs on a network-namespace testbed: run it as root")


@contextmanager
def no_interrupts():
    """Hold off SIGINT/SIGTERM while tearing down, so a second Ctrl-C cannot leave half a testbed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def interrupt_on_sigterm():
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt): the same orderly teardown.

    Only in this process: pyroute2 forks helpers (to create namespaces, to open netlink
    sockets in them) and stops them with SIGTERM; a forked copy of this interpreter must die
    quietly, not run our teardown. The same guard applies to SIGINT."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            os._exit(128 + signum)
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class TrainingTestbed:
    """A testbed for training runs; ``run(cfg)`` trains once on it. Torn down on exit."""

    def __init__(self, hosts: int = 4, rate: str | None = "100mbit", mtu: int = 9000, name: str = "train",
                 progress: Callable[[str], None] | None = None):
        from ..kernel_tc.testbed import Testbed

        check_root()
        if hosts < 2:
            raise UserError(f"--hosts must be at least 2 for data-parallel training, got {hosts}")
        self.rate = rate
        self.mtu = mtu
        self.progress = progress or (lambda msg: None)
        self.testbed = Testbed(hosts=hosts, rate=rate, mtu=mtu, name=name, progress=None)
        self.tmp: str | None = None
        self._runs = 0
        self._procs: list[subprocess.Popen] = []

    @property
    def hosts(self):
        return self.testbed.hosts

    def __enter__(self) -> "TrainingTestbed":
        self.progress(f"testbed {self.testbed.name}: {self.testbed.n_hosts} hosts, "
                      f"{self.rate or 'unshaped'} links, MTU {self.mtu} ...")
        self.testbed.up()
        self.tmp = tempfile.mkdtemp(prefix="inceptionn-train-")
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with no_interrupts():
            for p in self._procs:
                stop(p, 3.0)
            self._procs = []
            self.progress(f"testbed {self.testbed.name}: tearing down")
            self.testbed.down()
            if self.tmp:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.tmp = None

    # --- one run ---------------------------------------------------------------------------------

    def run(self, cfg: TrainConfig, on_event: Callable[[TrainConfig, dict], None] | None = None,
            stall_seconds: float = STALL_SECONDS) -> RunResult:
        from ..daemon.launch import nicd, read_stats

        cfg.check()
        on_event = on_event or (lambda c, e: None)
        self._runs += 1
        rundir = os.path.join(self.tmp, f"run{self._runs}")
        os.makedirs(os.path.join(rundir, "store"))
        hosts = self.testbed.hosts
        started = time.monotonic()
        with ExitStack() as stack:
            daemons = []
            if cfg.compress in ("nic", "nic-scaled"):
                on_event(cfg, {"event": "status", "message": f"starting the soft NIC on {len(hosts)} hosts"})
                for h in hosts:
                    sock = os.path.join(rundir, f"{h.name}.sock")
                    daemons.append((h, sock, stack.enter_context(
                        nicd(h, sock, cfg.error_bound, new_session=True))))
            nic_cpu0 = [cpu_seconds(p.pid) for _, _, p in daemons]
            if_before = [_link_counters(h) for h in hosts]
            procs = [self._start_worker(cfg, rank, h, rundir) for rank, h in enumerate(hosts)]
            stack.callback(self._stop_workers, procs)
            done = self._collect(cfg, procs, on_event, stall_seconds)
            wall = time.monotonic() - started
            if_after = [_link_counters(h) for h in hosts]
            nic = [read_stats(sock) for _, sock, _ in daemons]
            nic_cpu = [cpu_seconds(p.pid) - c for (_, _, p), c in zip(daemons, nic_cpu0)]
        return self._result(cfg, done, if_before, if_after, nic, nic_cpu, wall)

    def _start_worker(self, cfg: TrainConfig, rank: int, host, rundir: str) -> subprocess.Popen:
        wcfg = asdict(cfg)
        wcfg.update(rank=rank, world=len(self.testbed.hosts), bind_addr=host.ip,
                    store=os.path.join(rundir, "store"), master=f"{self.testbed.hosts[0].ip}:{GLOO_PORT + self._runs}")
        env = dict(os.environ, **WORKER_ENV, INCEPTIONN_BIND_ADDR=host.ip, GLOO_SOCKET_IFNAME=host.ifname)
        p = host.popen([sys.executable, "-m", "inceptionn.train.worker", "--config", json.dumps(wcfg)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       start_new_session=True, env=env)
        p.rank = rank
        p.stderr_tail = deque(maxlen=40)
        self._procs.append(p)
        return p

    def _stop_workers(self, procs) -> None:
        for p in procs:
            stop(p, 3.0)
            if p in self._procs:
                self._procs.remove(p)

    def _collect(self, cfg: TrainConfig, procs, on_event, stall_seconds: float) -> dict[int, dict]:
        """Stream every worker's JSON lines until all said ``done``; raise on the first error."""
        events: queue.Queue = queue.Queue()

        def read_out(p):
            for raw in iter(p.stdout.readline, b""):
                line = raw.decode(errors="replace").strip()
                try:
                    ev = json.loads(line)
                except ValueError:
                    ev = {"event": "text", "text": line}
                events.put((p, ev))
            events.put((p, {"event": "eof"}))

        def read_err(p):
            for raw in iter(p.stderr.readline, b""):
                p.stderr_tail.append(raw.decode(errors="replace").rstrip())

        for p in procs:
            threading.Thread(target=read_out, args=(p,), daemon=True).start()
            threading.Thread(target=read_err, args=(p,), daemon=True).start()
        done: dict[int, dict] = {}
        open_streams = len(procs)
        last = time.monotonic()
        while open_streams:
            try:
                p, ev = events.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - last > stall_seconds:
                    raise UserError(f"{cfg.name}: no progress from any worker for {stall_seconds:.0f} s; "
                                    "stopped the run")
                continue
            last = time.monotonic()
            kind = ev.get("event")
            if kind == "eof":
                open_streams -= 1
                if p.rank not in done:
                    rc = p.wait()
                    tail = " | ".join(list(p.stderr_tail)[-3:]) or "no message"
                    raise UserError(f"{cfg.name}: worker {p.rank} on host h{p.rank + 1} exited "
                                    f"(status {rc}) before finishing: {tail}")
            elif kind == "error":
                msg = ev.get("message", "unknown error")
                if ev.get("internal"):
                    tail = [ln for ln in p.stderr_tail if ln.strip()]
                    msg += f" ({tail[-2].strip()})" if len(tail) >= 2 else ""
                if ev.get("diverged"):
                    raise Diverged(f"{cfg.name}: {msg}", cfg)
                raise UserError(f"{cfg.name}: {msg}")
            elif kind == "done":
                done[p.rank] = ev
                on_event(cfg, ev)
            elif kind != "text":
                on_event(cfg, ev)
        return done

    def _result(self, cfg, done, if_before, if_after, nic, nic_cpu, wall) -> RunResult:
        world = len(done)
        ranks = [done[r] for r in sorted(done)]
        r0 = ranks[0]
        parts = ("compute", "communicate", "sum", "codec", "iteration")
        times = {k: sum(float(d["times"].get(k, 0.0)) for d in ranks) / world for k in parts}
        checks = {d["checksum"] for d in ranks}
        accs = {d["final_accuracy"] for d in ranks}
        iterations = int(r0["iterations"])
        wire = [{k: a[k] - b[k] for k in a} for a, b in zip(if_after, if_before)]
        nbytes = {
            "wire_tx": sum(w["tx_bytes"] for w in wire),          # every host's eth0, headers included
            "wire_tx_packets": sum(w["tx_packets"] for w in wire),
            "wire_tx_per_host": [w["tx_bytes"] for w in wire],
            "app_sent": sum(_app_sent(d.get("group_stats") or {}) for d in ranks),
        }
        nbytes["wire_per_iteration"] = nbytes["wire_tx"] / max(1, iterations)
        if nic:
            tot = {k: sum(int(c.get(k, 0)) for c in nic)
                   for k in ("egress_orig_bytes", "egress_wire_bytes", "egress_raw_bytes", "egress_packets",
                             "egress_compressed", "ingress_restored")}
            tot["ratio"] = tot["egress_orig_bytes"] / max(1, tot["egress_wire_bytes"])
            tot["drops"] = {k: sum(int(c.get(k, 0)) for c in nic) for k in nic[0]
                            if k.startswith("drop_") and any(c.get(k) for c in nic)}
            tot["cpu_seconds"] = nic_cpu
            tiers = [sum(int(c.get(f"tier{t}", 0)) for c in nic) for t in (0, 8, 16, 32)]
            tot["tiers"] = [t / max(1, sum(tiers)) for t in tiers]
            nbytes["nicd"] = tot
        return RunResult(
            config=asdict(cfg), name=cfg.name, hosts=world, rate=self.rate, mtu=self.mtu,
            dataset=r0.get("dataset", ""), iters_per_epoch=int(r0.get("iters_per_epoch", 0)),
            iterations=iterations, accuracy=list(r0.get("accuracy") or []),
            final_accuracy=float(r0["final_accuracy"]),
            replicas_identical=len(checks) == 1 and len(accs) == 1,
            replicas=[{"rank": d["rank"], "final_accuracy": d["final_accuracy"], "checksum": d["checksum"],
                       "cpu_seconds": d.get("cpu_seconds")} for d in ranks],
            times=times, train_seconds=float(r0.get("train_seconds", 0.0)), wall_seconds=wall, bytes=nbytes)


def _app_sent(stats: dict) -> int:
    """Bytes a group wrote into its sockets, whatever shape its stats take."""
    sent = stats.get("bytes_sent", stats.get("sent"))
    if isinstance(sent, dict):
        return int(sum(v for v in sent.values() if isinstance(v, (int, float))))
    if isinstance(sent, (int, float)):
        return int(sent)
    return 0


def _link_counters(host) -> dict:
    """eth0 counters of a testbed host (what its shaped link carried), from the kernel."""
    from ..kernel_tc import netns as ns

    with ns.ipr(host.netns) as ipr:
        link = ipr.get_links(ipr.link_lookup(ifname=host.ifname)[0])[0]
        s = link.get_attr("IFLA_STATS64") or link.get_attr("IFLA_STATS")
    return {k: int(s[k]) for k in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")}


def run_configs(configs: list[TrainConfig], *, hosts: int, rate: str | None, mtu: int, name: str,
                on_event=None, progress=None, on_result=None, on_diverged=None) -> list[RunResult]:
    """Every configuration in turn on one testbed (brought up and torn down here). A run whose
    model diverges raises ``Diverged``, unless ``on_diverged(error)`` is given: then it is
    reported there and the next run starts."""
    results = []
    with interrupt_on_sigterm(), TrainingTestbed(hosts, rate, mtu, name, progress) as bed:
        for cfg in configs:
            try:
                results.append(bed.run(cfg, on_event))
            except Diverged as exc:
                if on_diverged is None:
                    raise
                on_diverged(exc)
                continue
            if on_result:
                on_result(results[-1])
    return results


def preflight_testbed(hosts: int, rate: str | None, mtu: int, name: str) -> None:
    """Check the testbed settings before anything is printed or built."""
    from ..kernel_tc.testbed import check_name
    from ..kernel_tc.units import parse_rate

    check_root()
    if hosts < 2:
        raise UserError(f"--hosts must be at least 2 for data-parallel training, got {hosts}")
    if hosts > 64:
        raise UserError(f"--hosts must be at most 64, got {hosts}")
    if rate is not None and parse_rate(rate) <= 0:
        raise UserError("bad rate: must be greater than zero")
    if not 576 <= mtu <= 65535:
        raise UserError(f"bad MTU {mtu}: must lie between 576 and 65535")
    check_name(name)


def preflight(cfg: TrainConfig):
    """Check a configuration and its data before any testbed exists: a bad path or flag is one
    line, not a half-built testbed. Returns the data set (for sizes and names)."""
    from .data import load_dataset

    cfg.check()
    return load_dataset(cfg.data, seed=cfg.seed)


__all__ = ["Diverged", "TrainConfig", "TrainingTestbed", "RunResult", "run_configs", "preflight",
           "preflight_testbed"]
