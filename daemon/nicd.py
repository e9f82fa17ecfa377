"""``inceptionn nicd``: the soft NIC daemon (control plane; the data path is C)."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
import tomllib
from pathlib import Path

from ..errors import UserError
from . import config, metrics, rules, stats
from .datapath import Datapath
from .settings import SETTINGS
from .stats import StatsServer

log = logging.getLogger("inceptionn.nicd")
READY_LINE = "nicd: ready"


def wait_ready(proc, timeout: float = 15.0) -> list[str]:
    """Read a started daemon's stderr until it says it is ready; returns the lines. Raises
    UserError with what it said if it exits or stays silent past ``timeout``.

    Reads the raw pipe (not the file object's buffer), so select() never waits for a line
    that has already arrived."""
    import select

    fd, buf, deadline = proc.stderr.fileno(), b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        buf += chunk
        if READY_LINE.encode() in buf:
            return buf.decode(errors="replace").splitlines()
        if not chunk:
            raise UserError("nicd exited before it was ready: " + " | ".join(buf.decode(errors="replace").splitlines()))
    raise UserError(f"nicd not ready after {timeout:.0f} s: " + " | ".join(buf.decode(errors="replace").splitlines()))


def setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, format="nicd %(levelname)s: %(message)s")
    logging.getLogger("inceptionn").setLevel(level.upper())


overrides_from = config.overrides_from  # every config key has a flag


def _configured(args, key: str) -> str:
    """A path setting a cleanup looks at (socket, metrics_textfile): its flag, else the config
    file's, else the default. Read leniently: a broken config file must not keep ExecStopPost
    from cleaning up."""
    if getattr(args, key, None):
        return getattr(args, key)
    path = Path(args.config) if args.config else config.DEFAULT_PATH
    try:
        value = tomllib.loads(path.read_bytes().decode()).get(key)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        value = None
    return value if isinstance(value, str) and value.startswith("/") else getattr(config.NicdConfig(), key)


def _remove_stale_files(args) -> None:
    """A crashed daemon's socket, and its metrics file (counters nobody updates any more must
    not be served as current)."""
    stats.remove_stale(_configured(args, "socket"))
    textfile = _configured(args, "metrics_textfile")
    if textfile.endswith(".prom") and not rules.running_instances():  # else a running daemon's
        if (left := metrics.remove_stale_textfile(textfile)) is not None:
            print(f"nicd: metrics: {left}", file=sys.stderr)


def cleanup(args) -> int:
    """Remove the queue rules of every instance that no longer runs (a stop or a crash) and a
    stale socket: systemd's ExecStopPost. The fail-closed drops stay."""
    rules.check_access()
    n = rules.remove_dead()
    _remove_stale_files(args)
    print(f"nicd cleanup: removed {rules.describe(n)}; the drop of compressed packets stays "
          "(`inceptionn nicd --uninstall` removes it)", file=sys.stderr)
    return 0


def uninstall(args) -> int:
    """Remove every nicd rule, the fail-closed drops included, and a stale socket."""
    rules.check_access()
    running = rules.running_instances()
    if running:
        raise UserError(f"nicd is running (queue base {', '.join(map(str, running))}); stop it before "
                        "--uninstall (systemctl stop inceptionn-nicd)")
    n = rules.remove_everything()
    _remove_stale_files(args)
    print(f"nicd uninstall: removed {rules.describe(n)}", file=sys.stderr)
    return 0


def resolve_gso(gso) -> bool:
    """gso = "auto": on when this process may open the raw socket its packets leave by
    (CAP_NET_RAW, and AF_INET not filtered away), else per packet, said in one warning line."""
    if gso != "auto":
        return gso
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW).close()
        return True
    except OSError as exc:
        log.warning("gso: cannot open a raw IP socket (%s; needs CAP_NET_RAW), so no super-packets: "
                    "tagged packets are compressed one by one (set gso = false to say so)", exc.strerror)
        return False


CAP_NET_ADMIN = 12  # linux/capability.h


def _capability_sets() -> dict[str, int]:
    """This process's capability sets ("CapEff", "CapAmb", ...) from /proc/self/status."""
    sets = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.startswith("Cap"):
            sets[key] = int(value, 16)
    return sets


def check_privileges() -> None:
    """nicd needs CAP_NET_ADMIN, not uid 0: it binds the queues itself, and the iptables it
    runs inherit the capability only as an ambient one (a non-root process keeps no other
    capability across execve). CAP_NET_RAW is the gso fast path's (resolve_gso)."""
    caps = _capability_sets()
    if not caps.get("CapEff", 0) >> CAP_NET_ADMIN & 1:
        raise UserError("nicd needs CAP_NET_ADMIN (root, or e.g. systemd's AmbientCapabilities=CAP_NET_ADMIN "
                        "CAP_NET_RAW) to bind netfilter queues and install rules")
    if os.geteuid() != 0 and not caps.get("CapAmb", 0) >> CAP_NET_ADMIN & 1:
        raise UserError("nicd holds CAP_NET_ADMIN but not as an ambient capability, so the iptables it runs "
                        "would not have it: start it with the capability ambient (setpriv --inh-caps "
                        "+net_admin,+net_raw --ambient-caps +net_admin,+net_raw, or AmbientCapabilities=)")


def run(args) -> int:
    if args.cleanup:
        return cleanup(args)
    if args.uninstall:
        return uninstall(args)
    cfg = config.load(Path(args.config) if args.config else None, overrides_from(args))
    setup_logging(cfg.log_level)
    check_privileges()
    config.check_interfaces(cfg)
    stats.check_path(cfg.socket)  # before any rule: a wrong path costs nothing to refuse
    if cfg.metrics_textfile:
        metrics.check_textfile(cfg.metrics_textfile)
    writer = metrics.TextfileWriter(cfg.metrics_textfile) if cfg.metrics_textfile else None
    loaded = dataclasses.replace(cfg)  # as written: a reload compares with this (gso may say "auto")
    cfg.gso = resolve_gso(cfg.gso)

    stop = threading.Event()
    reload_requested = threading.Event()

    warned = []

    def on_stop(signum, _frame):
        # A second Ctrl-C or a `timeout` repeating its signal must not cut the removal of the
        # rules short: the stop goes on to its end and says how it went. Said once: Python runs
        # this handler in the main thread however the signals are masked there (another thread
        # takes them), and a handler that logs on every signal of a stream nests into itself
        # until the recursion limit (seen with a signal every 2 ms under load).
        if stop.is_set():
            if not warned:
                warned.append(signum)
                log.warning("%s while stopping: still removing the rules (further signals are ignored)",
                            signal.Signals(signum).name)
            return
        stop.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, lambda *_: reload_requested.set())

    dp = Datapath(cfg)
    dp.start()  # bind the queues before any rule can send packets to them
    flows = {"expired": 0, "active": 0}
    server = None
    try:
        rules.install(cfg)

        def snapshot():
            return {"pid": os.getpid(), "uptime_s": time.monotonic() - dp.started,
                    "config": {s.name: getattr(cfg, s.name) for s in SETTINGS if s.stats},
                    "flows_active": flows["active"], "flows_expired": flows["expired"],
                    "counters": dp.snapshot(), "queues": dp.snapshot_queues()}

        server = StatsServer(cfg.socket, snapshot)
        textfile = Textfile(writer, cfg.metrics_interval, snapshot) if writer else None
        log.info("running%s%s: %s, codec %s 2^%d, queues egress %s ingress %s, stats at %s%s",
                 " ACCEPT-ONLY (diagnostic, nothing is compressed)" if cfg.accept_only else "",
                 " with GSO super-packets" if cfg.gso else "",
                 ", ".join(cfg.interfaces), cfg.codec, cfg.error_bound,
                 _span(cfg.egress_queues), _span(cfg.ingress_queues), cfg.socket,
                 f", metrics in {cfg.metrics_textfile} every {cfg.metrics_interval} s" if textfile else "")
        print(READY_LINE, file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            expired, flows["active"] = dp.expire_flows()
            flows["expired"] += expired
            if textfile:
                textfile.tick()
            if (err := dp.failed()) is not None:
                log.error("data path stopped: %s", err)
                rc = 1
                break
            if reload_requested.is_set():
                reload_requested.clear()
                _reload(args, cfg, loaded, dp)
        else:
            log.info("stopping")
            rc = 0
    finally:
        clean = _teardown(cfg, server, dp, writer)
    return rc if clean else 1


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _teardown(cfg, server, dp, writer) -> bool:
    """Remove this instance's rules (verified gone), the metrics file and the socket, stop the
    queue threads. False if a rule could not be removed: the exit status then says so."""
    # From here on this thread takes no stop signal (they stay pending until the process is
    # gone), and the iptables it starts inherit the mask: a signal sent to the process group
    # in the moment between fork and the child's setsid() cannot kill a listing or a delete.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    clean = True
    try:
        n = rules.remove_instance(cfg.queue_base)
        log.info("removed %s; the drop of compressed packets stays", rules.describe(n))
    except UserError as exc:
        log.error("stop: %s; `inceptionn nicd --cleanup` removes them once this daemon has exited", exc)
        clean = False
    if writer and (left := writer.remove()) is not None:
        log.warning("metrics: %s", left)
    if server:
        server.close()
    dp.stop()
    return clean


class Textfile:
    """The counters for node_exporter's textfile collector, written every ``interval`` seconds
    (and at once), atomically; a failed write is logged once per streak and retried."""

    def __init__(self, writer: metrics.TextfileWriter, interval: int, snapshot):
        self.writer, self.path, self.interval, self.snapshot = writer, writer.path, interval, snapshot
        self.next, self.failing = 0.0, False
        self.tick()

    def tick(self) -> None:
        if time.monotonic() < self.next:
            return
        self.next = time.monotonic() + self.interval
        try:
            self.writer.write(metrics.exposition(self.snapshot(), "prometheus"))
        except OSError as exc:
            if not self.failing:
                log.warning("metrics: cannot write %s (%s), retrying every %d s", self.path, exc.strerror,
                            self.interval)
            self.failing = True
            return
        if self.failing:
            log.info("metrics: writing %s again", self.path)
        self.failing = False


def _reload(args, cfg, loaded, dp) -> None:
    try:
        new = config.load(Path(args.config) if args.config else None, overrides_from(args))
    except UserError as exc:
        log.error("reload refused, keeping the running config: %s", exc)
        return
    for s in SETTINGS:
        if s.reload:
            setattr(cfg, s.name, getattr(new, s.name))
    dp.reload(cfg)
    logging.getLogger("inceptionn").setLevel(cfg.log_level.upper())
    changed = [s.name for s in SETTINGS if not s.reload and getattr(new, s.name) != getattr(loaded, s.name)]
    log.info("reloaded: error bound 2^%d, log level %s%s", new.error_bound, new.log_level,
             f"; restart to apply {', '.join(changed)}" if changed else "")


def _span(r: range) -> str:
    return str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}"
