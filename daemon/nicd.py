"""``inceptionn nicd``: the soft NIC daemon (control plane; the data path is C)."""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import stat
import sys
import threading
import time
import tomllib
from pathlib import Path

from ..errors import UserError
from . import config, rules
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


def _configured_socket(args) -> str:
    """The stats socket a cleanup looks at: --socket, else the config file's, else the default.
    Read leniently: a broken config file must not keep ExecStopPost from cleaning up."""
    if args.socket:
        return args.socket
    path = Path(args.config) if args.config else config.DEFAULT_PATH
    try:
        sock = tomllib.loads(path.read_bytes().decode()).get("socket")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        sock = None
    return sock if isinstance(sock, str) and sock.startswith("/") else config.NicdConfig().socket


def _remove_stale_socket(path: str) -> None:
    """Unlink the socket unless a daemon still serves it (or it is no socket at all)."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return
    except OSError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return  # someone answers: a running instance's socket
    except OSError:
        pass
    finally:
        probe.close()
    try:
        Path(path).unlink()
    except FileNotFoundError:
        pass


def cleanup(args) -> int:
    """Remove the queue rules of every instance that no longer runs (a stop or a crash) and a
    stale socket: systemd's ExecStopPost. The fail-closed drops stay."""
    rules.check_access()
    n = rules.remove_dead()
    _remove_stale_socket(_configured_socket(args))
    print(f"nicd cleanup: removed {n} rule(s); the drop of compressed packets stays "
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
    _remove_stale_socket(_configured_socket(args))
    print(f"nicd uninstall: removed {n} rule(s)", file=sys.stderr)
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


def run(args) -> int:
    if args.cleanup:
        return cleanup(args)
    if args.uninstall:
        return uninstall(args)
    cfg = config.load(Path(args.config) if args.config else None, overrides_from(args))
    setup_logging(cfg.log_level)
    if os.geteuid() != 0:
        raise UserError("nicd needs root or CAP_NET_ADMIN to bind netfilter queues and install rules")
    config.check_interfaces(cfg)
    loaded = dataclasses.replace(cfg)  # as written: a reload compares with this (gso may say "auto")
    cfg.gso = resolve_gso(cfg.gso)

    stop = threading.Event()
    reload_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
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
        log.info("running%s%s: %s, codec %s 2^%d, queues egress %s ingress %s, stats at %s",
                 " ACCEPT-ONLY (diagnostic, nothing is compressed)" if cfg.accept_only else "",
                 " with GSO super-packets" if cfg.gso else "",
                 ", ".join(cfg.interfaces), cfg.codec, cfg.error_bound,
                 _span(cfg.egress_queues), _span(cfg.ingress_queues), cfg.socket)
        print(READY_LINE, file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            expired, flows["active"] = dp.expire_flows()
            flows["expired"] += expired
            if (err := dp.failed()) is not None:
                log.error("data path stopped: %s", err)
                return 1
            if reload_requested.is_set():
                reload_requested.clear()
                _reload(args, cfg, loaded, dp)
        log.info("stopping")
        return 0
    finally:
        n = rules.remove_instance(cfg.queue_base)
        log.info("removed %d rule(s); the drop of compressed packets stays", n)
        if server:
            server.close()
        dp.stop()


def _reload(args, cfg, loaded, dp) -> None:
    try:
        new = config.load(Path(args.config) if args.config else None, overrides_from(args))
    except UserError as exc:
        log.error("reload refused, keeping the running config: %s", exc)
        return
    cfg.error_bound, cfg.log_level = new.error_bound, new.log_level
    dp.set_error_bound(new.error_bound)
    logging.getLogger("inceptionn").setLevel(new.log_level.upper())
    changed = [s.name for s in SETTINGS if not s.reload and getattr(new, s.name) != getattr(loaded, s.name)]
    log.info("reloaded: error bound 2^%d, log level %s%s", new.error_bound, new.log_level,
             f"; restart to apply {', '.join(changed)}" if changed else "")


def _span(r: range) -> str:
    return str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}"
