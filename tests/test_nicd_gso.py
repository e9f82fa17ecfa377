"""The soft NIC's GSO fast path (``inceptionn nicd --gso``, issue 12), end to end: real TSO
super-packets from the sender's TCP through the egress queue, compressed packets sent through
the daemon's raw socket, restored at the receiver into segments larger than the MSS. Real
netfilter and TCP in testbed namespaces; the helpers are tests/test_nicd.py's.

What must arrive is what the codec's roundtrip gives, bit for bit, as without gso; untagged
traffic arrives byte for byte. Needs root.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
import struct
import subprocess
import time

import numpy as np
import pytest

import test_nicd
from test_nicd import (DROPS, INC, LOSS_5PCT, add_counting_rule, assert_restored_or_raw, assert_words_equal, count_raw_tagged,
                       make_testbed, nicd_transfer, raw_sent, recon, rule_counts, running_nicd, transfer)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")

from test_nicd_v3 import kernel_log_stays_clean  # noqa: E402,F401 (autouse: rule 7, no new kernel WARN or BUG)

V2 = test_nicd.V2_GSO  # this file tests wire format v2's gso path, whatever the trains default



def super_packet(payload: bytes, seq: int, flags: int) -> bytes:
    """An IPv4/TCP packet as TSO hands it to the egress hook: timestamps option, DF, id 0xfffe."""
    tcp = struct.pack("!HHIIBBHHH", 40000, 5001, seq, 7, (32 // 4) << 4, flags, 512, 0, 0)
    tcp += b"\x01\x01\x08\x0a" + struct.pack("!II", 1, 2)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0x28, 20 + len(tcp) + len(payload), 0xFFFE, 0x4000, 64, 6, 0,
                     bytes([198, 18, 0, 1]), bytes([198, 18, 0, 2]))
    return ip + tcp + payload


@pytest.mark.parametrize("mtu", [1500, 9000])
@pytest.mark.parametrize("stream_off", [0, 1, 2, 3])
def test_super_packet_cut_into_mtu_packets_that_restore_alone(grads, mtu, stream_off):
    """nicd_compress_gso on a 64 KB super-packet: packets within the MTU, each smaller than the
    range it covers, contiguous seq (wrapping), IP ids +1, FIN/PSH last only, CWR first only,
    valid checksums; restored one by one they give the codec's roundtrip, raw ends unchanged."""
    from inceptionn.daemon._datapath import ffi, lib
    head = (4 - stream_off) & 3
    payload = bytes(range(head)) + grads[:16200].tobytes() + b"\x07\x08"  # tail of 2 raw bytes
    seq = 0xFFFFFFFF - 5000  # wraps inside the super-packet
    pkt = super_packet(payload, seq, 0x80 | 0x10 | 0x08 | 0x01)  # CWR ACK PSH FIN
    keep = ffi.from_buffer(pkt)
    p = ffi.new("struct nicd_pkt *")
    assert lib.nicd_parse(keep, len(pkt), p) == 0
    out, seg_len, nsegs = ffi.new("uint8_t[]", 65536 + 64 * 128), ffi.new("size_t[]", 64), ffi.new("int *")
    scratch, stream = ffi.new("float[]", 16400), ffi.new("uint8_t[]", 2048 * 34)
    r = lib.nicd_compress_gso(p, stream_off, -10, 0x2C, 0, mtu, out, len(out), seg_len, nsegs, 64, scratch,
                              stream, len(stream), ffi.NULL)
    assert r > 2, r
    buf = bytes(ffi.buffer(out, r))
    restored, at, covered = b"", 0, 0
    n = nsegs[0]
    assert 1 < n < (len(payload) + mtu - 53) // (mtu - 52) / 2  # under half as many as MSS segments
    for i in range(n):
        seg = buf[at:at + seg_len[i]]
        at += seg_len[i]
        assert len(seg) <= mtu
        c = ffi.new("struct nicd_pkt *")
        ck = ffi.from_buffer(seg)
        assert lib.nicd_parse(ck, len(seg), c) == 0
        assert c.seq == (seq + covered) & 0xFFFFFFFF and c.tos == 0x2C
        assert struct.unpack("!H", seg[4:6])[0] == (0xFFFE + i) & 0xFFFF
        flags = seg[33]
        assert (flags & 0x09 != 0) == (i == n - 1) and (flags & 0x80 != 0) == (i == 0) and flags & 0x10
        assert seg[20 + 20:20 + 32] == pkt[40:52]  # the TCP options travel as they were
        back = ffi.new("uint8_t[]", 65536)
        b = lib.nicd_restore(c, 0x28, back, len(back), scratch)  # checks the TCP checksum and CRC
        assert b > 0, lib.nicd_strerror(b)
        assert c.payload_len < b - c.payload_off
        restored += bytes(ffi.buffer(back, b))[c.payload_off:]
        covered += b - c.payload_off
    assert at == r and covered == len(payload)
    want = recon(np.frombuffer(payload[head:head + 4 * 16200], np.float32), -10).tobytes()
    assert restored[:head] == payload[:head] and restored[-2:] == b"\x07\x08"
    assert_words_equal(restored[head:-2], want, "restored super-packet")


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_super_packets_of_every_size_compress(grads, mtu):
    """Gradients compress ~6x: every super-packet must go compressed, whatever its length, also
    when the greedy cut would leave a last packet of a few floats that could not shrink (the last
    two packets share what is left instead)."""
    from inceptionn.daemon._datapath import ffi, lib
    out, seg_len, nsegs = ffi.new("uint8_t[]", 65536 + 64 * 128), ffi.new("size_t[]", 64), ffi.new("int *")
    scratch, stream = ffi.new("float[]", 16400), ffi.new("uint8_t[]", 2048 * 34)
    refused = []
    for length in range(3 * mtu, 64000, 97):
        pkt = super_packet(grads[1000:1000 + length // 4 + 1].tobytes()[:length], 1, 0x18)
        keep = ffi.from_buffer(pkt)
        p = ffi.new("struct nicd_pkt *")
        assert lib.nicd_parse(keep, len(pkt), p) == 0
        r = lib.nicd_compress_gso(p, 0, -10, 0x2C, 0, mtu, out, len(out), seg_len, nsegs, 64, scratch, stream,
                                  len(stream), ffi.NULL)
        if r <= 2:
            refused.append(length)
    assert not refused, f"{len(refused)} super-packets left raw, e.g. of {refused[:5]} payload bytes"


def test_super_packet_that_does_not_compress_is_left_whole():
    from inceptionn.daemon._datapath import ffi, lib
    big = np.linspace(1.5, 1e6, 15000, dtype=np.float32)  # |x| >= 1: 4 bytes each plus tag words
    pkt = super_packet(big.tobytes(), 1000, 0x18)
    keep = ffi.from_buffer(pkt)
    p = ffi.new("struct nicd_pkt *")
    assert lib.nicd_parse(keep, len(pkt), p) == 0
    out, seg_len, nsegs = ffi.new("uint8_t[]", 65536 + 64 * 128), ffi.new("size_t[]", 64), ffi.new("int *")
    r = lib.nicd_compress_gso(p, 0, -10, 0x2C, 0, 1500, out, len(out), seg_len, nsegs, 64, ffi.new("float[]", 16400),
                              ffi.new("uint8_t[]", 2048 * 34), 2048 * 34, ffi.NULL)
    assert r == 1  # NICD_NOT_SMALLER: the caller accepts the super-packet unchanged


def test_receive_offload_merges_restored_packets_of_a_run():
    """nicd_can_append / nicd_append / nicd_finish_merged (the receiver's merge of restored
    packets): the packets nicd_compress_gso cut, restored one by one, merge back into one packet
    with the super-packet's payload, PSH from the last, and right checksums; a packet that does
    not continue the merged one (a gap, another ack, a FIN) stays out."""
    from inceptionn.daemon._datapath import ffi, lib
    payload = np.linspace(-0.5, 0.5, 12000, dtype=np.float32).tobytes()
    pkt = super_packet(payload, 1000, 0x10 | 0x08)  # ACK PSH
    keep = ffi.from_buffer(pkt)
    p = ffi.new("struct nicd_pkt *")
    assert lib.nicd_parse(keep, len(pkt), p) == 0
    out, seg_len, nsegs = ffi.new("uint8_t[]", 65536 + 64 * 128), ffi.new("size_t[]", 64), ffi.new("int *")
    scratch = ffi.new("float[]", 16400)
    r = lib.nicd_compress_gso(p, 0, -10, 0x2C, 0, 1500, out, len(out), seg_len, nsegs, 64, scratch,
                              ffi.new("uint8_t[]", 2048 * 34), 2048 * 34, ffi.NULL)
    assert r > 0 and nsegs[0] > 2
    restored, at = [], 0
    for i in range(nsegs[0]):
        c = ffi.new("struct nicd_pkt *")
        assert lib.nicd_parse(out + at, seg_len[i], c) == 0
        back = ffi.new("uint8_t[]", 65536)
        n = lib.nicd_restore(c, 0x28, back, len(back), scratch)
        assert n > 0
        restored.append(bytes(ffi.buffer(back, n)))
        at += seg_len[i]
    merged = ffi.new("uint8_t[]", 65536 + 64)
    merged[0:len(restored[0])] = restored[0]
    length = len(restored[0])
    for b in restored[1:]:
        assert lib.nicd_can_append(merged, length, b, len(b), len(merged)) == 1
        length = lib.nicd_append(merged, length, b, len(b))
    lib.nicd_finish_merged(merged, length)
    m = bytes(ffi.buffer(merged, length))
    assert length == len(pkt)
    assert m[52:] == recon(np.frombuffer(payload, np.float32), -10).tobytes()
    assert m[20 + 13] == 0x18 and struct.unpack("!I", m[24:28])[0] == 1000  # PSH ACK, the first seq
    assert lib.nicd_tcp_checksum(merged, length) == 0 and m[12:20] == pkt[12:20]
    # what does not continue it: a gap, another ack, a FIN, more than cap
    first, second = bytearray(restored[0]), bytearray(restored[1])
    assert lib.nicd_can_append(bytes(first), len(first), bytes(second), len(second), 1000) == 0
    for i, v in ((27, second[27] ^ 1), (31, second[31] ^ 1), (33, second[33] | 0x01)):
        bad = bytearray(second)
        bad[i] = v
        assert lib.nicd_can_append(bytes(first), len(first), bytes(bad), len(bad), 65536) == 0, i
    assert lib.nicd_can_append(bytes(first), len(first), bytes(second), len(second), 65536) == 1


# A tagged sender the test drives: connects (ToS 0x28) and prints "connected"; then each stdin line
# "START END" sends bytes [START, END) of the file and prints "sent"; "end" closes the connection.
STEP_SENDER = r"""
import socket, sys
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = open(path, "rb").read()
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x28)
s.settimeout(60)
s.connect((host, port))
print("connected", flush=True)
for line in sys.stdin:
    if line.strip() == "end":
        break
    start, end = map(int, line.split())
    s.sendall(data[start:end])
    print("sent", flush=True)
s.shutdown(socket.SHUT_WR)
while s.recv(65536):
    pass
"""


def transfer_once_view_known(h1, h2, d1, data: bytes, tmp_path, mss: int):
    """``data`` h1 -> h2 on a tagged connection (nicd running on both, d1 h1's), sent so that the
    bulk leaves once the sender's daemon knows the flow's view (nicd_conntrack.h). A conntrack
    thread answers that question after negotiation; until then the flow's super-packets leave
    raw without being tried (egress_raw_view_pending), and under load the answer can come after
    a whole 2 MiB transfer (seen: 42 of 42 super-packets raw, gso_super_packets 0). So the stream
    starts with probes of two MSS (one GSO skb) until one was tried (sent compressed, or found
    not smaller) with none of its packets left pending, then the rest follows in one write. (A
    probe compressed packet by packet counts as tried too, so a daemon that never sees a GSO skb
    fails the caller's gso assertions, not this loop.)
    Returns what arrived, the bytes sent as probes, and d1's counters just before the rest."""
    from test_nicd import PEER, PY, Transfer
    port = str(next(Transfer._ports))
    out = tmp_path / f"recv{port}.bin"
    src = tmp_path / f"send{port}.bin"
    src.write_bytes(data)
    probe, probes = 2 * mss, 64
    recv = h2.popen([PY, PEER, "recv", "--bind", h2.ip, "--port", port, "--out", out, "--timeout", "90"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    send = None
    try:
        assert recv.stdout.readline().strip() == "listening", recv.stderr.read()
        send = h1.popen([PY, "-c", STEP_SENDER, h2.ip, port, src], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
        assert send.stdout.readline().strip() == "connected", send.stderr.read()

        def send_range(start, end):  # and wait until the receiver has it all
            send.stdin.write(f"{start} {end}\n")
            send.stdin.flush()
            assert send.stdout.readline().strip() == "sent", send.stderr.read()
            deadline = time.monotonic() + 30
            while not out.exists() or out.stat().st_size < end:
                assert time.monotonic() < deadline, f"{end} bytes not received in 30 s"
                time.sleep(0.01)

        at, wait, c1 = 0, 0.02, {}
        while True:
            assert at < min(probe * probes, len(data) // 2), (
                f"no probe was tried with none left pending: the flow's view never came? {c1}")
            before = d1.counters()
            send_range(at, at + probe)
            at += probe
            c1 = d1.counters()
            tried = sum(c1[k] - before[k] for k in ("egress_raw_not_smaller", "gso_super_packets", "egress_compressed"))
            if tried and c1["egress_raw_view_pending"] == before["egress_raw_view_pending"]:
                break
            time.sleep(wait)
            wait = min(2 * wait, 0.5)
        print(f"view known after {at // probe} probe(s) of {probe} bytes: {c1['egress_raw_view_pending']} "
              f"super-packets left pending before it")
        before = d1.counters()
        send_range(at, len(data))
        send.stdin.write("end\n")
        send.stdin.flush()
        assert send.wait(timeout=60) == 0, send.stderr.read()
        assert recv.wait(timeout=60) == 0, recv.stderr.read()
    finally:
        for p in (send, recv):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    return out.read_bytes(), at, before


def gso_transfer(h1, h2, data: bytes, tmp_path, mss=1448, tag=""):
    """nicd_transfer(h1, h2, data, tmp_path, *V2) with the bulk sent once the flow's view is
    known (transfer_once_view_known): what arrived, both daemons' counters, raw_sent's bound."""
    count_raw_tagged(h2)
    with running_nicd(h1, tmp_path, *V2, tag=tag) as d1, running_nicd(h2, tmp_path, *V2, tag=tag) as d2:
        got = transfer_once_view_known(h1, h2, d1, data, tmp_path, mss)[0]
        c1, c2 = d1.counters(), d2.counters()
    return got, c1, c2, raw_sent(h2, c1)


def wire_run(tmp_path, x, mtu, *flags, tag=""):
    """One tagged transfer h1 -> h2 with nicd (and ``flags``) on both (with --gso, the bulk once the
    flow's view is known: transfer_once_view_known); returns what arrived, both
    daemons' counters, the data packets h2 saw arrive from h1 (counted on its wire side), the
    compressed ones among them, and the bytes that may have arrived as the original (raw_sent)."""
    with make_testbed(mtu=mtu) as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "data", "-s", h1.ip, "-p", "tcp", "-m", "length", "--length", "100:65535")
        add_counting_rule(h2, "compressed", "-s", h1.ip, "-p", "tcp", "-m", "dscp", "--dscp", "11")
        if flags == V2:
            got, c1, c2, raw = gso_transfer(h1, h2, x.tobytes(), tmp_path, mtu - 52, tag=tag)
        else:  # packet by packet: nothing waits for the view
            got, c1, c2, raw = nicd_transfer(h1, h2, x.tobytes(), tmp_path, *flags, tag=tag)
        return got, c1, c2, rule_counts(h2, "data")[0], rule_counts(h2, "compressed")[0], raw


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_gso_stream_equals_reconstruction_with_fewer_packets(tmp_path, small, mtu):
    want = recon(small, -10).tobytes()
    got, c1, c2, packets, compressed, raw = wire_run(tmp_path, small, mtu, *V2, tag="gso")
    assert_restored_or_raw(got, small.tobytes(), want, raw, f"gso, MTU {mtu}")
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
    # receive offload: runs of restored packets reach TCP as one packet, every verdict taken
    assert 0 < c2["ingress_merged"] < c2["ingress_restored"] and c2["verdict_errors"] == 0, c2

    # the same stream without gso: one compressed packet per MSS segment
    got0, c1_0, _, packets0, _, raw0 = wire_run(tmp_path, small, mtu, "--no-gso", tag="plain")
    assert_restored_or_raw(got0, small.tobytes(), want, raw0, f"no gso, MTU {mtu}")
    assert c1_0["gso_super_packets"] == 0
    print(f"MTU {mtu}: {packets / small.nbytes * 1e6:.0f} data packets per MB with gso, "
          f"{packets0 / small.nbytes * 1e6:.0f} without")
    assert packets < 0.6 * packets0, (packets, packets0)


def test_gso_random_loss(tmp_path, small):
    """5% loss on the receiver's wire side, before its daemon: lost compressed packets; TCP's
    retransmissions come as other super-packets (other boundaries) and are compressed again."""
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        h2.run(["iptables", "-w", "5", "-t", "raw", "-A", "PREROUTING", "-i", h2.ifname, "-p", "tcp",
                *LOSS_5PCT, "-m", "comment", "--comment", "nt-loss", "-j", "DROP"], check=True)
        count_raw_tagged(h2)
        with running_nicd(h1, tmp_path, *V2) as d1, running_nicd(h2, tmp_path, *V2) as d2:
            got = transfer_once_view_known(h1, h2, d1, small.tobytes(), tmp_path, 1448)[0]
            c1, c2 = d1.counters(), d2.counters()
            said = subprocess.run([INC, "stats", "--socket", str(d1.sock)], capture_output=True, text=True,
                                  timeout=20).stdout
        lost = rule_counts(h2, "loss")[0]
        raw = raw_sent(h2, c1)
    assert lost > 0, "the loss rule dropped nothing"
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "gso with 5% loss")
    assert c1["gso_super_packets"] > 0
    assert c1["egress_compressed"] > c2["ingress_restored"] > 0
    assert c2["drop_crc"] == c2["drop_checksum"] == c2["drop_header"] == 0
    assert f"gso    : {c1['gso_super_packets']} super-packets sent compressed" in said, said


def tcp_ext(host, name: str) -> int:
    """A TcpExt counter of the host's network namespace (/proc/net/netstat)."""
    text = host.run(["cat", "/proc/net/netstat"], capture_output=True, text=True, check=True).stdout
    lines = [line.split() for line in text.splitlines() if line.startswith("TcpExt:")]
    return int(dict(zip(lines[0], lines[1]))[name])


def test_gso_reordering(tmp_path, small):
    """The sender's link reorders: every 10th compressed packet and every 10th other TCP packet it
    sends go through a slow HTB class (2 Mbit/s: a held packet waits milliseconds once the class
    has used its burst) while the rest pass, so compressed packets of one super-packet and of
    several arrive out of order; each restores alone.

    That packets arrived out of order is counted on the receiver's wire side, before its daemon
    (tests/reorder_sniffer.py: a data packet whose seq is below one already seen, at a start not
    seen before). Not the receiver's TCPOFOQueue (printed only): it counts segments TCP queued out
    of order, and the receive offload hands a run of restored packets after a gap to TCP as one
    segment, so that count depends on how the packets were batched, not on how many came late."""
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        dev = h1.ifname
        slow = ["-m", "statistic", "--mode", "nth", "--every", "10", "--packet", "0", "-j", "CLASSIFY",
                "--set-class", "1:20"]
        out = ["iptables", "-w", "5", "-t", "mangle", "-A", "OUTPUT", "-o", dev, "-p", "tcp"]
        for cmd in (["tc", "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
                    ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
                    ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "2mbit"],
                    # the gso raw send's compressed packets pass OUTPUT (DSCP 11), and so do the
                    # flow's other packets (super-packets among them: the egress queue in
                    # POSTROUTING takes those before they reach the link)
                    out + ["-m", "dscp", "--dscp", "11", "-m", "comment", "--comment", "nt-slowcompressed", *slow],
                    out + ["-m", "dscp", "!", "--dscp", "11", *slow]):
            h1.run(cmd, check=True, capture_output=True)
        counted = tmp_path / "reorder.json"
        sniffer = h2.popen([sys.executable, str(Path(__file__).with_name("reorder_sniffer.py")), h2.ifname, h1.ip,
                            str(counted)], stdout=subprocess.PIPE, text=True)
        try:
            assert sniffer.stdout.readline().strip() == "ready"
            ofo0 = tcp_ext(h2, "TCPOFOQueue")
            got, c1, c2, raw = gso_transfer(h1, h2, small.tobytes(), tmp_path)
            ofo = tcp_ext(h2, "TCPOFOQueue") - ofo0
        finally:
            sniffer.terminate()
            sniffer.wait(timeout=20)
        held = rule_counts(h1, "slowcompressed", table="mangle")[0]
    wire = json.loads(counted.read_text())
    print(f"compressed packets through the slow class: {held} of {c1['egress_compressed']}; data packets out "
          f"of order on the wire: {wire['out_of_order']} of {wire['data']}; TCPOFOQueue {ofo}; ingress_merged "
          f"{c2['ingress_merged']}")
    assert held > 0, "no compressed packet went through the slow class"
    assert wire["out_of_order"] > 0, ("nothing arrived out of order", wire)
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "gso with reordering")
    assert c1["gso_super_packets"] > 0
    assert c2["ingress_restored"] > 0 and all(c2[k] == 0 for k in DROPS), c2


def test_gso_untagged_untouched(tmp_path, small):
    data = small.tobytes()
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "marked", "-p", "tcp", "-m", "dscp", "!", "--dscp", "0")
        with running_nicd(h1, tmp_path, *V2) as d1, running_nicd(h2, tmp_path, *V2) as d2:
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
        with running_nicd(h1, tmp_path, *V2) as d1:
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


def test_gso_incompressible_super_packets_leave_whole_and_arrive_intact(tmp_path):
    """Tagged data that never shrinks (|x| >= 1 everywhere) on a negotiated flow whose view
    (nicd_conntrack.h) is known: each super-packet is accepted unchanged from the queue (still
    GSO, checksum still partial) and the kernel segments and checksums it after the hook; the
    bytes arrive exactly. The counters are those of the bulk, sent once the view is known
    (transfer_once_view_known: until then super-packets leave raw untried, and under load that
    was all 32 of them, egress_raw_not_smaller 0)."""
    data = np.linspace(1.5, 1e6, 400_000, dtype=np.float32).tobytes()
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path, *V2) as d1, running_nicd(h2, tmp_path, *V2) as d2:
            got, probed, before = transfer_once_view_known(h1, h2, d1, data, tmp_path, 1448)
            c1, c2 = d1.counters(), d2.counters()
    assert got == data
    bulk = len(data) - probed
    assert c1["flows_negotiated"] == 1 and c1["gso_super_packets"] == 0 and c1["egress_compressed"] == 0
    d = {k: c1[k] - before[k] for k in ("egress_raw_not_smaller", "egress_raw_view_pending", "egress_raw_bytes")}
    assert d["egress_raw_view_pending"] == 0, (d, c1)  # a known view stays known
    assert d["egress_raw_not_smaller"] > 0 and d["egress_raw_bytes"] >= 0.9 * bulk, (d, c1)
    # ... and they were queued as super-packets: far fewer verdicts than MSS segments
    assert d["egress_raw_not_smaller"] < bulk / 1448 / 3, (d, c1)
    assert c2["ingress_restored"] == 0


# --- tests/test_nicd.py's end-to-end tests again, packet by packet (--no-gso) -----------------
# (test_nicd.py runs them on the default path, gso = "auto": on, since the tests run as root)

EXISTING = {  # test -> its parameters
    "test_tagged_stream_equals_reconstruction": {"k": -10},
    "test_tagged_and_untagged_in_parallel": {},
    "test_unaligned_segments_and_odd_tail": {"mss": 1001, "family": 4},
    "test_random_loss": {},
    "test_receiver_daemon_killed_fails_closed_and_recovers": {"family": 4},
    "test_sender_daemon_killed_flow_continues_raw": {"family": 4},
    "test_flow_started_before_daemons_stays_raw": {"family": 4},
    "test_hostile_packets_dropped_and_counted": {},
    "test_stop_leaves_no_rule": {},
}


@pytest.mark.parametrize("name", sorted(EXISTING))
def test_existing_end_to_end_tests_per_packet(name, tmp_path, request, monkeypatch):
    import inspect
    start = test_nicd.Nicd.__init__

    def per_packet(self, host, tmp, extra, tag=""):
        start(self, host, tmp, [*extra, "--no-gso"], tag)
    monkeypatch.setattr(test_nicd.Nicd, "__init__", per_packet)
    test = getattr(test_nicd, name)
    kwargs = dict(EXISTING[name], tmp_path=tmp_path)
    for arg in inspect.signature(test).parameters:
        if arg not in kwargs:
            kwargs[arg] = request.getfixturevalue(arg)
    test(**kwargs)


def test_gso_through_conntrack_invalid_drops(tmp_path, small):
    """The usual stateful firewall on both hosts, and on the sender's OUTPUT too (which the raw
    socket's packets cross after their super-packet did): conntrack finds nothing INVALID, and
    the stream arrives as the codec's roundtrip."""
    from test_nicd_failclosed import counted
    from test_nicd_firewall import drop_invalid
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        for h in (h1, h2):
            drop_invalid(h)
        h1.run(["iptables", "-w", "5", "-A", "OUTPUT", "-m", "conntrack", "--ctstate", "INVALID", "-m", "comment",
                "--comment", "nt-outgoing-invalid", "-j", "DROP"], check=True)
        got, c1, c2, raw = gso_transfer(h1, h2, small.tobytes(), tmp_path)
        invalid = [counted(h1, "nt-outgoing-invalid", "filter")[0]] + [counted(h, "nt-invalid", "filter")[0]
                                                                  for h in (h1, h2)]
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw,
                           "gso through an INVALID-drop firewall")
    assert c1["gso_super_packets"] > 0 and c2["ingress_restored"] == c1["egress_compressed"]
    assert invalid == [0, 0, 0], f"conntrack found INVALID packets: {invalid}"


# --- a retransmission cut differently from what was lost -----------------------------------------

# Records every compressed packet (DSCP 11) from SRC seen on IFACE, before netfilter: "seq covered"
# per line, covered = the original bytes it restores to (head + 4 n + tail of its shim header).
SNIFF = r"""
import socket, struct, sys
iface, src, out = sys.argv[1], socket.inet_aton(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)  # the kernel's arrival time
s.bind((iface, 0))
s.settimeout(0.2)
print("ready", flush=True)
with open(out, "w") as f:
    while True:
        try:
            b, anc, _, _ = s.recvmsg(70000, 64)
        except socket.timeout:
            continue
        sec, nsec = struct.unpack("qq", anc[0][2][:16]) if anc else (0, 0)
        ip = b[14:]
        if len(ip) < 40 or ip[9] != 6 or ip[12:16] != src or ip[1] >> 2 != 11:
            continue
        ihl = (ip[0] & 15) * 4
        seq = struct.unpack("!I", ip[ihl + 4:ihl + 8])[0]
        c = ip[ihl + (ip[ihl + 12] >> 4) * 4:]
        if len(c) >= 10:
            f.write(f"{seq} {(c[2] & 3) + 4 * (c[4] | c[5] << 8) + (c[2] >> 2 & 3)} {len(ip)} {sec + nsec / 1e9:.6f}\n")
            f.flush()
"""


STALE = 0.25  # s after the route change during which packets built before it may still arrive


def test_gso_retransmission_cut_differently_arrives_exact(tmp_path, small):
    """A burst of compressed packets is lost (dropped on the receiver's wire side once the sender
    resumes after 1 MiB), and before their retransmission the route's MTU falls from 1500 to 1001
    (MSS 949, not a multiple of 4): TCP retransmits the lost range in other pieces (one MSS after
    the timeout, then super-packets of the new segment size), so the compressed packets of the
    retransmission cover other byte ranges than the lost ones, some starting inside a float, and
    they must fit the new path MTU. Captured on the receiver's wire (before netfilter): some
    retransmitted packet overlaps a lost one without covering the same range. The stream arrives
    as the codec's roundtrip, except bytes sent raw (floats that a cut split; raw_sent)."""
    from test_nicd import Transfer
    x = small
    pause = 1 << 20
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        cap = tmp_path / "capture.txt"
        sniff = h2.popen([test_nicd.PY, "-c", SNIFF, h2.ifname, h1.ip, str(cap)], stdout=subprocess.PIPE, text=True)
        try:
            assert sniff.stdout.readline().strip() == "ready"
            count_raw_tagged(h2)
            with running_nicd(h1, tmp_path, *V2) as d1, running_nicd(h2, tmp_path, *V2) as d2:
                t = Transfer(h1, h2, x.tobytes(), tmp_path, pause_at=pause)
                try:
                    t.wait_paused()
                    t.wait_received(pause)
                    drop = ["PREROUTING", "-i", h2.ifname, "-s", h1.ip, "-p", "tcp", "-m", "dscp", "--dscp", "11",
                            "-m", "comment", "--comment", "nt-burst", "-j", "DROP"]
                    h2.run(["iptables", "-w", "5", "-t", "raw", "-I", *drop], check=True)
                    t.go.touch()
                    deadline = time.monotonic() + 10
                    while rule_counts(h2, "burst")[0] == 0:
                        assert time.monotonic() < deadline, "the sender sent nothing after the pause"
                        time.sleep(0.01)
                    time.sleep(0.3)  # the burst, and its first retransmission after the timeout, lost
                    h1.run(["ip", "route", "add", f"{h2.ip}/32", "dev", h1.ifname, "mtu", "1001"], check=True)
                    changed = time.time()
                    # Packets built before the change may still leave after it (a queued skb keeps its
                    # old route): only arrivals from STALE s on are held to the new MTU, and the drop
                    # stays a little longer so that the recovery all comes after that.
                    time.sleep(STALE + 0.1)
                    h2.run(["iptables", "-w", "5", "-t", "raw", "-D", *drop], check=True)
                    got = t.finish()
                finally:
                    t.close()
                c1, c2 = d1.counters(), d2.counters()
            raw = raw_sent(h2, c1)
        finally:
            sniff.terminate()
            sniff.wait()
    lines = [line.split() for line in cap.read_text().splitlines()]
    seen = [tuple(map(int, f[:3])) for f in lines]
    isn = seen[0][0]  # stream offsets: the first compressed packet starts the stream
    ranges = [((seq - isn) & 0xFFFFFFFF, (seq - isn + cov) & 0xFFFFFFFF) for seq, cov, _ in seen]
    earlier, recut = set(), []
    for start, end in ranges:
        if (start, end) not in earlier and any(s < end and start < e for s, e in earlier):
            recut.append((start, end))
        earlier.add((start, end))
    assert recut, f"no retransmission covered another range than what it resent ({len(ranges)} packets)"
    assert any(s % 4 for s, _ in recut), f"no retransmitted packet started inside a float: {recut[:10]}"
    after = [int(f[2]) for f in lines if float(f[3]) > changed + STALE]
    assert after and max(after) <= 1001, f"compressed packets over the new path MTU: {max(after)} bytes"
    assert c1["gso_send_errors"] == 0, c1
    assert c1["gso_super_packets"] > 0
    assert all(c2[k] == 0 for k in DROPS), c2
    # floats a cut split travel raw; so does all of a flow its sender gave up on (the drop window
    # under load can outlast the give-up rule): both are in raw_sent's bound
    assert_restored_or_raw(got, x.tobytes(), recon(x, -10).tobytes(), raw, "the re-cut retransmission")


class NicdWithoutRaw(test_nicd.Nicd):
    """nicd started without CAP_NET_RAW (capsh drops it from the bounding set first)."""

    def __init__(self, host, tmp_path, extra, tag=""):
        import shlex
        self.host = host
        self.sock = tmp_path / f"{host.name}{tag}.sock"
        self.log = tmp_path / f"{host.name}{tag}.log"
        self.logf = open(self.log, "ab")
        argv = [INC, "nicd", "-i", host.ifname, "--socket", str(self.sock), *extra]
        self.proc = host.popen(["capsh", "--drop=cap_net_raw", "--", "-c", "exec " + shlex.join(argv)],
                               stdout=self.logf, stderr=self.logf)


def test_gso_auto_falls_back_per_packet_without_cap_net_raw(tmp_path, small):
    """gso = "auto": the sender without CAP_NET_RAW says so in one warning line and compresses
    packet by packet; the receiver, with it, runs gso; the stream arrives as the codec's roundtrip
    (gso may differ between the ends)."""
    conf = tmp_path / "auto.toml"
    conf.write_text('gso = "auto"\n')
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        count_raw_tagged(h2)
        d1 = NicdWithoutRaw(h1, tmp_path, ["--config", str(conf)], "auto")
        try:
            d1.wait_ready()
            with running_nicd(h2, tmp_path, "--config", conf, tag="auto") as d2:
                got = transfer(h1, h2, small.tobytes(), tmp_path)
                s1, s2 = test_nicd.stats(d1.sock), test_nicd.stats(d2.sock)
        finally:
            d1.terminate()
        raw = raw_sent(h2, s1["counters"])
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw,
                           "gso auto, sender without CAP_NET_RAW")
    warned = [line for line in d1.log_text().splitlines() if "gso:" in line or "raw IP socket" in line]
    assert len(warned) == 1 and "WARNING: gso: cannot open a raw IP socket" in warned[0], warned
    assert not [line for line in (tmp_path / f"{h2.name}auto.log").read_text().splitlines() if "raw IP socket" in line]
    assert s1["config"]["gso"] is False and s2["config"]["gso"] is True
    c1 = s1["counters"]
    assert c1["gso_super_packets"] == 0 and c1["egress_compressed"] > small.nbytes / 1448 / 2
    assert s2["counters"]["ingress_restored"] == c1["egress_compressed"]
