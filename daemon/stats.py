"""Live counters over a unix socket: the daemon serves one JSON document per connection,
``inceptionn stats`` reads and prints it."""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import threading
from pathlib import Path

from ..errors import UserError

log = logging.getLogger("inceptionn.nicd")
SOCKET_MODE = 0o660  # the daemon's user and group
# accept() errors that pass (out of descriptors or memory, a client gone before we took it):
# wait a little and serve on.
TEMPORARY_ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                           errno.EINTR, errno.EAGAIN}
MAX_BACKOFF_S = 1.0


def check_path(path: str) -> None:
    """Refuse a socket path that holds anything but a stale socket: a file, a directory, a link
    (never deleted: `socket` may be mistyped to name one), or a socket another process serves
    (another nicd with other queues: taking its path would orphan its socket)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserError(f"socket {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a symbolic link" if stat.S_ISLNK(st.st_mode)
                else "a regular file" if stat.S_ISREG(st.st_mode) else "not a socket")
        raise UserError(f"socket {path}: {kind} is in the way (nicd replaces only a stale socket); "
                        "remove it or choose another path")
    if serving(path):
        raise UserError(f"socket {path}: another process serves it (another nicd?); choose another path")


def serving(path: str) -> bool:
    """Whether a process accepts connections on the socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def remove_stale(path: str) -> None:
    """Unlink ``path`` if it is a socket nobody serves (a crashed run's); anything else stays."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode) or serving(path):
            return
    except OSError:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class StatsServer:
    def __init__(self, path: str, snapshot):
        self.path = Path(path)
        self.snapshot = snapshot
        self.path.parent.mkdir(parents=True, exist_ok=True)
        check_path(path)
        remove_stale(path)  # a crashed run's socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # bind() creates the file with the umask's mode: set it first, so the socket is never
        # wider than SOCKET_MODE, not even between bind and a chmod.
        old = os.umask(0o777 & ~SOCKET_MODE)
        try:
            self.sock.bind(str(self.path))
        finally:
            os.umask(old)
        self._inode = os.lstat(path).st_ino  # close() removes this socket, nothing put there since
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="nicd-stats", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError as exc:
                if exc.errno not in TEMPORARY_ACCEPT_ERRORS:
                    if not self._stop.is_set():
                        log.error("stats socket stopped serving: %s", exc)
                    return
                if not backoff:
                    log.warning("stats socket: accept failed (%s), retrying", exc.strerror)
                # the connection stays queued: wait instead of spinning on it
                backoff = min(MAX_BACKOFF_S, backoff * 2 or 0.05)
                self._stop.wait(backoff)
                continue
            if backoff:
                log.info("stats socket: accepting again")
                backoff = 0.0
            with conn:
                try:
                    conn.sendall(json.dumps(self.snapshot()).encode() + b"\n")
                except OSError:
                    pass

    def close(self) -> None:
        # Unlink before closing: a client then finds no file ("no nicd is running") or is reset
        # while queued ("went away"), never a refused connect that reads like a stale socket.
        try:
            if os.lstat(self.path).st_ino == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def read(path: str, timeout: float = 3.0) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    except ConnectionResetError:  # the daemon closed its socket with us still queued: it is stopping
        raise UserError(f"nicd at {path} went away before it answered (stopping?)") from None
    except FileNotFoundError:
        raise UserError(f"no nicd is running (no socket at {path})") from None
    except ConnectionRefusedError:
        raise UserError(f"no nicd answers at {path} (stale socket?)") from None
    except PermissionError:
        raise UserError(f"not allowed to read {path} (run as root)") from None
    except TimeoutError:
        raise UserError(f"nicd at {path} did not answer within {timeout:.0f} s") from None
    finally:
        s.close()
    try:
        return json.loads(b"".join(chunks))
    except ValueError:  # nothing or half a document: it stopped while answering
        raise UserError(f"nicd at {path} went away before it answered (stopping?)") from None


def raw_edge_bytes(c: dict) -> int:
    """Bytes that compressed packets carried raw: the floats a segment boundary cut (wire format
    rule 2). A compressed payload is head + 4 x its values + tail, and the tier counters count
    those values, so this is what the payload counters leave over."""
    return c["egress_orig_bytes"] - 4 * (c["tier0"] + c["tier8"] + c["tier16"] + c["tier32"])


def format_stats(s: dict) -> str:
    c = s["counters"]
    ratio = c["egress_orig_bytes"] / c["egress_wire_bytes"] if c["egress_wire_bytes"] else 0.0
    tiers = [c["tier0"], c["tier8"], c["tier16"], c["tier32"]]
    total = sum(tiers) or 1
    drops = {k[len("drop_"):]: v for k, v in c.items() if k.startswith("drop_") and v}
    lines = [
        f"nicd pid {s['pid']}, up {s['uptime_s']:.0f} s, interfaces {', '.join(s['config']['interfaces'])}, "
        f"codec {s['config']['codec']} 2^{s['config']['error_bound']}, {s['config']['queues']} queue pair(s)",
        f"egress : {c['egress_packets']} packets, {c['egress_compressed']} compressed "
        f"({c['egress_orig_bytes']} -> {c['egress_wire_bytes']} payload bytes, {ratio:.2f}x); raw: "
        f"{c['egress_raw_not_negotiated']} not negotiated, {c['egress_raw_not_smaller']} not smaller, "
        f"{c['egress_raw_short']} short, {c['egress_raw_ext_header']} IPv6 extension headers, "
        f"{c['egress_raw_view_pending']} awaiting conntrack "
        f"({c['egress_raw_bytes']} bytes; {raw_edge_bytes(c)} bytes of cut floats raw in compressed "
        "packets)",
        f"ingress: {c['ingress_packets']} packets, {c['ingress_restored']} restored "
        f"({c['ingress_wire_bytes']} -> {c['ingress_orig_bytes']} payload bytes; {c['ingress_merged']} of them "
        "handed to TCP inside the one before)",
        f"trains : {c['egress_trains']} super-packets sent as one v3 segment train, "
        f"{c['ingress_trains']} restored ({c['ingress_train_segments']} segments; drop_train_tail: bytes left "
        "off a train); "
        f"{c['flows_trains_gave_up']} flows gave trains up for v2 (their path did not pass them)",
        "tiers  : " + ", ".join(f"{n} {100 * v / total:.1f}%" for n, v in zip(("0bit", "8bit", "16bit", "32bit"), tiers)),
        f"flows  : {s['flows_active']} active, {c['flows_negotiated']} negotiated, {s['flows_expired']} expired, "
        f"{c['flows_closed_rst']} ended by RST, {c['flows_closed_fin']} by FIN; "
        f"hellos {c['hello_sent']} sent / {c['hello_received']} received",
        # why handshakes did not negotiate: a peer without nicd, other settings, spoofs, floods
        f"refused: {c['hello_without_option']} without option, {c['hello_mismatch']} other settings, "
        f"{c['hello_unmatched']} unmatched, {c['hello_no_room']} no option room; "
        f"{c['hello_evicted']} half-open evicted ({c['hello_evicted_own']} by their own group)",
        # what routers and middleboxes did to negotiated flows (docs/wire-format.md, routed networks)
        f"network: {c['ingress_marks_rewritten']} compressed packets arrived with a rewritten mark "
        f"({c['flows_marks_rewritten']} flows); {c['flows_fell_back']} flows fell back to raw "
        f"({c['egress_raw_fell_back']} packets sent raw since); {c['confirm_failed']} answered hellos "
        f"never confirmed; {c['flow_table_full']} flows left raw, table full, {c['flow_owner_full']} owner at "
        "its cap",
        "drops  : " + (", ".join(f"{k} {v}" for k, v in drops.items()) if drops else "none")
        + (f"; {c['verdict_errors']} verdicts refused" if c["verdict_errors"] else "")
        + (f"; queue overruns {c['recv_enobufs']}" if c["recv_enobufs"] else ""),
    ]
    if s["config"].get("gso"):
        lines.insert(2, f"gso    : {c['gso_super_packets']} super-packets sent compressed through the raw socket "
                        f"(their packets are counted above), {c['gso_send_errors']} packets it refused")
    lines += [format_queue(q) for q in s.get("queues", [])]
    return "\n".join(lines)


def format_queue(q: dict) -> str:
    """One line per queue pair (its thread's own counters), from the snapshot's "queues" list:
    [{"egress_queue": 7100, "ingress_queue": 7101, "counters": {...}}, ...]."""
    c = q["counters"]
    drops = sum(v for k, v in c.items() if k.startswith("drop_"))
    return (f"queue {q['egress_queue']}/{q['ingress_queue']}: egress {c['egress_packets']} packets "
            f"({c['egress_compressed']} compressed), ingress {c['ingress_packets']} packets "
            f"({c['ingress_restored']} restored), drops {drops}, overruns {c['recv_enobufs']}")
