"""The soft NIC as a real systemd service on two hosts, following docs/deploy.md word for word.

Two containers boot their own systemd as PID 1 (tests/nspawn.py: systemd-nspawn on a throw-away
overlay of this machine's root file system), each inside one host of a two-host testbed. In each,
`make install-service` installs /opt/inceptionn from the wheelhouse (the containers cannot reach
PyPI), then systemctl drives the unit: start, reload (SIGHUP), a crash and its restart, stop;
the netfilter rules are read from the host's namespace. Between the two, a tagged job crosses the
wire compressed and arrives as the scaled codec's reconstruction (the shim's default mark). Last, `make install-service` again
over the running service, and `make uninstall-service`.

Every guide command the test runs is first checked to appear verbatim in docs/deploy.md.
Needs root and systemd-nspawn (apt-get install systemd-container).
"""
from __future__ import annotations

import json
import os
import re
import select
import shlex
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nspawn  # noqa: E402
from test_nicd import assert_went_compressed, recon  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "deploy.md").read_text()
UNIT = "inceptionn-nicd"
CONFIG = "/etc/inceptionn/nicd.toml"
PORT = 23000

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mounts, netfilter)"),
    pytest.mark.skipif(bool(nspawn.missing_tools()),
                       reason=f"no {' '.join(nspawn.missing_tools())} (apt-get install systemd-container)"),
]


def guide(c, command: str, *, env: dict | None = None, timeout: float = 300, check: bool = True):
    """Run one command of docs/deploy.md, as written there, in container ``c`` from the checkout."""
    assert command in GUIDE, f"not in docs/deploy.md: {command}"
    prefix = "".join(f"{k}={shlex.quote(v)}; " for k, v in (env or {}).items())  # as typed before it
    r = c.sh(f"cd {shlex.quote(str(ROOT))} && {prefix}{command}", timeout=timeout)
    if check:
        assert r.returncode == 0, f"{c.name}: {command}\n{r.stdout}\n{r.stderr}"
    return r


def our_rules(host) -> list[str]:
    """Every rule of the soft NIC in the host's namespace, all tables (nothing else there is
    tagged inceptionn: the testbed's links are unshaped)."""
    r = host.run(["iptables-save"], capture_output=True, text=True, timeout=30, check=True)
    return [line for line in r.stdout.splitlines() if line.startswith("-A ") and "inceptionn" in line]


def queue_rules(host) -> list[str]:
    return [line for line in our_rules(host) if "NFQUEUE" in line]


def wait_for(what: str, probe, timeout: float = 30, c=None):
    """Poll until ``probe()`` is true; on time-out the failure shows container ``c``'s unit log."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f"; {UNIT} log:\n{journal(c)}" if c else ""))
        time.sleep(0.2)


def stats(c) -> dict:
    r = c.run(["inceptionn", "stats", "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def main_pid(c) -> int:
    return int(c.run(["systemctl", "show", "-p", "MainPID", "--value", UNIT]).stdout.strip() or 0)


def journal(c) -> str:
    return c.run(["journalctl", "-u", UNIT, "-o", "cat", "--no-pager"]).stdout


def set_setting(c, key: str, value: str) -> None:
    r = c.run(["sed", "-i", f"s/^{key} = .*/{key} = {value}/", CONFIG])
    assert r.returncode == 0, r.stderr


class Site:
    """One host of the deployment: a testbed host with a booted container inside it."""

    def __init__(self, host, container):
        self.host, self.c = host, container


@pytest.fixture(scope="module")
def wheelhouse():
    """Built on this machine before any overlay exists (the containers see it through theirs)."""
    r = subprocess.run(["make", "--no-print-directory", "wheelhouse"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return "build/wheelhouse"


@pytest.fixture(scope="module")
def sites(wheelhouse):
    """Hosts A and B, each with the service installed and configured (steps 1 and 2 of the guide)."""
    from inceptionn.kernel_tc.testbed import Testbed
    tag = f"sd{os.getpid() % 100000}"
    install = f"make install-service WHEELHOUSE={wheelhouse}"
    assert install in GUIDE
    with ExitStack() as stack:
        tb = stack.enter_context(Testbed(hosts=2, name=tag))
        containers = stack.enter_context(nspawn.booted_all([(f"{tag}{h.name}", h.netns) for h in tb.hosts],
                                                           read_only=[ROOT]))
        out = [Site(h, c) for h, c in zip(tb.hosts, containers)]
        # both installs at once: each builds a venv, so both cores work
        installs = [s.c.popen(["sh", "-c", f"cd {shlex.quote(str(ROOT))} && {install}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for s in out]
        for s, p in zip(out, installs):
            log, _ = p.communicate(timeout=600)
            assert p.returncode == 0, f"{s.c.name}: {install}\n{log}"
        for s in out:
            guide(s.c, f"sed -i 's/^interfaces = .*/interfaces = [\"{s.host.ifname}\"]/' /etc/inceptionn/nicd.toml")
        yield out
    for s in out:
        assert nspawn.leftovers(s.c.name, s.c.root.parent) == []


def test_installed_as_a_daemon(sites):
    """/opt/inceptionn is a venv of the system python with the package itself, not a link to
    this checkout; the unit runs it."""
    c = sites[0].c
    cfg = c.run(["cat", "/opt/inceptionn/pyvenv.cfg"]).stdout
    assert re.search(r"^home = /usr/bin$", cfg, re.M), cfg
    where = c.run(["/opt/inceptionn/bin/python", "-c", "import inceptionn, sys; print(inceptionn.__file__)"])
    assert where.stdout.startswith("/opt/inceptionn/lib/"), where
    assert c.run(["/opt/inceptionn/bin/python", "-c", "import torch"]).returncode != 0  # core deps only
    assert c.run(["readlink", "/usr/local/bin/inceptionn"]).stdout.strip() == "/opt/inceptionn/bin/inceptionn"
    exec_start = c.run(["systemctl", "show", "-p", "ExecStart", "--value", UNIT]).stdout
    assert "path=/opt/inceptionn/bin/inceptionn" in exec_start, exec_start


PROM = "/var/lib/prometheus/node-exporter/inceptionn.prom"


def test_start_reload_crash_stop(sites):
    a = sites[0]
    c, host = a.c, a.host
    # the guide's "Metrics": the unit may write node_exporter's textfile directory
    guide(c, f"sed -i 's|^metrics_textfile = .*|metrics_textfile = \"{PROM}\"|' /etc/inceptionn/nicd.toml")
    guide(c, f"systemctl enable --now {UNIT}")
    try:
        assert guide(c, f"systemctl is-active {UNIT}").stdout.strip() == "active"
        # the daemon installs its rules one by one, then opens its stats socket: read them after
        # (read before, a partial set once made the comparison after the crash fail)
        wait_for("the stats socket", lambda: c.run(["test", "-S", "/run/inceptionn/nicd.sock"]).returncode == 0, c=c)
        prom = c.run(["stat", "-c", "%a", PROM]).stdout.strip(), c.read_bytes(PROM).decode()
        assert prom[0] == "644" and "\ninceptionn_nicd_egress_packets_total{" in prom[1], prom
        rules = queue_rules(host)
        assert any(f"-o {host.ifname}" in r for r in rules) and any(f"-i {host.ifname}" in r for r in rules), rules
        shown = guide(c, "inceptionn stats").stdout
        assert f"interfaces {host.ifname}, codec inceptionn 2^-10" in shown, shown

        # reload: SIGHUP to the same process, the new error bound in effect and in the journal
        pid = main_pid(c)
        set_setting(c, "error_bound", "-8")
        guide(c, f"systemctl reload {UNIT}")
        wait_for("'reloaded' in the journal", lambda: "reloaded: error bound 2^-8" in journal(c), c=c)
        assert stats(c)["config"]["error_bound"] == -8
        assert main_pid(c) == pid

        # a crash: systemd restarts it (Restart=on-failure), ExecStopPost removed the stale
        # rules in between, and the new daemon installs exactly one set
        assert c.run(["systemctl", "kill", "--signal=SIGKILL", UNIT]).returncode == 0
        wait_for("a restarted daemon", lambda: main_pid(c) not in (0, pid), c=c)
        wait_for("the stats socket", lambda: c.run(["inceptionn", "stats"]).returncode == 0, c=c)
        assert queue_rules(host) == rules, our_rules(host)
        stop_post = c.run(["systemctl", "show", "-p", "ExecStopPost", "--value", UNIT]).stdout
        assert "status=0/0" in stop_post, stop_post  # the cleanup ran after the crash, and worked
    finally:
        set_setting(c, "error_bound", "-10")
        set_setting(c, "metrics_textfile", '""')
        c.run(["systemctl", "stop", UNIT])
    assert c.run(["systemctl", "is-active", UNIT]).stdout.strip() == "inactive"
    assert queue_rules(host) == []
    assert c.run(["test", "-e", PROM]).returncode != 0  # removed on stop
    assert c.run(["test", "-e", "/run/inceptionn/nicd.sock"]).returncode != 0


def test_installed_unit_security_score(sites):
    """systemd-analyze security on the unit as the container's systemd loaded it (not only the
    file, as tests/test_systemd_unit.py checks it offline)."""
    r = sites[0].c.run(["systemd-analyze", "security", "--no-pager", f"{UNIT}.service"])
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    score = float(m.group(1))
    print(f"systemd-analyze security (installed, under systemd): exposure {score}")
    assert score <= 3.0


def test_two_hosts_tagged_job_compressed_and_restored(sites):
    """Steps 3 to 5 of the guide: both services up, B receives, A sends, through the shim."""
    (a, b) = sites
    for s in sites:
        guide(s.c, f"systemctl enable --now {UNIT}")
        wait_for(f"{s.c.name}'s daemon", lambda s=s: s.c.run(["inceptionn", "stats"]).returncode == 0, c=s.c)
        guide(s.c, "inceptionn stats")
    try:
        recv_cmd = (f"inceptionn run --tag port={PORT} -- python3 tests/nicd_peer.py recv --bind 0.0.0.0 "
                    f"--port {PORT} --out /tmp/got.f32")
        assert recv_cmd in GUIDE
        receiver = b.c.popen(["sh", "-c", f"cd {shlex.quote(str(ROOT))} && {recv_cmd}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert select.select([receiver.stdout], [], [], 30)[0], "the receiver did not start in 30 s"
            assert receiver.stdout.readline().strip() == "listening", receiver.stderr.read()
            guide(a.c, "/opt/inceptionn/bin/python -c \"import numpy as np; (np.random.default_rng(0)"
                       ".standard_normal(1 << 20) / 64).astype(np.float32).tofile('/tmp/grads.f32')\"")
            assert "\nPEER=10.0.0.2\n" in GUIDE  # the guide's address of B, here the testbed's
            guide(a.c, f"inceptionn run --tag port={PORT} -- python3 tests/nicd_peer.py send --host $PEER "
                       f"--port {PORT} --data /tmp/grads.f32 --tos 0", env={"PEER": b.host.ip}, timeout=120)
            assert receiver.wait(60) == 0, receiver.stderr.read()
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
        full_a, full_b = stats(a.c), stats(b.c)
        sa, sb = full_a["counters"], full_b["counters"]
        sent = np.frombuffer(a.c.read_bytes("/tmp/grads.f32"), dtype=np.float32)
        got = b.c.read_bytes("/tmp/got.f32")
    finally:
        for s in sites:
            s.c.run(["systemctl", "stop", UNIT])
    ratio = sa["egress_orig_bytes"] / max(1, sa["egress_wire_bytes"])
    print(f"two services: {sa['egress_compressed']} packets compressed on A, {sb['ingress_restored']} restored "
          f"on B, payload {sa['egress_orig_bytes']} -> {sa['egress_wire_bytes']} bytes ({ratio:.2f}x)")
    assert sent.nbytes == 4 << 20
    assert sa["flows_negotiated"] == 1 and sb["flows_negotiated"] == 1
    # gso = "auto" with the unit's CAP_NET_RAW: the fast path runs (super-packets, raw socket)
    assert full_a["config"]["gso"] is True and full_b["config"]["gso"] is True
    # super-packets compressed: through the raw socket (v2, the default) or as v3 trains
    assert sa["gso_super_packets"] + sa["egress_trains"] > 0 and sa["gso_send_errors"] == 0, sa
    assert sa["egress_compressed"] > 0
    assert sb["ingress_restored"] == sa["egress_compressed"]
    assert_went_compressed(sa, sent.nbytes, "between the two services")
    assert sb["ingress_orig_bytes"] == sa["egress_orig_bytes"]
    assert sa["egress_wire_bytes"] < sa["egress_orig_bytes"]
    # the shim's default mark: codec 2, one power of two per super-packet (where those are cut
    # depends on timing), so each value is within 2^-6 of the largest sent, and lossy
    y = np.frombuffer(got, np.float32)
    assert y.size == sent.size and not np.array_equal(y, sent), "lossy codec: equal means never compressed"
    err = np.abs(y.astype(np.float64) - sent)
    assert err.max() <= 2.0 ** -6 * np.abs(sent).max(), err.max()
    assert np.sum(err ** 2) / np.sum(sent.astype(np.float64) ** 2) < 0.01
    assert not np.array_equal(y, recon(sent, -10)), "the paper's codec: the mark did not pick codec 2"
    for key in ("drop_crc", "drop_header", "drop_checksum", "drop_decode", "drop_malformed", "drop_too_big"):
        assert sb[key] == 0, (key, sb)


def test_reinstall_then_uninstall(sites, wheelhouse):
    """Installing again over a running service: a fresh venv, the operator's config kept, the
    service restarted onto it. Then make uninstall-service with the service running: no rule of
    ours in any table (the persistent drop included), no unit, no /opt/inceptionn, no link; the
    config stays."""
    a = sites[0]
    c = a.c
    guide(c, f"systemctl enable --now {UNIT}")
    wait_for("the queue rules", lambda: queue_rules(a.host), c=c)
    pid = main_pid(c)
    set_setting(c, "log_level", '"debug"')
    c.run(["touch", "/opt/inceptionn/stale-file"])
    guide(c, f"make install-service WHEELHOUSE={wheelhouse}")
    assert c.run(["test", "-e", "/opt/inceptionn/stale-file"]).returncode != 0  # a fresh venv
    assert 'log_level = "debug"' in c.read_bytes(CONFIG).decode()
    wait_for("the restarted service", lambda: main_pid(c) not in (0, pid), c=c)
    wait_for("the stats socket", lambda: c.run(["inceptionn", "stats"]).returncode == 0, c=c)

    guide(c, "make uninstall-service")
    assert our_rules(a.host) == []
    assert c.run(["systemctl", "is-enabled", UNIT]).returncode != 0
    assert c.run(["systemctl", "is-active", UNIT]).stdout.strip() in ("inactive", "unknown")
    for gone in ("/opt/inceptionn", "/etc/systemd/system/inceptionn-nicd.service", "/usr/local/bin/inceptionn"):
        assert c.run(["test", "-e", gone]).returncode != 0, gone
    assert c.run(["test", "-f", CONFIG]).returncode == 0


def test_readme_two_hosts_is_the_guide():
    """The README's "Two hosts" commands are the guide's, so the steps this module runs in the
    containers are the ones a newcomer copies from the README (install offline here: the
    containers have no network, so the guide's WHEELHOUSE form of `make install-service`)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Two hosts\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("  #", 1)[0].rstrip() for line in block.splitlines() if line.strip()]
    assert len(commands) >= 5
    for command in commands:
        assert command in GUIDE, f"README's Two hosts step is not in docs/deploy.md: {command}"
