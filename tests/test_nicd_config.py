"""nicd configuration through the CLI: bad files are refused with exit code 2 and one line that
names the file and line; ``inceptionn stats`` without a daemon; SIGHUP reload.

Every config here names an interface that does not exist (ntnone0), so a config the daemon
wrongly accepted fails later on that instead of starting a daemon in the root namespace.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns_helpers import wait_until

INC = str(Path(sys.executable).parent / "inceptionn")
IFACE = 'interfaces = ["ntnone0"]\n'


def run_nicd_config(path, *extra, timeout=30):
    r = subprocess.run([INC, "nicd", "--config", str(path), *extra], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return r


def assert_refused(r, *needles):
    err = r.stderr
    assert r.returncode == 2, (r.returncode, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected a one-line message, got: {err!r}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


# (name, file body, what the message must name besides the file; the line number is checked
# separately, as the 1-based line of the offending key)
BAD = [
    ("unknown_key", IFACE + "error_bund = -8\n", ["error_bund", "unknown"], 2),
    ("bad_type_str", IFACE + 'queues = "two"\n', ["queues"], 2),
    ("bad_type_float", IFACE + "error_bound = -8.5\n", ["error_bound"], 2),
    ("bad_type_bool", IFACE + "queues = true\n", ["queues"], 2),
    ("interfaces_not_list", 'interfaces = "ntnone0"\n', ["interfaces"], 1),
    ("queues_zero", IFACE + "queues = 0\n", ["queues"], 2),
    ("duplicate_marks", IFACE + "tos_hello = 0x2c\ntos_compressed = 0x2c\n", ["same mark"], (2, 3)),
    ("duplicate_mark_with_default", IFACE + "tos = 0x2c\n", ["same mark"], 2),
    ("tos_ecn_bits", IFACE + "tos = 0x29\n", ["tos", "ECN"], 2),
    ("error_bound_range", IFACE + "error_bound = 3\n", ["error_bound"], 2),
    ("log_level", IFACE + 'log_level = "loud"\n', ["log_level"], 2),
    ("socket_relative", IFACE + 'socket = "nicd.sock"\n', ["socket"], 2),
    ("unknown_table", IFACE + "[extra]\nx = 1\n", ["extra", "unknown"], 2),
]


@pytest.mark.parametrize("name,body,needles,line", BAD, ids=[b[0] for b in BAD])
def test_bad_config_refused_with_file_line(tmp_path, name, body, needles, line):
    f = tmp_path / f"{name}.toml"
    f.write_text(body)
    msg = assert_refused(run_nicd_config(f), *needles)
    assert "does not exist" not in msg, f"the bad config was accepted: {msg}"
    lines = line if isinstance(line, tuple) else (line,)
    assert any(f"{f}:{n}:" in msg for n in lines), f"message does not name {f.name} line {line}: {msg}"


def test_missing_interfaces_names_the_file(tmp_path):
    f = tmp_path / "noif.toml"
    f.write_text("error_bound = -8\n")
    assert_refused(run_nicd_config(f), str(f), "interfaces")


def test_unreadable_config(tmp_path):
    assert_refused(run_nicd_config(tmp_path / "missing.toml"), str(tmp_path / "missing.toml"), "cannot read")
    assert_refused(run_nicd_config(tmp_path), str(tmp_path), "cannot read")  # a directory


def test_config_not_utf8_refused(tmp_path):
    f = tmp_path / "latin1.toml"
    f.write_bytes(IFACE.encode() + "# Gr\u00fc\u00dfe\nerror_bound = -8\n".encode("latin-1"))
    msg = assert_refused(run_nicd_config(f), f"{f}:2:", "UTF-8", "0xfc")
    assert "does not exist" not in msg


def test_toml_syntax_error_names_line(tmp_path):
    f = tmp_path / "syntax.toml"
    f.write_text(IFACE + "error_bound = \n")
    msg = assert_refused(run_nicd_config(f), str(f))
    assert "line 2" in msg


def test_flag_errors_name_the_flag(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text(IFACE)
    assert_refused(run_nicd_config(f, "--error-bound", "4"), "--error-bound", "error_bound")
    assert_refused(run_nicd_config(f, "--queues", "0"), "--queues")


def test_nonexistent_interface_refused(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text(IFACE)
    assert_refused(run_nicd_config(f), "ntnone0", "does not exist")


def test_stats_without_daemon():
    r = subprocess.run([INC, "stats", "--socket", "/nonexistent/nicd.sock", "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "no nicd is running" in r.stderr and "/nonexistent/nicd.sock" in r.stderr
    assert r.stdout == ""


def test_stats_on_a_socket_nobody_serves(tmp_path):
    import socket as pysocket
    path = tmp_path / "stale.sock"
    s = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # bound, never listening: a stale socket file
    r = subprocess.run([INC, "stats", "--socket", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert str(path) in r.stderr


# --- SIGHUP reload (a one-host testbed: the daemon installs real rules) ------------------------

def _error_bound(sock) -> int:
    r = subprocess.run([INC, "stats", "--socket", str(sock), "--json"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["config"]["error_bound"]


@contextlib.contextmanager
def _nicd_on_one_host(tmp_path, name, cfg_text):
    """A real nicd on a 1-host testbed, with its config file, socket and log in tmp_path; yields
    (process, config path, socket path, log path) once it is ready; killed if still running."""
    from inceptionn.kernel_tc.testbed import Testbed
    sock, cfg, log = tmp_path / "h.sock", tmp_path / "nicd.toml", tmp_path / "nicd.log"
    cfg.write_text(f'interfaces = ["eth0"]\nsocket = "{sock}"\n' + cfg_text)
    with Testbed(hosts=1, name=f"{name}{os.getpid()}") as tb, open(log, "wb") as logf:
        (h,) = tb.hosts
        p = h.popen([INC, "nicd", "--config", str(cfg)], stdout=logf, stderr=logf)
        try:
            assert wait_until(lambda: b"nicd: ready" in log.read_bytes() or p.poll() is not None, 30), log.read_text()
            assert p.poll() is None, log.read_text()
            assert _error_bound(sock) == -10
            yield p, cfg, sock, log
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")
def test_sighup_reload_changes_error_bound(tmp_path):
    body = f'interfaces = ["eth0"]\nsocket = "{tmp_path / "h.sock"}"\n'
    with _nicd_on_one_host(tmp_path, "ntc", "error_bound = -10\n") as (p, cfg, sock, log):
        cfg.write_text(body + "error_bound = -7\n")
        p.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _error_bound(sock) == -7), log.read_text()
        assert wait_until(lambda: b"reloaded: error bound 2^-7, log level info\n" in log.read_bytes()), \
            log.read_text()  # nothing else changed: gso still "auto" as loaded, though it runs resolved
        # a setting that needs a restart is named, not applied (settings.py: reload=False)
        cfg.write_text(body + "error_bound = -7\nqueue_maxlen = 1024\n")
        p.send_signal(signal.SIGHUP)
        assert wait_until(lambda: b"restart to apply queue_maxlen" in log.read_bytes()), log.read_text()
        # a bad file on reload is refused and the running config kept
        cfg.write_text(body + "error_bound = 5\n")
        p.send_signal(signal.SIGHUP)
        assert wait_until(lambda: b"reload refused" in log.read_bytes()), log.read_text()
        assert p.poll() is None
        assert _error_bound(sock) == -7
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0, log.read_text()
        assert not sock.exists()


# --- the stats socket --------------------------------------------------------------------------

def test_stats_socket_never_wider_than_0660(tmp_path, monkeypatch):
    """Under umask 0 a bind() makes the socket 0777; the mode must already be 0660 right after
    bind (no window until a chmod), seen from inside bind() itself."""
    import socket as pysocket

    from inceptionn.daemon import stats as stats_mod

    seen = []

    class Recording(pysocket.socket):
        def bind(self, addr):
            super().bind(addr)
            seen.append(os.stat(addr).st_mode & 0o777)

    monkeypatch.setattr(stats_mod.socket, "socket", Recording)
    old = os.umask(0)
    try:
        server = stats_mod.StatsServer(str(tmp_path / "s.sock"), lambda: {"ok": 1})
    finally:
        os.umask(old)
    try:
        assert seen == [0o660], [oct(m) for m in seen]
        assert os.stat(tmp_path / "s.sock").st_mode & 0o777 == 0o660
        assert stats_mod.read(str(tmp_path / "s.sock")) == {"ok": 1}
        assert os.umask(old) == old, "the process umask was not restored"
    finally:
        server.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")
def test_stats_socket_survives_running_out_of_descriptors(tmp_path):
    """A daemon out of file descriptors cannot accept() (EMFILE); once descriptors are free
    again it serves the client that waited and every later one."""
    import resource
    import socket as pysocket

    with _nicd_on_one_host(tmp_path, "nfd", "") as (p, cfg, sock, log):
        limits = resource.prlimit(p.pid, resource.RLIMIT_NOFILE)
        in_use = len(os.listdir(f"/proc/{p.pid}/fd"))
        resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (in_use, limits[1]))
        try:
            waiting = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
            waiting.settimeout(10)
            waiting.connect(str(sock))  # queued in the backlog; accept() fails with EMFILE
            assert wait_until(lambda: b"accept failed" in log.read_bytes()), log.read_text()
            time.sleep(0.5)  # a few more failed rounds (backing off, not spinning)
        finally:
            resource.prlimit(p.pid, resource.RLIMIT_NOFILE, limits)
        with waiting:
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = waiting.recv(65536)
                assert chunk, "the daemon closed the waiting connection unanswered"
                answer += chunk
        assert json.loads(answer)["pid"] == p.pid
        for _ in range(3):
            assert _error_bound(sock) == -10
        assert p.poll() is None, log.read_text()
        text = log.read_text()
        assert "Too many open files" in text and "accepting again" in text, text
        assert text.count("accept failed") == 1, "one line per streak of failures, not one per retry"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == 0, log.read_text()
