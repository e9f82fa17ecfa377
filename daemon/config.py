"""nicd configuration: /etc/inceptionn/nicd.toml, then command-line flags on top.

A bad file is refused at start with the line that is wrong.
"""
from __future__ import annotations

import dataclasses
import json
import re
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..limits import error_bound_problem
from ..shim import contract

DEFAULT_PATH = Path("/etc/inceptionn/nicd.toml")
LOG_LEVELS = ("debug", "info", "warning", "error")
CODECS = ("inceptionn",)  # codecs that are stateless per packet (see docs/soft-nic.md)


@dataclass
class NicdConfig:
    interfaces: list[str] = field(default_factory=list)
    # the marks' defaults: shim/inceptionn_contract.h
    tos: int = contract.TOS_TAGGED                  # a sender's mark for the paper's codec (DSCP 10)
    tos_scaled: int = contract.TOS_SCALED           # ... for the per-packet scaled codec (DSCP 9), the shim's default
    tos_compressed: int = contract.TOS_COMPRESSED   # DSCP 11 on the wire: payload compressed
    tos_hello: int = contract.TOS_HELLO             # DSCP 12 on SYN / SYN-ACK: "soft NIC here"
    codec: str = "inceptionn"
    error_bound: int = -10
    queues: int = 1             # queue pairs, one thread each
    queue_base: int = contract.QUEUE_BASE  # egress queues base.., ingress queues base+queues..
    queue_maxlen: int = 4096
    flow_timeout: int = 300     # seconds a flow may idle before its state is dropped
    flow_capacity: int = 65536
    log_level: str = "info"
    socket: str = "/run/inceptionn/nicd.sock"
    accept_only: bool = False   # diagnostic: queue tagged packets both ways, accept unchanged
    gso: bool | str = "auto"    # egress takes GSO super-packets whole (docs/wire-format.md);
                                # "auto": when the daemon may open a raw socket (CAP_NET_RAW)
    metrics_textfile: str = ""  # counters for node_exporter's textfile collector ("": none),
    metrics_interval: int = 15  # rewritten every this many seconds (docs/deploy.md, "Metrics")

    @property
    def egress_queues(self) -> range:
        return range(self.queue_base, self.queue_base + self.queues)

    @property
    def ingress_queues(self) -> range:
        return range(self.queue_base + self.queues, self.queue_base + 2 * self.queues)

    def validate(self, where=lambda key: "", given=frozenset()) -> "NicdConfig":
        """Check every value; ``where(key)`` names the source (file line or flag) in errors,
        ``given`` holds the keys the user set (the rest are defaults)."""
        def bad(key, msg):
            raise UserError(f"{where(key)}{key}: {msg}")

        if not isinstance(self.interfaces, list):
            bad("interfaces", f"must be a list such as [\"eth0\"], got {self.interfaces!r}")
        if not self.interfaces:
            bad("interfaces", "name at least one interface, e.g. interfaces = [\"eth0\"]")
        for name in self.interfaces:
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", name):
                bad("interfaces", f"{name!r} is not an interface name")
        marks = {}
        for key in ("tos", "tos_scaled", "tos_compressed", "tos_hello"):
            v = getattr(self, key)
            if not _is_int(v) or not 0 <= v <= 0xFF or v & 3:
                bad(key, f"must be a ToS byte with the ECN bits clear (0x00-0xfc, multiple of 4), got {v!r}")
            if v == 0:
                bad(key, "0 is the default mark of all traffic; pick a DSCP of its own")
            if v in marks:
                # Blame the one the user wrote: a clash with a default names the user's line.
                mine, other = (marks[v], key) if marks[v] in given and key not in given else (key, marks[v])
                bad(mine, f"same mark as {other} ({v:#04x}); the four marks must differ")
            marks[v] = key
        if self.codec not in CODECS:
            bad("codec", f"{self.codec!r} cannot run per packet in the NIC; choose one of {', '.join(CODECS)}")
        if problem := error_bound_problem(self.error_bound):
            bad("error_bound", problem)
        if not _is_int(self.queues) or not 1 <= self.queues <= 64:
            bad("queues", f"must be 1 to 64, got {self.queues!r}")
        if not _is_int(self.queue_base) or not 0 <= self.queue_base <= 65535 - 2 * 64:
            bad("queue_base", f"must be 0 to {65535 - 128}, got {self.queue_base!r}")
        for key, lo, hi in (("queue_maxlen", 16, 1 << 20), ("flow_timeout", 1, 86400 * 7),
                            ("flow_capacity", 64, 1 << 24)):
            v = getattr(self, key)
            if not _is_int(v) or not lo <= v <= hi:
                bad(key, f"must be an integer from {lo} to {hi}, got {v!r}")
        if self.log_level not in LOG_LEVELS:
            bad("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if not isinstance(self.accept_only, bool):
            bad("accept_only", f"must be true or false, got {self.accept_only!r}")
        if not isinstance(self.gso, bool) and self.gso != "auto":
            bad("gso", f"must be true, false or \"auto\", got {self.gso!r}")
        if not isinstance(self.socket, str) or not self.socket.startswith("/"):
            bad("socket", f"must be an absolute path, got {self.socket!r}")
        if not isinstance(self.metrics_textfile, str) or self.metrics_textfile and not (
                self.metrics_textfile.startswith("/") and self.metrics_textfile.endswith(".prom")):
            # node_exporter reads only *.prom files of its directory
            bad("metrics_textfile", "must be \"\" (none) or an absolute path ending in .prom, "
                f"got {self.metrics_textfile!r}")
        if not _is_int(self.metrics_interval) or not 1 <= self.metrics_interval <= 3600:
            bad("metrics_interval", f"must be an integer from 1 to 3600, got {self.metrics_interval!r}")
        return self


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


FIELDS = {f.name for f in dataclasses.fields(NicdConfig)}


def file_in_use(path: Path | None) -> Path | None:
    """The config file nicd reads: ``path``, or the default file if it exists."""
    if path is None and DEFAULT_PATH.exists():
        return DEFAULT_PATH
    return path


def overrides_from(args) -> dict:
    """The settings given as ``inceptionn nicd`` flags, None where a flag was not given. Every
    key has a flag, --key-with-dashes (interfaces: -i/--interface, repeatable), so that settings
    come from the file or flags alike."""
    values = {key: getattr(args, "interface" if key == "interfaces" else key) for key in sorted(FIELDS)}
    values["accept_only"] = args.accept_only or None  # absent is "not given"
    values["gso"] = True if args.gso else False if args.no_gso else None
    return values


def check_interfaces(cfg: NicdConfig) -> None:
    """Every configured interface exists here (needs no privileges)."""
    for name in cfg.interfaces:
        try:
            socket.if_nametoindex(name)
        except OSError:
            raise UserError(f"interface {name!r} does not exist") from None


def to_toml(cfg: NicdConfig) -> str:
    """The config as a file nicd reads back to the same config; marks in hex, as written."""
    lines = []
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        # JSON writes booleans, integers, strings and lists of strings the way TOML reads them
        lines.append(f"{f.name} = {f'{v:#04x}' if f.name.startswith('tos') else json.dumps(v)}")
    return "\n".join(lines)


def load(path: Path | None, overrides: dict) -> NicdConfig:
    """Read ``path`` (if given, or the default file if it exists), apply ``overrides`` (flags
    that were set), validate. Errors name the file and line, or the flag."""
    values, lines, src = {}, {}, None
    path = file_in_use(path)
    if path is not None:
        src = str(path)
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read config {path}: {exc.strerror}") from None
        try:
            text = raw.decode("utf-8")  # TOML is UTF-8 whatever the locale says
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise UserError(f"{path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                            "TOML files must be UTF-8") from None
        try:
            values = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: {exc}") from None
        for n, line in enumerate(text.splitlines(), 1):
            m = re.match(r"\s*\[*\s*([A-Za-z_][A-Za-z0-9_]*)\s*[=\]]", line)
            if m and m.group(1) not in lines:
                lines[m.group(1)] = n
        for key in values:
            if key not in FIELDS:
                kind = "table" if isinstance(values[key], dict) else "setting"
                raise UserError(f"{path}:{lines.get(key, '?')}: unknown {kind} {key!r}; "
                                f"known: {', '.join(sorted(FIELDS))}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    flagged = {k for k, v in overrides.items() if v is not None}

    def where(key):
        if key in flagged:
            return f"--{key.replace('_', '-')}: "
        if src:
            return f"{src}:{lines[key]}: " if key in lines else f"{src}: "
        return ""

    cfg = NicdConfig(**values)
    return cfg.validate(where, given=frozenset(values))
