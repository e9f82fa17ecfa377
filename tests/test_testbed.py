"""The namespace testbed on the real kernel: rates measured by iperf3, reachability, isolation,
the CLI, and teardown that leaves nothing behind (also after a crash). Needs root."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from cli_helpers import assert_one_line_error, run_cli
from netns_helpers import iperf3, needs_root, ping_loss, received_bps, summary_bps
from inceptionn.errors import UserError
from inceptionn.kernel_tc import link, lossrules
from inceptionn.kernel_tc import netns as ns
from inceptionn.kernel_tc import testbed
from inceptionn.kernel_tc.testbed import teardown
# testbed.Testbed is used through its module: a module-level name starting with "Test" would
# make pytest try to collect it as a test class.

pytestmark = needs_root

# Measured TCP goodput against the TCP ideal of the set rate (the rate counts whole frames):
# never above it (shaping in effect), and at least FLOOR of it. A units mistake (mbit vs mbps,
# bits vs bytes) is a factor of 8 or more; the floor leaves room for a loaded 2-core machine
# (a 95%-of-rate floor failed at 94.5% with load average 7.5: TCP's own ceiling is 95.6%).
FLOOR = 0.90


# --- throughput ------------------------------------------------------------------------------------

# (rate, mtu, seconds measured after the omitted first second)
THROUGHPUT_CASES = [
    ("10mbit", 1500, 3), ("10mbit", 9000, 3),
    ("100mbit", 1500, 3), ("100mbit", 9000, 3),
    ("1gbit", 1500, 3), ("1gbit", 9000, 3),
]


@pytest.mark.parametrize("rate,mtu,seconds", THROUGHPUT_CASES, ids=[f"{r}-mtu{m}" for r, m, _ in THROUGHPUT_CASES])
def test_throughput_matches_rate(rate, mtu, seconds, tb_name, no_leaks):
    with testbed.Testbed(hosts=2, rate=rate, mtu=mtu, name=tb_name) as tb:
        h1, h2 = tb.hosts
        result = iperf3(h1, h2, seconds)
        measured = received_bps(result)
        set_bps = tb.rate_bps
        # The rate counts whole Ethernet frames, as tc does; TCP payload is a bit less
        # (1448 of 1514 bytes at MTU 1500, 8948 of 9014 at 9000), the rest is headers.
        ideal = set_bps * (mtu - 52) / (mtu + 14)
        print(f"\n{rate} mtu {mtu}: set {set_bps / 1e6:.1f} Mbit/s, measured {measured / 1e6:.2f} Mbit/s "
              f"({measured / set_bps:.2%} of the rate, {measured / ideal:.2%} of the TCP ideal; "
              f"iperf3 end summary {summary_bps(result) / 1e6:.2f})")
        assert measured >= FLOOR * ideal, (measured, ideal)
        assert measured <= ideal * 1.03, "faster than the link allows: shaping is not in effect"


# --- reachability and isolation ----------------------------------------------------------------------

def test_hosts_reach_each_other_and_nothing_else(tb_name, no_leaks):
    with testbed.Testbed(hosts=3, rate="100mbit", name=tb_name) as tb:
        assert [h.ip for h in tb.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
        for src in tb.hosts:
            for dst in tb.hosts:
                if src is not dst:
                    src.run(["ping", "-c1", "-W2", dst.ip], check=True, capture_output=True)
            # loopback is up
            src.run(["ping", "-c1", "-W2", "127.0.0.1"], check=True, capture_output=True)
            # no route out of the testbed prefix: `ip route get` asks the kernel, sends nothing
            for outside in ("198.51.100.1", "8.8.8.8", "198.18.1.1", *_root_addresses()):
                proc = src.run(["ip", "route", "get", outside], capture_output=True, text=True)
                assert proc.returncode != 0 and "unreachable" in proc.stderr.lower(), (outside, proc.stdout)
            routes = src.run(["ip", "-4", "route", "show"], capture_output=True, text=True).stdout
            assert routes.strip().splitlines() == [f"198.18.0.0/24 dev eth0 proto kernel scope link src {src.ip}"]


def _root_addresses() -> list[str]:
    with ns.ipr() as ipr:
        return [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=2)
                if not a.get_attr("IFA_ADDRESS").startswith("127.")]


def test_links_are_shaped_both_ways_and_mtu_set(tb_name, no_leaks):
    with testbed.Testbed(hosts=2, rate="10mbit", mtu=9000, name=tb_name) as tb:
        for h in tb.hosts:
            host_side = link.show(h.ifname, netns=h.netns)
            switch_side = link.show(h.switch_port, netns=tb.switch)
            assert host_side.rate_bps == switch_side.rate_bps == 10_000_000
            assert host_side.burst_bytes >= 2 * 9014 - 2  # read back through kernel time units
            out = h.run(["ip", "-o", "link", "show", "eth0"], capture_output=True, text=True).stdout
            assert "mtu 9000" in out
            # a full-size jumbo frame passes unfragmented
            h.run(["ping", "-c1", "-W2", "-M", "do", "-s", str(9000 - 28),
                   tb.hosts[1].ip if h is tb.hosts[0] else tb.hosts[0].ip], check=True, capture_output=True)


def test_process_runs_inside_the_host_namespace(tb_name, no_leaks):
    with testbed.Testbed(hosts=2, name=tb_name) as tb:
        h1 = tb.hosts[0]
        inside = h1.run(["readlink", "/proc/self/ns/net"], capture_output=True, text=True, check=True).stdout.strip()
        st = os.stat(f"/run/netns/{h1.netns}")
        assert inside == f"net:[{st.st_ino}]"
        proc = h1.popen(["ip", "-o", "-4", "addr", "show", "eth0"], stdout=subprocess.PIPE, text=True)
        assert h1.ip in proc.communicate(timeout=10)[0]
        # hostname= gives the program its own UTS namespace; the machine's name is untouched
        assert h1.run(["hostname"], hostname="h1", capture_output=True, text=True).stdout.strip() == "h1"
        assert h1.run(["hostname"], capture_output=True, text=True).stdout.strip() == os.uname().nodename


def test_context_manager_cleans_up_when_block_raises(tb_name, no_leaks):
    with pytest.raises(RuntimeError):
        with testbed.Testbed(hosts=2, rate="10mbit", name=tb_name) as tb:
            tb.hosts[1].popen(["sleep", "300"], stdout=subprocess.DEVNULL)  # a process inside must not keep anything alive
            raise RuntimeError("boom")
    assert ns.list_netns(f"inc-{tb_name}-") == []


def test_up_over_existing_testbed_fails_clearly(tb_name, no_leaks):
    with testbed.Testbed(hosts=2, name=tb_name):
        with pytest.raises(UserError, match="inceptionn testbed down"):
            testbed.Testbed(hosts=3, name=tb_name).up()
        proc = run_cli("testbed", "up", "--hosts", "2", "--name", tb_name)
        assert_one_line_error(proc, "already exists", f"inceptionn testbed down --name {tb_name}")


def test_down_after_crashed_run(tb_name, no_leaks):
    # a run killed with SIGKILL inside the `with` block: no cleanup code ran at all
    code = (f"import os, signal\nfrom inceptionn.kernel_tc.testbed import Testbed\n"
            f"with Testbed(hosts=3, rate='10mbit', name={tb_name!r}) as tb:\n"
            f"    p = tb.hosts[0].popen(['sleep', '300'], stdout=-3, stderr=-3)\n"  # -3: DEVNULL
            f"    print(p.pid, flush=True)\n"
            f"    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    orphan = int(proc.stdout.split()[0])
    assert len(ns.list_netns(f"inc-{tb_name}-")) == 4
    # loss rules on a switch port are removed with the testbed too
    link.shape("h1", netns=f"inc-{tb_name}-sw", rate="10mbit", loss="1%")
    down = run_cli("testbed", "down", "--name", tb_name)
    assert down.returncode == 0, down.stderr
    assert ns.list_netns(f"inc-{tb_name}-") == []
    assert not _running(orphan), "a process left running in the testbed survived down"
    again = run_cli("testbed", "down", "--name", tb_name)  # idempotent
    assert again.returncode == 0 and "no testbed" in again.stdout


def _running(pid: int) -> bool:
    """Whether pid still runs (a zombie waiting for init to reap it does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_down_after_run_killed_during_up(tb_name, no_leaks):
    code = (f"import os, signal\nfrom inceptionn.kernel_tc.testbed import Testbed\n"
            f"def progress(msg):\n"
            f"    if 'host h2/' in msg: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"Testbed(hosts=3, rate='10mbit', name={tb_name!r}, progress=progress).up()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert ns.list_netns(f"inc-{tb_name}-")  # half-built
    assert_one_line_error(run_cli("testbed", "up", "--hosts", "2", "--name", tb_name), "already exists")
    assert run_cli("testbed", "down", "--name", tb_name).returncode == 0
    assert ns.list_netns(f"inc-{tb_name}-") == []


def test_failed_up_removes_partial_testbed(tb_name, no_leaks, monkeypatch):
    calls = {"n": 0}
    real_shape = link.shape

    def failing_shape(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # fail half-way through the second host
            raise RuntimeError("injected failure")
        return real_shape(*args, **kwargs)

    monkeypatch.setattr(link, "shape", failing_shape)
    with pytest.raises(RuntimeError, match="injected"):
        testbed.Testbed(hosts=3, rate="10mbit", name=tb_name).up()
    assert ns.list_netns(f"inc-{tb_name}-") == []


# --- loss through iptables -m statistic ------------------------------------------------------------

@pytest.mark.skipif(link.netem_available(), reason="this kernel has netem; loss goes through netem")
def test_loss_drops_about_the_requested_fraction(tb_name, no_leaks):
    with testbed.Testbed(hosts=2, rate="100mbit", name=tb_name) as tb:
        h1, h2 = tb.hosts
        # Wire-like loss: on the switch port toward h2 the drop is silent (bridged traffic).
        state = link.shape(h2.switch_port, netns=tb.switch, rate="100mbit", loss="20%")
        assert state.loss_method == "iptables-statistic" and state.rate_bps == 100_000_000
        sent, got = ping_loss(h1, h2.ip, 500)
        assert sent == 500
        assert 0.12 <= 1 - got / sent <= 0.28, (sent, got)
        # Loss on a host's own egress: its echo replies vanish (kernel-generated, no socket).
        link.shape(h1.ifname, netns=h1.netns, rate="100mbit", loss="20%")
        link.clear(h2.switch_port, netns=tb.switch)
        sent, got = ping_loss(h2, h1.ip, 500)
        assert 0.12 <= 1 - got / sent <= 0.28, (sent, got)
        assert len(lossrules.list_rules(h1.netns, "eth0")) == 2  # OUTPUT and FORWARD
        link.clear(h1.ifname, netns=h1.netns)
        assert lossrules.list_rules(h1.netns) == []
        assert ping_loss(h2, h1.ip, 200) == (200, 200)


# --- the CLI -------------------------------------------------------------------------------------------

def test_cli_up_status_exec_down(tb_name, no_leaks):
    try:
        up = run_cli("testbed", "up", "--hosts", "4", "--rate", "100mbit", "--name", tb_name, "--json")
        assert up.returncode == 0, up.stderr
        assert "host h4/4" in up.stderr  # progress goes to stderr, data to stdout
        bed = json.loads(up.stdout)
        assert [h["name"] for h in bed["hosts"]] == ["h1", "h2", "h3", "h4"]
        for i, h in enumerate(bed["hosts"], 1):
            assert h == {"name": f"h{i}", "netns": f"inc-{tb_name}-h{i}", "interface": "eth0",
                         "address": f"198.18.0.{i}", "prefixlen": 24, "mtu": 1500, "rate": "100mbit",
                         "rate_bps": 100_000_000, "switch_port": f"h{i}"}

        status = run_cli("testbed", "status", "--json", "--name", tb_name)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["testbeds"] == [bed]  # read back from the kernel
        assert tb_name in run_cli("testbed", "status").stdout

        ping = run_cli("testbed", "exec", "--name", tb_name, "h1", "--", "ping", "-c1", "-W2", "198.18.0.2")
        assert ping.returncode == 0 and "1 received" in ping.stdout
        code = run_cli("testbed", "exec", "--name", tb_name, "h2", "--", "sh", "-c", "exit 7")
        assert code.returncode == 7
        uts = run_cli("testbed", "exec", "--name", tb_name, "--uts", "h3", "--", "hostname")
        assert uts.stdout.strip() == "h3"
        assert_one_line_error(run_cli("testbed", "exec", "--name", tb_name, "h9", "--", "true"), "no host 'h9'")

        down = run_cli("testbed", "down", "--name", tb_name)
        assert down.returncode == 0 and "removed 5 namespaces" in down.stdout
        assert json.loads(run_cli("testbed", "status", "--json", "--name", tb_name).stdout)["testbeds"] == []
    finally:
        teardown(tb_name)


def test_cli_up_ipv6(tb_name, no_leaks):
    try:
        up = run_cli("testbed", "up", "--hosts", "2", "--ipv6", "--name", tb_name, "--json")
        assert up.returncode == 0, up.stderr
        assert [h["address6"] for h in json.loads(up.stdout)["hosts"]] == ["2001:2::1", "2001:2::2"]
        assert "2001:2::2" in run_cli("testbed", "status", "--name", tb_name).stdout
        ping = run_cli("testbed", "exec", "--name", tb_name, "h1", "--", "ping", "-6", "-c1", "-W2", "2001:2::2")
        assert ping.returncode == 0 and "1 received" in ping.stdout, ping.stdout + ping.stderr
    finally:
        teardown(tb_name)


@pytest.mark.parametrize("args,needle", [
    (["--hosts", "0"], "at least 1"),
    (["--hosts", "two"], "whole number"),
    (["--hosts", "2", "--rate", "fast"], "bad rate"),
    (["--hosts", "2", "--rate", "0"], "greater than zero"),
    (["--hosts", "2", "--mtu", "40"], "bad MTU"),
    (["--hosts", "2", "--prefix", "10.0.0.0/24"], "198.18.0.0/15"),
    (["--hosts", "300"], "room for 254 hosts"),
    (["--hosts", "2", "--name", "a-b"], "bad testbed name"),
])
def test_cli_up_rejects_bad_values(args, needle, tb_name, no_leaks):
    if "--name" not in args:
        args = [*args, "--name", tb_name]
    assert_one_line_error(run_cli("testbed", "up", *args), needle)
    assert ns.list_netns(f"inc-{tb_name}-") == []
