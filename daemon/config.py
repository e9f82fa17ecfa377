"""nicd configuration: /etc/inceptionn/nicd.toml, then command-line flags on top.

A bad file is refused at start with the line that is wrong.
"""
from __future__ import annotations

import dataclasses
import json
import re
import socket
import tomllib
from pathlib import Path

from ..errors import UserError
from ..limits import error_bound_problem
from .settings import CODECS, SETTINGS

DEFAULT_PATH = Path("/etc/inceptionn/nicd.toml")


class _Config:
    """NicdConfig's methods; its fields, defaults and ranges come from settings.SETTINGS."""

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
        for key in (s.name for s in SETTINGS if s.kind == "mark"):
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
        for s in SETTINGS:
            v = getattr(self, s.name)
            if s.kind == "int" and s.name != "error_bound" and (  # error_bound: its own words above
                    not _is_int(v) or not s.lo <= v <= s.hi):
                bad(s.name, f"must be an integer from {s.lo} to {s.hi}, got {v!r}")
            if s.kind == "choice" and s.name != "codec" and v not in s.choices:  # codec: above
                bad(s.name, f"must be one of {', '.join(s.choices)}, got {v!r}")
            if s.kind in ("switch", "onoff") and not isinstance(v, bool):
                bad(s.name, f"must be true or false, got {v!r}")
            if s.kind == "gso" and not isinstance(v, bool) and v != "auto":
                bad(s.name, f"must be true, false or \"auto\", got {v!r}")
            if s.kind == "path" and (not isinstance(v, str) or not v.startswith("/")):
                bad(s.name, f"must be an absolute path, got {v!r}")
            if s.kind == "textfile" and (not isinstance(v, str) or v and not (v.startswith("/") and v.endswith(".prom"))):
                # node_exporter reads only *.prom files of its directory
                bad(s.name, f"must be \"\" (none) or an absolute path ending in .prom, got {v!r}")
        return self


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


NicdConfig = dataclasses.make_dataclass(
    "NicdConfig",
    [(s.name, list if s.kind == "list" else object,
      dataclasses.field(default_factory=list) if s.kind == "list" else dataclasses.field(default=s.default))
     for s in SETTINGS],
    bases=(_Config,))
NicdConfig.__module__ = __name__
NicdConfig.__doc__ = "nicd's settings, one field per entry of settings.SETTINGS, in that order."
FIELDS = {s.name for s in SETTINGS}


def file_in_use(path: Path | None) -> Path | None:
    """The config file nicd reads: ``path``, or the default file if it exists."""
    if path is None and DEFAULT_PATH.exists():
        return DEFAULT_PATH
    return path


def overrides_from(args) -> dict:
    """The settings given as ``inceptionn nicd`` flags, None where a flag was not given. Every
    key has a flag, --key-with-dashes (interfaces: -i/--interface, repeatable), so that settings
    come from the file or flags alike."""
    values = {}
    for s in SETTINGS:
        if s.kind == "list":
            values[s.name] = getattr(args, "interface")
        elif s.kind == "switch":
            values[s.name] = getattr(args, s.name) or None  # absent is "not given"
        elif s.kind == "onoff":
            values[s.name] = getattr(args, s.name)
        elif s.kind == "gso":
            values[s.name] = True if args.gso else False if args.no_gso else None
        else:
            values[s.name] = getattr(args, s.name)
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
