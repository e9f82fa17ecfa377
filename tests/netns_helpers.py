"""Helpers of the tests that build network namespaces (real kernel, root only): the skip
marker, the leak snapshot that conftest.py's fixtures compare, and iperf3/ping measurements.

Every namespace the tests create is named with SESSION_TAG, so leak checks only look at our own
objects even when another test run shares the machine.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from inceptionn.kernel_tc import netns as ns

# short and unique per run: testbed names end up in namespace names
SESSION_TAG = f"t{os.getpid() % 100000}"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "iptables", "iperf3", "ping")),
    reason="needs root and ip, iptables, iperf3, ping (real network namespaces)",
)


# --- leak checks -------------------------------------------------------------------------------

def _root_links() -> set[str]:
    with ns.ipr() as ipr:
        return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}


def _root_qdiscs() -> set[tuple]:
    with ns.ipr() as ipr:
        return {(q["index"], q["handle"], q["parent"], q.get_attr("TCA_KIND")) for q in ipr.get_qdiscs()}


def _root_inceptionn_rules() -> list[str]:
    """Our rules in the root namespace, both families (ip6tables' prefixed with "ip6 ")."""
    found = []
    for tool, tag in (("iptables-save", ""), ("ip6tables-save", "ip6 ")):
        if shutil.which(tool):
            out = subprocess.run([tool], capture_output=True, text=True).stdout
            found += [tag + line for line in out.splitlines() if "inceptionn" in line]
    return found


def _another_live_run(name: str) -> bool:
    """A namespace named for a process (inc-t<pid>_..., inc-nt<pid>_..., inc-bnic<pid>-...) that
    is alive and is not this run: another test run or benchmark sharing the machine. One that a
    child of ours leaked names a process that has exited, so it still counts."""
    m = re.match(r"inc-[a-z]+(\d+)", name)
    if not m or int(m[1]) == os.getpid() % 100000:
        return False
    return os.path.exists(f"/proc/{int(m[1])}")


def snapshot() -> dict:
    return {
        "netns": ns.list_netns(f"inc-{SESSION_TAG}"),
        # every testbed's namespaces, also those of benchmarks that name their own (bnic<pid>, bar<pid>)
        "all_netns": [n for n in ns.list_netns("inc-") if not _another_live_run(n)],
        "root_links": _root_links(),
        "root_qdiscs": _root_qdiscs(),
        "root_rules": _root_inceptionn_rules(),  # iptables and ip6tables
    }


# --- measuring --------------------------------------------------------------------------------

def iperf3(client, server, seconds: float, *extra: str) -> dict:
    """iperf3 from client to server host; returns {"client": ..., "server": ...} -J reports.

    -O 1 leaves out the first second (slow start, the shaper's initial burst). -C cubic: a
    loss-based sender keeps the bottleneck queue busy; the machine's default BBR estimates a
    ~5 us minimum RTT on these delay-free links and leaves a 10 Mbit link idle now and then,
    which measures BBR rather than the link.
    """
    srv = server.popen(["iperf3", "-s", "-1", "-J", "-B", server.ip], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 5
        while True:  # wait until the server listens instead of sleeping a fixed time
            probe = server.run(["ss", "-Htln", "sport", "= :5201"], capture_output=True, text=True)
            if probe.stdout.strip() or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        proc = client.run(["iperf3", "-c", server.ip, "-t", str(seconds), "-O", "1", "-J",
                           "-C", "cubic", *extra], capture_output=True, text=True,
                          timeout=seconds + 30)
        report = json.loads(proc.stdout)
        assert "error" not in report, report.get("error")
        server_out, _ = srv.communicate(timeout=10)
        return {"client": report, "server": json.loads(server_out)}
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def received_bps(result: dict) -> float:
    """Receiver-side throughput (bit/s): the server's whole one-second intervals after the
    omitted one.

    iperf3's end summary also counts the last few tens of milliseconds, after the sender
    stopped and before the end-of-test message arrived, when the link is no longer full; at
    10 Mbit that alone moves the figure by up to 0.5%, and more on a busy machine, while every
    whole interval reads the same to 0.01%.
    """
    full = [i["sum"] for i in result["server"]["intervals"]
            if not i["sum"].get("omitted") and i["sum"]["seconds"] > 0.9]
    assert full, "iperf3 reported no whole interval"
    return sum(i["bytes"] for i in full) * 8 / sum(i["seconds"] for i in full)


def summary_bps(result: dict) -> float:
    """iperf3's own receiver-side end summary (bit/s), for comparison."""
    return result["client"]["end"]["sum_received"]["bits_per_second"]


def ping_loss(src, dst_ip: str, count: int) -> tuple[int, int]:
    """Flood-ping dst_ip from host src; returns (transmitted, received)."""
    proc = src.run(["ping", "-f", "-q", "-c", str(count), "-W", "1", dst_ip],
                   capture_output=True, text=True, timeout=60)
    for line in proc.stdout.splitlines():
        if "packets transmitted" in line:
            parts = line.split(",")
            return int(parts[0].split()[0]), int(parts[1].split()[0])
    raise AssertionError(f"no ping summary: {proc.stdout} {proc.stderr}")


def wait_until(pred, timeout: float = 10.0, step: float = 0.05) -> bool:
    """Poll ``pred`` until it holds (True) or ``timeout`` seconds pass (False): for counters and
    logs that a daemon updates a little after the event a test caused."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True
