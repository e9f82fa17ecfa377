"""The soft NIC between real hosts and routers (issue 19, items 3-7): NAT on the sender, an MSS
clamp or a small hop that drops ICMP "fragmentation needed", policy routing by mark or protocol,
a stateful firewall on the router, a qdisc that drops. Real netfilter, routing and TCP in
namespaces; most on a routed topology (``routed``: host a - router r - host b).

A flow must never hang because of the soft NIC: either its compressed packets go where the
original would have gone, or the flow goes raw (counted, logged once) and costs speed only.
Needs root.
"""
from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import pytest

from test_nicd import (DROPS, V2_GSO, add_counting_rule, assert_restored_or_raw, count_raw_tagged, fell_back_lines,
                       nicd_transfer, raw_sent, recon, rule_counts, running_nicd, transfer)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")

A_NET, B_NET, VIP_NET = "198.18.1", "198.18.2", "198.18.3"   # RoutedTestbed's /24s of h1, h2
VIP = f"{VIP_NET}.10"      # a service address that a's NAT maps to b (Kubernetes' ClusterIP)
DEAD_GW = f"{A_NET}.253"   # a gateway nobody answers for


@dataclass
class Routed:
    a: object  # testbed.Host h1: 198.18.1.2 on eth0
    r: object  # the router: port h1 198.18.1.1 (toward a), h2 198.18.2.1 (toward b)
    b: object  # h2: 198.18.2.2 on eth0


@contextlib.contextmanager
def routed(name: str, mtu_rb: int = 1500, mtu_b: int | None = None):
    """kernel_tc.testbed.RoutedTestbed with two hosts (a = h1, b = h2, the router between them),
    and b's side narrowed: mtu_rb on the router's port toward b (the hop a's packets must fit),
    mtu_b on b's own interface (default mtu_rb). Removed on exit."""
    from inceptionn.kernel_tc import netns as ns
    from inceptionn.kernel_tc.testbed import RoutedTestbed

    with RoutedTestbed(hosts=2, mtu=1500, name=name) as tb:
        a, b = tb.hosts
        for netns, ifname, mtu in ((tb.router.netns, b.switch_port, mtu_rb), (b.netns, b.ifname, mtu_b or mtu_rb)):
            with ns.ipr(netns) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], mtu=mtu)
        yield Routed(a, tb.router, b)


def iptables(host, *args):
    host.run(["iptables", "-w", "5", *args], check=True, capture_output=True)


def assert_clean_compressed_run(c1, c2, d1):
    """Every compressed packet a's daemon sent arrived and was restored, its super-packets sent as
    v3 trains in their verdicts or (one segment, or --no-trains) through the raw socket, and the
    flow never had to give up compressing, nor its trains."""
    assert c1["flows_negotiated"] == 1 and c1["gso_super_packets"] + c1["egress_trains"] > 0, c1
    assert c1["flows_trains_gave_up"] == 0, c1
    assert c1["flows_fell_back"] == 0 and not fell_back_lines(d1), d1.log_text()
    assert c1["gso_send_errors"] == 0, c1
    assert c2["ingress_restored"] == c1["egress_compressed"] > 0, (c1, c2)
    for key in DROPS:
        assert c2[key] == 0, (key, c2)


def assert_clean_transfer(t, tmp_path, small, what, nicd_flags=(), **kw):
    """``small`` a -> b with nicd on both (``nicd_flags``), through what the test set up (``kw``
    for transfer): it arrives as the reconstruction (or raw, within raw_sent's bound) and the run
    was clean. Returns the daemons' counters (a's, b's)."""
    count_raw_tagged(t.b)
    with running_nicd(t.a, tmp_path, *nicd_flags) as d1, running_nicd(t.b, tmp_path, *nicd_flags) as d2:
        got = transfer(t.a, t.b, small.tobytes(), tmp_path, **kw)
        c1, c2 = d1.counters(), d2.counters()
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw_sent(t.b, c1), what)
    assert_clean_compressed_run(c1, c2, d1)
    return c1, c2


# --- 3. NAT on the sender ------------------------------------------------------------------------

def test_dnat_on_the_sender_compressed_packets_take_the_connection(tb_name, tmp_path, small):
    """a reaches b through a service address that a's own NAT maps (nat OUTPUT DNAT, as
    kube-proxy does). The compressed packets must be NATed as the connection's own, not as a new
    connection with fresh source ports that b answers with RSTs."""
    with routed(tb_name) as t:
        iptables(t.a, "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p", "tcp", "-j", "DNAT", "--to-destination", t.b.ip)
        add_counting_rule(t.a, "rst", "-p", "tcp", "--tcp-flags", "RST", "RST")
        assert_clean_transfer(t, tmp_path, small, "through a's DNAT", dest=VIP, timeout=40)
        rsts = rule_counts(t.a, "rst")[0]
    assert rsts == 0


def test_dnat_on_the_sender_trains_of_one_segment_leave_as_v2(tb_name, tmp_path, small):
    """With trains, a GSO skb that compresses into one segment cannot be a train (the kernel drops
    a GSO skb no longer than its gso_size) and leaves by the raw socket, whose packets enter a's
    conntrack again. Sent as a v3 segment (seq 2^31 from the original) conntrack found it INVALID,
    NAT passed it by, and it left for the service address and was lost: in about one run in ten of
    the test above with trains on, where only the few small GSO skbs (resends, the ends of
    writes) are such. It leaves as v2, at its original seq. Writes of 2 MSS (1,448 bytes here)
    that compress about 3x make every skb one of them."""
    with routed(tb_name) as t:
        iptables(t.a, "-t", "nat", "-A", "OUTPUT", "-d", VIP, "-p", "tcp", "-j", "DNAT", "--to-destination", t.b.ip)
        iptables(t.a, "-t", "mangle", "-A", "POSTROUTING", "-m", "conntrack", "--ctstate", "INVALID",
                 "-m", "comment", "--comment", "nt-invalid")
        add_counting_rule(t.a, "rst", "-p", "tcp", "--tcp-flags", "RST", "RST")
        c1, _ = assert_clean_transfer(t, tmp_path, small[:131072], "through a's DNAT in writes of 2 MSS", nicd_flags=("--trains",),
                                      dest=VIP, timeout=40, extra=("--write", 2 * 1448))
        invalid, rsts = rule_counts(t.a, "invalid", table="mangle")[0], rule_counts(t.a, "rst")[0]
    assert c1["gso_super_packets"] > 0, c1  # the path under test was taken
    assert invalid == 0 and rsts == 0, (invalid, rsts)


# --- 4. the peer's MSS, a clamp, a small hop without ICMP --------------------------------------

@pytest.mark.parametrize("hop", ["small_hop", "mss_clamp"])
def test_compressed_packets_fit_what_the_connection_may_carry(tb_name, tmp_path, small, hop):
    """The router's link toward b has MTU 1300 and the router never sends ICMP "fragmentation
    needed" (a black hole for anything bigger). small_hop: b's interface has MTU 1300 too, so
    b's SYN-ACK says MSS 1260; mss_clamp: b has MTU 1500, and the router clamps the MSS of every
    SYN to 1200 instead. TCP cuts its segments to that; so must the soft NIC."""
    with routed(tb_name, mtu_rb=1300, mtu_b=1300 if hop == "small_hop" else 1500) as t:
        iptables(t.r, "-A", "OUTPUT", "-p", "icmp", "--icmp-type", "fragmentation-needed", "-j", "DROP")
        if hop == "mss_clamp":
            iptables(t.r, "-t", "mangle", "-A", "FORWARD", "-p", "tcp", "--tcp-flags", "SYN,RST", "SYN",
                     "-j", "TCPMSS", "--set-mss", "1200")
        # compressed packets only (DSCP 11): a tagged super-packet that leaves raw (its flow's view
        # before NAT not known yet, nicd_conntrack.h) crosses the veth whole and is cut to the
        # connection's MSS by the router's forwarding, as without the soft NIC. A veth hands a GSO
        # skb on whole, so a's has TSO off: its kernel cuts each v3 train in software where a real
        # NIC would in hardware, and the router counts the segments that would be on the wire
        t.a.run(["ethtool", "-K", "eth0", "tso", "off"], check=True, capture_output=True)
        iptables(t.r, "-t", "raw", "-A", "PREROUTING", "-i", t.a.switch_port, "-m", "length", "--length", "1301:65535",
                 "-m", "dscp", "--dscp", "11", "-m", "comment", "--comment", "nt-big")
        assert_clean_transfer(t, tmp_path, small, f"through a {hop}", timeout=40)
        too_big = rule_counts(t.r, "big")[0]
    assert too_big == 0, f"{too_big} compressed packets over the 1300-byte hop reached the router"


# --- 5. policy routing: the compressed packets leave the way the original would ----------------

@pytest.mark.parametrize("rule", ["fwmark", "ipproto"])
def test_compressed_packets_follow_policy_routing(tb_name, tmp_path, small, rule):
    """a's main table sends b's network to a dead gateway; a policy rule sends the flow through the
    router instead: by the sending socket's SO_MARK (fwmark), or by protocol (ipproto tcp). The
    raw socket's packets must take the rule's route too. (This kernel already looked the
    header-included raw socket's packets up by their header's protocol; nicd says IP_PROTOCOL
    for kernels that use 255.)"""
    with routed(tb_name) as t:
        t.a.run(["ip", "route", "replace", f"{B_NET}.0/24", "via", DEAD_GW], check=True)
        t.a.run(["ip", "route", "add", f"{B_NET}.0/24", "via", t.r.ip, "table", "100"], check=True)
        match = ["fwmark", "7"] if rule == "fwmark" else ["ipproto", "tcp"]
        t.a.run(["ip", "rule", "add", *match, "lookup", "100", "priority", "100"], check=True)
        assert_clean_transfer(t, tmp_path, small, f"routed by {rule}", timeout=40,
                              mark=7 if rule == "fwmark" else None)


# --- 6. a stateful firewall on the router --------------------------------------------------------

@pytest.mark.parametrize("gso", ["--gso", "--no-gso"])
def test_stateful_firewall_on_the_router_costs_speed_not_the_connection(tb_name, tmp_path, small, gso):
    """The router drops what its conntrack finds INVALID (ufw, firewalld): it counts the lengths of
    the compressed packets, so b's ACKs cover bytes it never saw, and it drops them. The sender's
    soft NIC sees the same range go out compressed again and again and sends the flow raw from
    then on: the transfer completes, each byte is the original's or its reconstruction's (no more
    of them the original's than arrived raw), the give-up is counted and logged once."""
    with routed(tb_name) as t:
        iptables(t.r, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
        count_raw_tagged(t.b)
        with running_nicd(t.a, tmp_path, gso) as d1, running_nicd(t.b, tmp_path, gso):
            got = transfer(t.a, t.b, small.tobytes(), tmp_path, timeout=60)
            c1 = d1.counters()
            lines = fell_back_lines(d1)
        raw = raw_sent(t.b, c1)
    # the flow may give up only at its tail
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "through the firewall")
    assert c1["flows_negotiated"] == 1 and c1["egress_compressed"] > 0
    assert c1["flows_fell_back"] == 1 and c1["egress_raw_fell_back"] > 0, c1
    assert len(lines) == 1 and re.search(rf"flow {t.a.ip}:\d+ -> {t.b.ip}:\d+", lines[0]), lines


# --- 7. a qdisc that drops ---------------------------------------------------------------------

def test_qdisc_drops_of_compressed_packets_are_counted_as_lost(tb_name, tmp_path, small):
    """A token bucket with a small queue on a's interface drops some of each burst of compressed
    packets the raw socket sends. Those must count as send errors, never as sent."""
    from inceptionn.kernel_tc import netns as ns
    with routed(tb_name) as t:
        with ns.ipr(t.a.netns) as ipr:
            eth = ipr.link_lookup(ifname="eth0")[0]
            ipr.tc("add", "tbf", eth, 0x10000, rate="40mbit", burst=6000, limit=20000)
        # the raw socket's sends (format v2): trains leave in their verdicts, past this count
        got, c1, c2, raw = nicd_transfer(t.a, t.b, small.tobytes(), tmp_path, *V2_GSO, timeout=60)
        with ns.ipr(t.a.netns) as ipr:
            qdisc_drops = next(q for q in ipr.get_qdiscs(index=eth) if q.get_attr("TCA_KIND") == "tbf") \
                .get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")["drops"]
    # heavy local loss may make the flow give up compressing (a range resent again and again):
    # then its tail is the original
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "through a dropping qdisc")
    assert qdisc_drops > 0
    assert 0 < c1["gso_send_errors"] <= qdisc_drops, (c1["gso_send_errors"], qdisc_drops)
    # what the daemon counts as sent compressed, less what arrived, was dropped by the qdisc after
    # a verdict (the kernel's own packets, compressed in place): never one the raw socket lost
    assert 0 <= c1["egress_compressed"] - c2["ingress_restored"] <= qdisc_drops - c1["gso_send_errors"]
