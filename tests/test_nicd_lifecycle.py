"""How nicd starts and stops as an operator runs it: a socket path that holds something else, a
second signal while it stops (a double Ctrl-C, `timeout`), an iptables that fails during the
stop, and a non-root user holding the capabilities it needs (issue 19, items 8 to 10).

Each test runs a real nicd in a one-host testbed (real iptables rules, real NFQUEUE binds).
Needs root (namespaces, netfilter; setpriv drops to an unprivileged user).
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from netns_helpers import wait_until

VENV = Path(sys.executable).parent
INC = str(VENV / "inceptionn")
RULE_TAG = "inceptionn-nicd-"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")


@contextmanager
def one_host(tb_name):
    from inceptionn.kernel_tc.testbed import Testbed
    with Testbed(hosts=1, name=tb_name) as tb:
        yield tb.hosts[0]


def one_instance_rules(ifname: str) -> int:
    """How many queue rules one daemon on one interface installs (rules.py says)."""
    from inceptionn.daemon.config import NicdConfig
    from inceptionn.daemon.rules import rule_specs
    return len(rule_specs(NicdConfig(interfaces=[ifname])))


def queue_rules(host) -> list[str]:
    r = host.run(["iptables-save"], capture_output=True, text=True, timeout=30, check=True)
    return [line for line in r.stdout.splitlines() if RULE_TAG in line]


def start(host, argv, log: Path, **kw) -> subprocess.Popen:
    with open(log, "wb") as f:
        return host.popen(argv, stdout=f, stderr=f, **kw)


def ready(p, log: Path, timeout: float = 30) -> None:
    assert wait_until(lambda: b"nicd: ready" in log.read_bytes() or p.poll() is not None, timeout), log.read_text()
    assert p.poll() is None, log.read_text()


def stop_all(p) -> None:
    if p.poll() is None:
        p.kill()
        p.wait()


# --- item 8: the stats socket path -------------------------------------------------------------

@pytest.mark.parametrize("kind", ["file", "directory", "symlink", "served"])
def test_socket_path_holding_something_else_is_refused_and_kept(tmp_path, tb_name, kind):
    """A regular file (a typo in `socket`), a directory, a link or a socket another process
    serves at the socket path: nicd refuses in one line before it installs a rule, and the
    thing is still there afterwards. (It used to delete whatever sat there.)"""
    import socket as pysocket

    path = tmp_path / "nicd.sock"
    other = None
    if kind == "file":
        path.write_text("precious\n")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":
        (tmp_path / "target").write_text("precious\n")
        path.symlink_to(tmp_path / "target")
    else:
        other = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
        other.bind(str(path))
        other.listen(1)
    try:
        with one_host(tb_name) as h:
            r = h.run([INC, "nicd", "-i", h.ifname, "--socket", str(path)], capture_output=True, text=True,
                      timeout=60)
            assert r.returncode == 2, (r.returncode, r.stderr)
            assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
            assert f"socket {path}: " in r.stderr, r.stderr
            assert ("another process serves it" if kind == "served" else "is in the way") in r.stderr
            assert queue_rules(h) == []
        if kind == "file":
            assert path.read_text() == "precious\n"
        elif kind == "directory":
            assert path.is_dir()
        elif kind == "symlink":
            assert path.is_symlink() and (tmp_path / "target").read_text() == "precious\n"
        else:
            assert path.is_socket()
            other.settimeout(5)
            probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
            probe.connect(str(path))  # still served by its owner
            probe.close()
    finally:
        if other is not None:
            other.close()


def test_stale_socket_is_replaced_and_removed_on_stop(tmp_path, tb_name):
    """A crashed run's socket (bound, nobody listening) is still taken over, and the stop
    removes the daemon's own socket."""
    import socket as pysocket

    path, log = tmp_path / "nicd.sock", tmp_path / "nicd.log"
    stale = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    with one_host(tb_name) as h:
        p = start(h, [INC, "nicd", "-i", h.ifname, "--socket", str(path)], log)
        try:
            ready(p, log)
            r = subprocess.run([INC, "stats", "--socket", str(path), "--json"], capture_output=True, timeout=20)
            assert r.returncode == 0, r.stderr
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0, log.read_text()
        finally:
            stop_all(p)
    assert not path.exists()


def test_cleanup_removes_a_killed_daemons_metrics_file(tmp_path, tb_name):
    """SIGKILL leaves the metrics file with counters nobody updates; --cleanup (the unit's
    ExecStopPost) removes it with the rules, so node_exporter stops serving them."""
    sock, log, prom = tmp_path / "nicd.sock", tmp_path / "nicd.log", tmp_path / "inceptionn.prom"
    with one_host(tb_name) as h:
        p = start(h, [INC, "nicd", "-i", h.ifname, "--socket", str(sock), "--metrics-textfile", str(prom)], log)
        try:
            ready(p, log)
            assert "inceptionn_nicd_egress_packets_total{" in prom.read_text()
            p.kill()
            p.wait()
        finally:
            stop_all(p)
        assert prom.exists() and len(queue_rules(h)) == one_instance_rules(h.ifname)
        r = h.run([INC, "nicd", "--cleanup", "--socket", str(sock), "--metrics-textfile", str(prom)],
                  capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"removed {one_instance_rules(h.ifname)} rule(s)" in r.stderr, r.stderr
        assert not prom.exists() and not sock.exists()
        assert queue_rules(h) == []


# --- item 9: a second signal while stopping ----------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "timeout"])
def test_second_signal_during_stop_leaves_no_rule(tmp_path, tb_name, sig):
    """As a terminal's double Ctrl-C (SIGINT) or `timeout` (SIGTERM) does: the signal to the
    daemon's whole process group, again and again while it stops (its iptables children are in
    that group unless nicd keeps them out). Five runs: each stop exits 0, says it removed all 5
    rules, and leaves none."""
    with one_host(tb_name) as h:
        for run in range(5):
            sock, log = tmp_path / f"r{run}.sock", tmp_path / f"r{run}.log"
            p = start(h, [INC, "nicd", "-i", h.ifname, "--socket", str(sock)], log, start_new_session=True)
            try:
                ready(p, log)
                installed = queue_rules(h)
                assert len(installed) == one_instance_rules(h.ifname), installed
                os.killpg(p.pid, sig)
                # keep signalling (every 2 ms) until the daemon has exited
                deadline, pressed = time.monotonic() + 30, 1
                while p.poll() is None and time.monotonic() < deadline:
                    try:
                        os.killpg(p.pid, sig)
                        pressed += 1
                    except ProcessLookupError:
                        break
                    time.sleep(0.002)
                assert p.wait(timeout=10) == 0, log.read_text()
            finally:
                stop_all(p)
            text = log.read_text()
            assert queue_rules(h) == [], f"run {run}: rules left after {pressed} signals:\n{text}"
            assert f"removed {one_instance_rules(h.ifname)} rule(s)" in text, text
            assert pressed > 1, pressed
            assert "Traceback" not in text, text
            assert not sock.exists()


def test_stop_with_failing_iptables_reports_failure(tmp_path, tb_name):
    """An iptables that fails while the daemon stops (here a wrapper that refuses -S from a
    given moment on): the stop must not read that as "no rules" and report success. It exits
    1, names the rules it could not remove, and `--cleanup` removes them afterwards."""
    real = shutil.which("iptables")
    bindir, broken = tmp_path / "bin", tmp_path / "broken"
    bindir.mkdir()
    (bindir / "iptables").write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -S ] && [ -e {broken} ] && {{ echo "broken on purpose" >&2; exit 4; }}; '
        f'done\nexec {real} "$@"\n')
    (bindir / "iptables").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    sock, log = tmp_path / "nicd.sock", tmp_path / "nicd.log"
    with one_host(tb_name) as h:
        p = start(h, [INC, "nicd", "-i", h.ifname, "--socket", str(sock)], log, env=env)
        try:
            ready(p, log)
            assert len(queue_rules(h)) == one_instance_rules(h.ifname)
            broken.touch()
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=60) == 1, log.read_text()
        finally:
            stop_all(p)
        text = log.read_text()
        assert "could not remove every nicd rule" in text and "broken on purpose" in text, text
        assert "removed" not in text.split("stopping", 1)[1].replace("could not remove", ""), text
        assert len(queue_rules(h)) == one_instance_rules(h.ifname)  # really still there: the exit status told the truth
        r = h.run([INC, "nicd", "--cleanup", "--socket", str(sock)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"removed {one_instance_rules(h.ifname)} rule(s)" in r.stderr, r.stderr
        assert queue_rules(h) == []


# --- item 10: capabilities instead of root -----------------------------------------------------

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
CAPS = ["--inh-caps=+net_admin,+net_raw", "--ambient-caps=+net_admin,+net_raw"]


@pytest.fixture
def nobody_reaches_the_venv():
    """The user nobody must run the venv's inceptionn: where the checkout sits under a directory
    others may not search (a clone in root's 0700 home), that directory gets o+x for the test
    and its mode back after."""
    changed = []
    try:
        for d in reversed(Path(INC).parents):
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH:
                d.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
                changed.append((d, stat.S_IMODE(mode)))
        yield
    finally:
        for d, mode in reversed(changed):
            d.chmod(mode)


def _user_dir(tmp_path) -> Path:
    """A directory the user nobody can create its socket and log in (tmp_path's parents are
    root's 0700)."""
    d = Path("/tmp") / f"nicd-nobody-{os.getpid()}-{tmp_path.name}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    return d


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
def test_non_root_user_with_capabilities_runs_the_daemon(tmp_path, tb_name, nobody_reaches_the_venv):
    """The user nobody holding CAP_NET_ADMIN and CAP_NET_RAW (ambient, so the iptables it runs
    hold them too) starts nicd: rules installed, the gso fast path on (the raw socket), counters
    served, a clean stop that removes the rules."""
    d = _user_dir(tmp_path)
    sock, log = d / "nicd.sock", d / "nicd.log"
    try:
        with one_host(tb_name) as h:
            p = start(h, NOBODY + CAPS + ["--", INC, "nicd", "-i", h.ifname, "--socket", str(sock)], log)
            try:
                ready(p, log)
                status = Path(f"/proc/{p.pid}/status").read_text()
                assert "\nUid:\t65534\t65534\t65534\t65534\n" in status, status
                assert len(queue_rules(h)) == one_instance_rules(h.ifname)
                r = subprocess.run([INC, "stats", "--socket", str(sock), "--json"], capture_output=True, text=True,
                                   timeout=20)
                assert r.returncode == 0, r.stderr
                assert '"gso": true' in r.stdout  # CAP_NET_RAW: the raw socket opened
                p.send_signal(signal.SIGTERM)
                assert p.wait(timeout=30) == 0, log.read_text()
            finally:
                stop_all(p)
            assert queue_rules(h) == []
            assert f"removed {one_instance_rules(h.ifname)} rule(s)" in log.read_text()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("who", [NOBODY, ["setpriv", "--bounding-set=-net_admin"]], ids=["nobody", "root-without"])
def test_without_cap_net_admin_is_refused_in_one_line(tmp_path, tb_name, who, nobody_reaches_the_venv):
    """The user nobody without capabilities, and root without CAP_NET_ADMIN (a container that
    dropped it): one line naming the capability, before any rule."""
    d = _user_dir(tmp_path)
    try:
        with one_host(tb_name) as h:
            r = h.run(who + ["--", INC, "nicd", "-i", h.ifname, "--socket", str(d / "nicd.sock")],
                      capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and "nicd needs CAP_NET_ADMIN" in r.stderr, (r.returncode, r.stderr)
            assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
            assert queue_rules(h) == []
    finally:
        shutil.rmtree(d, ignore_errors=True)
