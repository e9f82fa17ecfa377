"""The soft NIC's GSO fast path (``inceptionn nicd --gso``, issue 12), end to end: real TSO
super-packets from the sender's TCP through the egress queue, compressed packets sent through
the daemon's raw socket, restored at the receiver into segments larger than the MSS. Real
netfilter and TCP in testbed namespaces; the helpers are tests/test_nicd.py's.

What must arrive is what the codec's roundtrip gives, bit for bit, as without gso; untagged
traffic arrives byte for byte. Needs root.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from test_nicd import (add_counting_rule, assert_words_equal, make_testbed, recon, rule_counts,
                       running_nicd, transfer)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")

DROPS = ("drop_crc", "drop_header", "drop_checksum", "drop_decode", "drop_malformed", "drop_too_big")


@pytest.fixture(scope="module")
def grads() -> np.ndarray:
    """Real gradients (~3 MB of float32), scaled as in tests/test_nicd.py."""
    from inceptionn.train.gradients import gradient_sample
    return (gradient_sample(1) * np.float32(16)).astype(np.float32)


@pytest.fixture(scope="module")
def small(grads) -> np.ndarray:
    return np.ascontiguousarray(grads[: 512 * 1024])  # 2 MiB


def wire_run(tmp_path, x, mtu, *flags, tag=""):
    """One tagged transfer h1 -> h2 with nicd (and ``flags``) on both; returns what arrived, both
    daemons' counters and the data packets h2 saw arrive from h1 (counted on its wire side)."""
    with make_testbed(mtu=mtu) as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "data", "-s", h1.ip, "-p", "tcp", "-m", "length", "--length", "100:65535")
        add_counting_rule(h2, "compressed", "-s", h1.ip, "-p", "tcp", "-m", "dscp", "--dscp", "11")
        with running_nicd(h1, tmp_path, *flags, tag=tag) as d1, running_nicd(h2, tmp_path, *flags, tag=tag) as d2:
            got = transfer(h1, h2, x.tobytes(), tmp_path)
            c1, c2 = d1.counters(), d2.counters()
        return got, c1, c2, rule_counts(h2, "data")[0], rule_counts(h2, "compressed")[0]


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_gso_stream_equals_reconstruction_with_fewer_packets(tmp_path, small, mtu):
    want = recon(small, -10).tobytes()
    got, c1, c2, packets, compressed = wire_run(tmp_path, small, mtu, "--gso", tag="gso")
    assert_words_equal(got, want, f"gso, MTU {mtu}")
    assert c1["gso_super_packets"] > 0, c1
    assert c1["gso_send_errors"] == 0, c1
    assert c1["flows_negotiated"] == 1 and c2["flows_negotiated"] == 1
    assert c1["egress_orig_bytes"] > 0.9 * small.nbytes
    assert c2["ingress_restored"] == c1["egress_compressed"] <= compressed
    assert c2["ingress_orig_bytes"] == c1["egress_orig_bytes"]
    assert c2["ingress_wire_bytes"] == c1["egress_wire_bytes"] < c1["egress_orig_bytes"]
    # restored segments larger than the MSS: fewer of them than the bytes need at the MSS
    assert c2["ingress_restored"] < c1["egress_orig_bytes"] / (mtu - 52), c2
    for key in DROPS:
        assert c2[key] == 0, (key, c2)

    # the same stream without gso: one compressed packet per MSS segment
    got0, c1_0, _, packets0, _ = wire_run(tmp_path, small, mtu, tag="plain")
    assert_words_equal(got0, want, f"no gso, MTU {mtu}")
    assert c1_0["gso_super_packets"] == 0
    print(f"MTU {mtu}: {packets / small.nbytes * 1e6:.0f} data packets per MB with gso, "
          f"{packets0 / small.nbytes * 1e6:.0f} without")
    assert packets < 0.6 * packets0, (packets, packets0)


def test_gso_random_loss(tmp_path, small):
    """2% loss on the receiver's wire side, before its daemon: lost compressed packets; TCP's
    retransmissions come as other super-packets (other boundaries) and are compressed again."""
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        h2.run(["iptables", "-w", "5", "-t", "raw", "-A", "PREROUTING", "-i", h2.ifname, "-p", "tcp",
                "-m", "statistic", "--mode", "random", "--probability", "0.02", "-m", "comment",
                "--comment", "nt-loss", "-j", "DROP"], check=True)
        with running_nicd(h1, tmp_path, "--gso") as d1, running_nicd(h2, tmp_path, "--gso") as d2:
            got = transfer(h1, h2, small.tobytes(), tmp_path)
            c1, c2 = d1.counters(), d2.counters()
        lost = rule_counts(h2, "loss")[0]
    assert lost > 0, "the loss rule dropped nothing"
    assert_words_equal(got, recon(small, -10).tobytes(), "gso with 2% loss")
    assert c1["gso_super_packets"] > 0
    assert c1["egress_compressed"] > c2["ingress_restored"] > 0
    assert c2["drop_crc"] == c2["drop_checksum"] == c2["drop_header"] == 0


def tcp_ext(host, name: str) -> int:
    """A TcpExt counter of the host's network namespace (/proc/net/netstat)."""
    text = host.run(["cat", "/proc/net/netstat"], capture_output=True, text=True, check=True).stdout
    lines = [line.split() for line in text.splitlines() if line.startswith("TcpExt:")]
    return int(dict(zip(lines[0], lines[1]))[name])


def test_gso_reordering(tmp_path, small):
    """The sender's link reorders: 10% of its TCP packets (compressed ones included) go through a
    slow HTB class while the rest pass, so compressed packets of one super-packet and of several
    arrive out of order (the receiver's TCP counts out-of-order segments); each restores alone."""
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        dev = h1.ifname
        for cmd in (["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
                    ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
                    ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "50mbit"],
                    ["iptables", "-w", "5", "-t", "mangle", "-A", "OUTPUT", "-o", dev, "-p", "tcp", "-m", "statistic",
                     "--mode", "random", "--probability", "0.1", "-j", "CLASSIFY", "--set-class", "1:20"]):
            h1.run(cmd, check=True, capture_output=True)
        ofo0 = tcp_ext(h2, "TCPOFOQueue")
        with running_nicd(h1, tmp_path, "--gso") as d1, running_nicd(h2, tmp_path, "--gso") as d2:
            got = transfer(h1, h2, small.tobytes(), tmp_path)
            c1, c2 = d1.counters(), d2.counters()
        ofo = tcp_ext(h2, "TCPOFOQueue") - ofo0
    assert ofo > 0, "nothing arrived out of order"
    assert_words_equal(got, recon(small, -10).tobytes(), "gso with reordering")
    assert c1["gso_super_packets"] > 0
    assert c2["ingress_restored"] > 0 and all(c2[k] == 0 for k in DROPS), c2


def test_gso_untagged_untouched(tmp_path, small):
    data = small.tobytes()
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "marked", "-p", "tcp", "-m", "dscp", "!", "--dscp", "0")
        with running_nicd(h1, tmp_path, "--gso") as d1, running_nicd(h2, tmp_path, "--gso") as d2:
            before1, before2 = d1.counters(), d2.counters()
            got = transfer(h1, h2, data, tmp_path, tos=0)
            after1, after2 = d1.counters(), d2.counters()
        assert rule_counts(h2, "marked") == (0, 0)
    assert got == data
    assert after1 == before1, "the sender's daemon saw untagged traffic"
    assert after2["ingress_packets"] == before2["ingress_packets"]


def test_gso_peer_without_daemon_stays_raw(tmp_path, small):
    """Super-packets of a flow not negotiated leave unchanged: the kernel segments them after
    the hook, and they arrive byte for byte."""
    data = small.tobytes()
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path, "--gso") as d1:
            got = transfer(h1, h2, data, tmp_path)
            c1 = d1.counters()
    assert got == data
    assert c1["egress_raw_not_negotiated"] > 0 and c1["egress_compressed"] == 0


def test_gso_without_cap_net_raw_refused_in_one_line(tmp_path):
    """The raw socket needs CAP_NET_RAW: without it nicd --gso refuses to start, one line, exit 2,
    and leaves no queue rule behind."""
    from test_nicd import INC, iptables_save
    with make_testbed(mtu=1500) as tb:
        h1 = tb.hosts[0]
        r = h1.run(["capsh", "--drop=cap_net_raw", "--", "-c",
                    f"{INC} nicd -i {h1.ifname} --gso --socket {tmp_path / 'x.sock'}"],
                   capture_output=True, text=True, timeout=60)
        saved = iptables_save(h1)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "inceptionn: error: gso: cannot open a raw IP socket (needs CAP_NET_RAW): Operation not permitted"]
    assert "NFQUEUE" not in saved
