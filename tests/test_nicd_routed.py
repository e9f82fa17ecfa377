"""The soft NIC across a router that rewrites DSCP (issue 19, item 1): host - router - host
(kernel_tc.testbed.RoutedTestbed), real netfilter in every namespace, real TCP; the rewritten-mark
tests run over IPv4 and IPv6.

A DiffServ boundary that resets DSCP 11 (the compressed mark) to 0 must never make a host
deliver compressed bytes: a compressed packet carries a TCP checksum wrong by exactly
NICD_CSUM_MARK, so a stack that nobody restored it for drops it (TcpInCsumErrors), and a
receiving soft NIC finds it by its payload (rules.LOOKS_COMPRESSED), restores it and counts the
flow (`ingress_marks_rewritten`, `flows_marks_rewritten`). Both egress paths: gso (the default)
and per packet.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from netns_helpers import wait_until
from test_nicd import (DROPS, V2_GSO, PEER, PY, Transfer, add_counting_rule, assert_restored_or_raw, count_raw_tagged,
                       nicd_transfer, raw_sent, recon, rule_counts, running_nicd, xtables)

from inceptionn.daemon import rules
from inceptionn.daemon._datapath import ffi, lib

sys.path.insert(0, os.path.dirname(PEER))
from nicd_peer import parsed, tcp_segment  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")
# format v2 on the gso path (--no-trains) and per packet: what a compressed packet whose DSCP was
# rewritten must do (restore by its checksum mark, or fail the stack's checksum). Trains have no
# such mark; their own test is test_trains_across_a_dscp_rewriting_router_give_up_for_v2.
GSO = pytest.mark.parametrize("gso", ["--gso", "--no-gso"])
V2 = {"--gso": V2_GSO, "--no-gso": ("--no-gso",)}


def segment(payload: bytes) -> bytes:
    return tcp_segment("198.18.1.2", "198.18.2.2", 40000, 5001, 1, 1, 0x18, 0x28, payload=payload)


def test_compressed_checksum_is_wrong_by_the_mark_and_restores(small):
    """The compressed packet's TCP checksum is wrong (by exactly the mark), the original's is
    right and never restorable; the echo travels in the shim header; the rule's pattern is
    the header's first two bytes."""
    pkt = segment(small[:360].tobytes())
    p, keep = parsed(pkt)
    assert lib.nicd_marked_checksum(p) == 0
    out, scratch, back = ffi.new("uint8_t[]", 70000), ffi.new("float[]", 16400), ffi.new("uint8_t[]", 70000)
    assert lib.nicd_restore(p, 0x28, back, len(back), scratch) == -4  # NICD_E_CHECKSUM: not compressed
    r = lib.nicd_compress(p, 0, -10, 0x2C, 0xABC, out, len(out), scratch, ffi.NULL)
    assert 40 < r < len(pkt)
    c, keep2 = parsed(bytes(ffi.buffer(out, r)))
    wire = bytes(ffi.buffer(out, r))
    # what a receiving kernel computes: the checksum does not verify
    ihl, zeroed = 20, bytearray(wire)
    zeroed[36:38] = b"\0\0"
    assert struct.pack("=H", lib.nicd_tcp_checksum(bytes(zeroed), r)) != wire[36:38]
    assert lib.nicd_marked_checksum(c) == 1 and lib.nicd_echo(c) == 0xABC
    assert struct.unpack("!H", wire[ihl + 20:ihl + 22])[0] & rules.SHIM_START_MASK == rules.SHIM_START
    assert rules.SHIM_START == (0x49 << 8) | (lib.NICD_VERSION << 4) and rules.SHIM_LEN == lib.NICD_HDR_LEN
    scaled = lib.nicd_compress_codec(p, 0, lib.NICD_CODEC_SCALED, -10, 0x2C, 0xABC, out, len(out), scratch, ffi.NULL)
    assert scaled > 40 and struct.unpack("!H", bytes(ffi.buffer(out, scaled))[40:42])[0] & rules.SHIM_START_MASK \
        == rules.SHIM_START   # the rule catches both codecs
    n = lib.nicd_restore(c, 0x28, back, len(back), scratch)
    assert n == len(pkt)
    q, keep3 = parsed(bytes(ffi.buffer(back, n)))
    assert lib.nicd_marked_checksum(q) == 0
    again = bytearray(ffi.buffer(back, n))
    again[36:38] = b"\0\0"
    assert struct.pack("=H", lib.nicd_tcp_checksum(bytes(again), n)) == bytes(ffi.buffer(back, n))[36:38]


FAMILY = pytest.mark.parametrize("family", [4, 6])


def routed_testbed(tb_name, mtu=1500, family=4):
    from inceptionn.kernel_tc.testbed import RoutedTestbed
    return RoutedTestbed(hosts=2, mtu=mtu, name=tb_name, ipv6=family == 6)


def rewrite_compressed_mark(router, family=4):
    """The DiffServ boundary of the issue: DSCP 11 becomes 0 on the router, AF12 (hello) stays."""
    router.run([xtables(family), "-w", "5", "-t", "mangle", "-A", "FORWARD", "-m", "dscp", "--dscp", "11",
                "-m", "comment", "--comment", "nt-rewrite", "-j", "DSCP", "--set-dscp", "0"], check=True)


def tcp_snmp(host, name: str) -> int:
    """A Tcp counter of the host's network namespace (/proc/net/snmp), e.g. InCsumErrors."""
    text = host.run(["cat", "/proc/net/snmp"], capture_output=True, text=True, check=True).stdout
    lines = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    return int(dict(zip(lines[0], lines[1]))[name])


@needs_root
@GSO
@FAMILY
def test_rewritten_marks_restored_and_counted(tb_name, tmp_path, small, gso, family):
    """Every compressed packet reaches h2 with DSCP 0; h2's soft NIC restores each one, the
    application gets the codec's reconstruction, and the flow is counted once. Over IPv4 and
    IPv6 (the traffic class rewritten, the IPv6 "looks compressed" rule)."""
    with routed_testbed(tb_name, family=family) as tb:
        h1, h2 = tb.hosts
        rewrite_compressed_mark(tb.router, family)
        add_counting_rule(h2, "dscp11", "-p", "tcp", "-m", "dscp", "--dscp", "11", family=family)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, *V2[gso], family=family, timeout=60)
        rewritten = rule_counts(tb.router, "rewrite", table="mangle", family=family)[0]
        arrived_marked = rule_counts(h2, "dscp11", family=family)[0]
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "across a DSCP-rewriting router")
    assert c1["flows_negotiated"] == 1 and c2["flows_negotiated"] == 1
    assert c1["egress_compressed"] > 10 and rewritten >= c1["egress_compressed"]
    assert arrived_marked == 0, "the router did not rewrite: nothing tested"
    assert c2["ingress_restored"] == c2["ingress_marks_rewritten"] == c1["egress_compressed"]
    assert c2["flows_marks_rewritten"] == 1
    assert all(c2[k] == 0 for k in DROPS), c2


@needs_root
@FAMILY
def test_trains_across_a_dscp_rewriting_router_give_up_for_v2(tb_name, tmp_path, small, family):
    """Trains across the same router: a train whose DSCP was rewritten is not
    queued at h2 (the rule that catches rewritten packets matches v2's header only) and its stack
    drops it (its seq is 2^31 off). h1's soft NIC sees the ranges go out again, gives the flow's
    trains up (once) and goes on in format v2, which h2 restores by its checksum mark: the stream
    arrives as the reconstruction, the flow never goes raw, and what h2 restored came rewritten."""
    with routed_testbed(tb_name, family=family) as tb:
        h1, h2 = tb.hosts
        rewrite_compressed_mark(tb.router, family)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, "--gso", "--trains", family=family,
                                         timeout=60)
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "trains across the router")
    assert c1["flows_negotiated"] == 1 and c1["egress_trains"] > 0
    assert c1["flows_trains_gave_up"] == 1 and c1["flows_fell_back"] == 0, c1
    assert 0 < c2["ingress_restored"] == c2["ingress_marks_rewritten"] < c1["egress_compressed"], (c1, c2)
    assert c2["ingress_train_segments"] == 0 and c2["flows_marks_rewritten"] == 1
    assert all(c2[k] == 0 for k in DROPS), c2


@needs_root
@GSO
@FAMILY
def test_stack_without_soft_nic_drops_rewritten_compressed_packets(tb_name, tmp_path, small, gso, family):
    """h2's soft NIC stops mid-flow while h1's keeps compressing and the router rewrites the
    mark: the fail-closed drop (DSCP 11) cannot see those packets, yet h2's kernel must refuse
    every one by its TCP checksum (TcpInCsumErrors) and the application get not one more byte.
    When h2's soft NIC is back, the flow completes, equal to the reconstruction."""
    data = small.tobytes()
    pause = (len(data) // 4) & ~3
    want = recon(small, -10).tobytes()
    with routed_testbed(tb_name, family=family) as tb:
        h1, h2 = tb.hosts
        rewrite_compressed_mark(tb.router, family)
        count_raw_tagged(h2, family)
        with running_nicd(h1, tmp_path, *V2[gso]) as d1:
            with running_nicd(h2, tmp_path, *V2[gso], tag="-first") as d2:
                t = Transfer(h1, h2, data, tmp_path, pause_at=pause, timeout=90, family=family)
                try:
                    t.wait_paused()
                    t.wait_received(pause)
                    assert d2.counters()["flows_marks_rewritten"] == 1
                except BaseException:
                    t.close()
                    raise
            try:
                assert_restored_or_raw(t.received(), data[:pause], want[:pause], raw_sent(h2, d1.counters(), family),
                                       "before the pause")
                csum_before = tcp_snmp(h2, "InCsumErrors")
                sent_before = d1.counters()["egress_compressed"]
                t.go.touch()
                assert wait_until(lambda: tcp_snmp(h2, "InCsumErrors") - csum_before >= 5, 15.0), \
                    "h2's kernel did not count compressed packets as checksum errors"
                time.sleep(1.0)
                assert d1.counters()["egress_compressed"] > sent_before, "h1 stopped compressing: nothing tested"
                print(f"{gso}: InCsumErrors +{tcp_snmp(h2, 'InCsumErrors') - csum_before}, h1 compressed "
                      f"+{d1.counters()['egress_compressed'] - sent_before} while h2 had no soft NIC")
                assert t.received_len() == pause, \
                    f"{t.received_len() - pause} bytes reached the application while no soft NIC restored them"
                with running_nicd(h2, tmp_path, *V2[gso], tag="-again") as d2b:
                    got = t.finish()
                    c2 = d2b.counters()
            finally:
                t.close()
            raw = raw_sent(h2, d1.counters(), family)
    assert_restored_or_raw(got, data, want, raw, "after the receiver's soft NIC came back")
    assert c2["ingress_marks_rewritten"] > 0 and all(c2[k] == 0 for k in DROPS), c2


EXCHANGE = """
import socket, sys
role, ip, port, n, src, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
data = open(src, "rb").read()
s = socket.socket()
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x28)
s.settimeout(60)
def take(c):
    got = b""
    while len(got) < n:
        b = c.recv(1 << 20)
        if not b:
            break
        got += b
    open(out, "wb").write(got)
if role == "server":
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept()
    take(c)  # the initiator speaks first: its compressed packets confirm the flow
    c.sendall(data)
    c.close()
else:
    s.connect((ip, port))
    s.sendall(data)
    take(s)
    s.close()
"""


@needs_root
def test_answerer_confirmed_by_the_echo_compresses_back(tb_name, tmp_path, small):
    """One tagged connection, both directions, across the rewriting router: the initiator's
    compressed packets echo the answerer's ISN bits, so the answerer confirms and compresses its
    own direction; each side restores the other's packets despite the rewritten mark."""
    x = small[:150_000]
    src = tmp_path / "x.bin"
    src.write_bytes(x.tobytes())
    want = recon(x, -10).tobytes()
    with routed_testbed(tb_name) as tb:
        h1, h2 = tb.hosts
        rewrite_compressed_mark(tb.router)
        for h in (h1, h2):
            count_raw_tagged(h)
        with running_nicd(h1, tmp_path, *V2["--gso"]) as d1, running_nicd(h2, tmp_path, *V2["--gso"]) as d2:
            server = h2.popen([PY, "-c", EXCHANGE, "server", h2.ip, 5960, len(want), src, tmp_path / "at_server"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert server.stdout.readline().strip() == "listening"
                client = h1.run([PY, "-c", EXCHANGE, "client", h2.ip, 5960, len(want), src, tmp_path / "at_client"],
                                capture_output=True, text=True, timeout=90)
                assert client.returncode == 0, client.stderr
                assert server.wait(timeout=30) == 0, server.stderr.read()
            finally:
                if server.poll() is None:
                    server.kill()
                    server.wait()
            c1, c2 = d1.counters(), d2.counters()
        raw_to_h2, raw_to_h1 = raw_sent(h2, c1), raw_sent(h1, c2)
    assert_restored_or_raw((tmp_path / "at_server").read_bytes(), x.tobytes(), want, raw_to_h2, "initiator -> answerer")
    assert_restored_or_raw((tmp_path / "at_client").read_bytes(), x.tobytes(), want, raw_to_h1, "answerer -> initiator")
    assert c1["flows_negotiated"] == 1 and c2["flows_negotiated"] == 1 and c2["confirm_failed"] == 0
    assert c1["egress_compressed"] > 10 and c2["egress_compressed"] > 10
    assert c1["ingress_marks_rewritten"] == c2["egress_compressed"]
    assert c2["ingress_marks_rewritten"] == c1["egress_compressed"]
    assert c1["flows_marks_rewritten"] == 1 and c2["flows_marks_rewritten"] == 1
