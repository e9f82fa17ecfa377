"""The daemon's counters in the formats metric collectors read: OpenMetrics 1.0 text
(``inceptionn stats --format openmetrics``) and the Prometheus text format 0.0.4 (``--format
prometheus``; what node_exporter's textfile collector parses, which the daemon writes itself with
``metrics_textfile``).

Every counter of the stats snapshot is exported, whatever its name: the C data path's list
(daemon/nicd_queue.h, NICD_COUNTERS) is the only list, and its help strings are the HELP texts.
Each queue pair's counters are one series, labelled with its two queue numbers; the daemon's
totals are their sum (``sum without (egress_queue, ingress_queue) (...)``), so no total series
is exported to be counted twice.
"""
from __future__ import annotations

import os
import secrets
import stat

PREFIX = "inceptionn_nicd"
FORMATS = ("openmetrics", "prometheus")
# The content types a /metrics endpoint would send; here for docs and tests.
CONTENT_TYPES = {"openmetrics": "application/openmetrics-text; version=1.0.0; charset=utf-8",
                 "prometheus": "text/plain; version=0.0.4; charset=utf-8"}


def _help_texts() -> dict[str, str]:
    from ._datapath import ffi, lib

    return {ffi.string(lib.nicd_counter_name(i)).decode().lower(): ffi.string(lib.nicd_counter_help(i)).decode()
            for i in range(lib.NICD_NCOUNTERS)}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}" if labels else ""


def exposition(snapshot: dict, fmt: str = "openmetrics") -> str:
    """The text of one scrape from a stats snapshot (what ``inceptionn stats --json`` prints)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}")
    om = fmt == "openmetrics"
    docs = _help_texts()
    out: list[str] = []

    def family(name: str, kind: str, text: str, samples: list[tuple[dict, float]]) -> None:
        # OpenMetrics names a counter family without its _total suffix, the 0.0.4 format
        # with it; an info family is a gauge of value 1 there.
        base = f"{PREFIX}_{name}" if name else PREFIX
        sample_name = base + {"counter": "_total", "info": "_info"}.get(kind, "")
        family_name = base if om else sample_name
        if kind == "info" and not om:
            kind = "gauge"
        out.append(f"# HELP {family_name} {_help(text)}")
        out.append(f"# TYPE {family_name} {kind}")
        out.extend(f"{sample_name}{_labels(labels)} {value:.3f}" if isinstance(value, float)
                   else f"{sample_name}{_labels(labels)} {value}" for labels, value in samples)

    cfg = snapshot.get("config", {})
    family("", "info", "the running soft NIC's settings", [(
        {"codec": cfg.get("codec", ""), "error_bound": cfg.get("error_bound", ""),
         "interfaces": ",".join(cfg.get("interfaces", [])), "queues": cfg.get("queues", ""),
         "gso": str(cfg.get("gso", "")).lower()}, 1)])
    family("uptime_seconds", "gauge", "seconds since the daemon bound its queues",
           [({}, float(snapshot.get("uptime_s", 0.0)))])
    family("flows_active", "gauge", "negotiated flows in the flow table",
           [({}, int(snapshot.get("flows_active", 0)))])
    family("flows_expired", "counter", "flows dropped from the flow table after flow_timeout idle seconds",
           [({}, int(snapshot.get("flows_expired", 0)))])

    queues = snapshot.get("queues") or [{"counters": snapshot["counters"]}]  # a daemon without per-queue counters
    for name in snapshot["counters"]:
        samples = [({k: q[k] for k in ("egress_queue", "ingress_queue") if k in q}, int(q["counters"].get(name, 0)))
                   for q in queues]
        doc = docs.get(name)  # a counter the header does not describe still gets its name
        family(name, "counter", name.replace("_", " ") + (f": {doc}" if doc else ""), samples)
    if om:
        out.append("# EOF")
    return "\n".join(out) + "\n"


def check_textfile(path: str) -> None:
    """Refuse at start a metrics file nicd could not write (no directory, read-only, a directory)."""
    from ..errors import UserError

    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise UserError(f"metrics_textfile {path}: no directory {directory} (node_exporter's textfile collector "
                        "directory; Debian's prometheus-node-exporter has /var/lib/prometheus/node-exporter)")
    if os.path.isdir(path):
        raise UserError(f"metrics_textfile {path}: is a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UserError(f"metrics_textfile {path}: {directory} is not writable by nicd"
                        " (under systemd: ReadWritePaths=)")


class TextfileWriter:
    """The daemon's metrics file. Its directory is opened once, at start, and every write and the
    removal go through that descriptor (openat, renameat, unlinkat): a directory someone later
    renames away or replaces with a link elsewhere is never followed. The daemon removes only
    the file it wrote last (its inode, remembered at each write): whatever else stands at the
    path by then (a directory, a link, someone's file) stays, and the stop goes on."""

    def __init__(self, path: str):
        from ..errors import UserError

        directory, self.name = os.path.split(path)
        self.path = path
        try:
            self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise UserError(f"metrics_textfile {path}: cannot open {directory}: {exc.strerror}") from None
        self.written: tuple[int, int] | None = None  # (st_dev, st_ino) of the file we renamed in

    def write(self, text: str) -> None:
        """Replace the file with ``text`` atomically (a scraper reads the old file or the new one,
        never half of one): a temporary file in the same directory, made readable to the
        collector (node_exporter runs as its own user; the daemon's umask is 0077), then renamed
        over it. The temporary name does not end in .prom, so the textfile collector never reads
        it. Raises OSError (the caller logs and retries)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        while True:
            tmp = f".{self.name}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(tmp, flags, 0o644, dir_fd=self.dir_fd)
                break
            except FileExistsError:
                continue
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fchmod(f.fileno(), 0o644)
                st = os.fstat(f.fileno())
            os.replace(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.dir_fd)
            except FileNotFoundError:
                pass
            raise
        self.written = (st.st_dev, st.st_ino)

    def remove(self) -> str | None:
        """On stop: the counters of a daemon that no longer runs are not served as if current.
        Removes the file if it is still the one we wrote; never raises. Returns why something
        was left in place, or None."""
        try:
            try:
                st = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != self.written:
                return f"{self.path} is not the file nicd wrote ({_kind(st.st_mode)}); left in place"
            os.unlink(self.name, dir_fd=self.dir_fd)
            return None
        except OSError as exc:
            return f"cannot remove {self.path}: {exc.strerror}"
        finally:
            self.close()

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


# What every file the daemon writes starts with (the first family of exposition(), prometheus).
SIGNATURE = f"# HELP {PREFIX}_info ".encode()


def remove_stale_textfile(path: str) -> str | None:
    """``--cleanup`` after a crash: remove what a dead daemon left at ``path``, without its
    inode to go by: only a regular file (never through a link), ours (this user's), that starts
    as the daemon writes it. Anything else stays. Never raises; returns why something was left in
    place, or None. (The directory is node_exporter's, writable by root only: nobody else can
    swap the file between the check and the unlink.)"""
    directory, name = os.path.split(path)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # no directory there: nothing of ours either
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a metrics file ({_kind(st.st_mode)}); left in place"
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            same = os.fstat(fd)
            head = os.read(fd, len(SIGNATURE))
        finally:
            os.close(fd)
        if (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino) or same.st_uid != os.geteuid() \
                or head != SIGNATURE:
            return f"{path} is not a metrics file nicd wrote; left in place"
        os.unlink(name, dir_fd=dir_fd)
        return None
    except OSError as exc:
        return f"cannot remove {path}: {exc.strerror}"
    finally:
        os.close(dir_fd)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "another file")):
        if test(mode):
            return what
    return "a device"
