"""Wire format v3 end to end (``inceptionn nicd --gso --trains``; docs/wire-format.md, "Segment
trains"): real TSO super-packets compressed into one train each, handed back in the egress verdict
and cut by the sender's kernel, merged again by the receiver's GRO (the testbed turns it on at
every host's veth), each merged train restored in one verdict. Real netfilter and TCP in testbed namespaces; the helpers
are tests/test_nicd.py's. Every test here fails on a new WARN or BUG line in the kernel log.
Needs root.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from test_nicd import (DROPS, Transfer, add_counting_rule, assert_restored_or_raw, count_raw_tagged,
                       fell_back_lines, iptables_save, make_testbed, nicd_transfer, raw_sent, recon, rule_counts,
                       running_nicd, transfer)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")

KERNEL_TROUBLE = re.compile(r"WARNING: CPU:|\bBUG:|cut here")


def kernel_log() -> list[str]:
    return subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout.splitlines()


@pytest.fixture(autouse=True)
def kernel_log_stays_clean():
    """Rule 7: nothing the daemons do may leave the kernel warning."""
    before = len(kernel_log())
    yield
    new = [line for line in kernel_log()[before:] if KERNEL_TROUBLE.search(line)]
    assert not new, "the kernel warned:\n" + "\n".join(new)


@pytest.mark.parametrize("mtu,family", [(1500, 4), (9000, 4), (1500, 6)])
def test_v3_stream_equals_reconstruction_in_trains(tmp_path, small, mtu, family):
    """A 2 MiB tagged stream through two --trains daemons: what arrives is the codec's
    roundtrip (raw only where TCP re-cut a piece too short to shrink), the sender's super-packets
    left as trains in their verdicts, the receiver restored merged trains, nothing dropped."""
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=mtu, ipv6=family == 6) as tb:
        h1, h2 = tb.hosts
        src = h1.ip6 if family == 6 else h1.ip
        add_counting_rule(h2, "data", "-s", src, "-p", "tcp", "-m", "length", "--length", "100:65535", family=family)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, "--gso", "--trains", tag="v3",
                                         family=family)
        packets = rule_counts(h2, "data", family=family)[0]
    assert_restored_or_raw(got, small.tobytes(), want, raw, f"v3, MTU {mtu}, IPv{family}")
    assert c1["flows_negotiated"] == 1 and c2["flows_negotiated"] == 1
    assert c1["egress_trains"] > 0 and c1["egress_orig_bytes"] > 0.9 * small.nbytes, c1
    # every compressed segment restored, most in trains (the rest leave as v2: lone segments, skbs
    # that are no GSO skb, and super-packets that compress into one segment: 9 of 75 at MTU 9000)
    assert 0.9 * c1["egress_compressed"] < c2["ingress_restored"] <= c1["egress_compressed"], (c1, c2)
    assert c2["ingress_train_segments"] > 0.5 * c1["egress_compressed"], (c1, c2)
    assert c2["ingress_orig_bytes"] == c1["egress_orig_bytes"]
    assert c2["ingress_wire_bytes"] == c1["egress_wire_bytes"] < c1["egress_orig_bytes"]
    for key in DROPS + ("drop_train_tail",):
        assert c2[key] == 0, (key, c2)
    assert c2["verdict_errors"] == 0 and c1["verdict_errors"] == 0
    # GRO merged the segments of a train (or the veth passed it whole): fewer packets reached the
    # receiver's queue than the sender's kernel cut; each segment counts as restored
    assert c2["ingress_packets"] < c2["ingress_train_segments"] <= c2["ingress_restored"], c2
    print(f"MTU {mtu} IPv{family}: {c1['egress_trains']} trains, {c1['egress_compressed']} segments, "
          f"{c2['ingress_packets']} packets through the receiver's queue, {packets} data packets on the wire")


def test_v3_sender_with_small_tcp_maxseg_cuts_trains_where_its_kernel_does(tmp_path, small):
    """The sending socket sets TCP_MAXSEG 1001 before connect, the peer's SYN-ACK says 1460: the
    sender's kernel cuts each super-packet every 989 bytes (1001 less 12 of timestamps), which
    nicd must guess from the smaller of the two handshake MSS options, not the peer's alone
    (that guess was 1448). A veth hands a GSO skb on whole, so here the sender's eth0 has TSO
    off (its kernel then cuts the train in software, as a real NIC's TSO would in hardware) and
    the receiver's GRO off: every segment arrives alone, and one cut anywhere else would start
    without its header and be dropped. None is, and every segment of every train restores."""
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        h1.run(["ethtool", "-K", "eth0", "tso", "off"], check=True, capture_output=True)
        h2.run(["ethtool", "-K", "eth0", "gro", "off"], check=True, capture_output=True)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, "--gso", "--trains", tag="v3",
                                         mss=1001)
    assert_restored_or_raw(got, small.tobytes(), want, raw, "v3, TCP_MAXSEG 1001")
    assert c1["egress_trains"] > 0 and c1["egress_orig_bytes"] > 0.9 * small.nbytes, c1
    for key in DROPS + ("drop_train_tail",):
        assert c2[key] == 0, (key, c2)
    # nothing merged them: each restored packet is one segment (a v3 one, or a lone v2 packet),
    # and every compressed byte the sender sent came through
    assert 0 < c2["ingress_train_segments"] <= c2["ingress_restored"] == c1["egress_compressed"], (c1, c2)
    assert c2["ingress_packets"] >= c2["ingress_restored"], c2   # one queue pass per segment
    assert c2["ingress_orig_bytes"] == c1["egress_orig_bytes"]


def test_v3_peer_without_trains_gets_v2(tmp_path, small):
    """A receiver without --trains (a v2 soft NIC) says nothing of trains in its hello: the
    sender sends it v2 packets through the raw socket, and the stream arrives as the roundtrip."""
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        count_raw_tagged(h2)
        with running_nicd(h1, tmp_path, "--gso", "--trains", tag="v3") as d1, \
                running_nicd(h2, tmp_path, "--gso", "--no-trains", tag="v2") as d2:
            got = transfer(h1, h2, small.tobytes(), tmp_path)
            c1, c2 = d1.counters(), d2.counters()
        raw = raw_sent(h2, c1)
    assert_restored_or_raw(got, small.tobytes(), want, raw, "v3 sender, v2 receiver")
    assert c1["flows_negotiated"] == 1 and c1["egress_trains"] == 0 and c2["ingress_train_segments"] == 0
    assert c2["ingress_restored"] > 0 and all(c2[k] == 0 for k in DROPS), c2


def test_v3_receiver_killed_and_rules_removed_fails_closed_then_raw(tmp_path, small):
    """The receiver's nicd is killed mid-stream and every rule in its namespace removed (the
    fail-closed drop too): the trains then reach a TCP stack without a soft NIC, which drops
    every segment for its wire seq (2^31 from any window it could accept). Not one compressed
    byte reaches the application: everything sent after the kill arrives as the original, byte
    for byte, once the sender's nicd has given the flow up and sent it raw."""
    data = small.tobytes()
    want = recon(small, -10).tobytes()
    half = len(data) // 2
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        count_raw_tagged(h2)
        with running_nicd(h1, tmp_path, "--gso", "--trains", tag="v3s") as d1, \
                running_nicd(h2, tmp_path, "--gso", "--trains", tag="v3r") as d2:
            t = Transfer(h1, h2, data, tmp_path, pause_at=half, timeout=150)
            try:
                t.wait_paused()
                t.wait_received(half)
                before = d1.counters()
                raw_before = raw_sent(h2, before)
                first = t.received()
                d2.kill()
                for table in ("raw", "mangle"):  # nothing of nicd's is left: no queue, no drop
                    h2.run(["iptables", "-w", "5", "-t", table, "-F"], check=True)
                assert "NFQUEUE" not in iptables_save(h2) and "DROP" not in iptables_save(h2)
                add_counting_rule(h2, "compressed", "-p", "tcp", "-m", "dscp", "--dscp", "11")
                t.go.write_text("go")
                got = t.finish(timeout=150)
                c1 = d1.counters()
                arrived_compressed = rule_counts(h2, "compressed")[0]
                lines = fell_back_lines(d1)
            finally:
                t.close()
    assert len(got) == len(data)
    assert_restored_or_raw(first, data[:half], want[:half], raw_before, "before the kill")
    assert got[:half] == first
    assert got[half:] == data[half:], "bytes sent after the kill must arrive as the original"
    assert before["egress_trains"] > 0 and c1["egress_trains"] > before["egress_trains"], (before, c1)
    assert arrived_compressed > 0  # compressed segments did reach the stack, which dropped them
    assert c1["flows_fell_back"] == 1 and len(lines) == 1, (c1, lines)
