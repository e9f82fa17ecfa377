"""IPv6 in the soft NIC's C data path (issue #23).

Packet level, through the cffi module on packets scapy builds and checks: an IPv6/TCP packet
compresses and restores as an IPv4 one does (traffic class where IPv4 has the ToS byte, the payload
length field, the TCP checksum over the IPv6 pseudo-header of RFC 8200 section 8.1, wrong by
exactly NICD_CSUM_MARK while compressed), super-packets cut for an IPv6 MTU, the hello option on
an IPv6 SYN, and refusals: any extension header, payload lengths that lie. The flow table keys
IPv6 flows by their addresses.

End to end (needs root): real TCP over IPv6 between two namespaces through the soft NICs, the
IPv6 counterparts of tests/test_nicd.py's streams (some of its tests take family 6 themselves:
either daemon killed, untagged traffic, unaligned segments, a peer without nicd, a flow older
than the daemons; and test_nicd_routed's DSCP-rewriting router).
"""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from test_nicd import DROPS6 as DROPS
from test_nicd import (LOSS_5PCT, V2_GSO, Transfer, add_counting_rule, assert_restored_or_raw, assert_went_compressed, assert_words_equal,
                       count_raw_tagged,
                       fell_back_lines, make_testbed, nicd_transfer, raw_sent, recon, rule_counts, running_nicd,
                       transfer)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")

SRC, DST = "2001:2:0:1::1", "2001:2:0:2::1"
MARK = 0x4E43  # NICD_CSUM_MARK, checked against the C constant below


def lib_ffi():
    from inceptionn.daemon._datapath import ffi, lib
    return ffi, lib


def v6_packet(payload: bytes = b"", *, tc=0x28, flags="PA", seq=1000, ack=7, options=None, ext=None) -> bytes:
    """An IPv6/TCP packet with a right TCP checksum (scapy's), ``ext`` extension headers between."""
    from scapy.layers.inet import TCP
    from scapy.layers.inet6 import IPv6
    tcp = TCP(sport=40000, dport=5001, seq=seq, ack=ack, flags=flags, window=512,
              options=options if options is not None else [("NOP", None), ("NOP", None), ("Timestamp", (1, 2))])
    ip = IPv6(src=SRC, dst=DST, tc=tc, fl=0x12345, hlim=61)
    pkt = ip / ext / tcp if ext is not None else ip / tcp
    return bytes(pkt / payload) if payload else bytes(pkt)


def scapy_checksum(pkt: bytes) -> int:
    """The right TCP checksum of an IPv6/TCP packet (no extension headers), computed by scapy."""
    from scapy.layers.inet import TCP
    from scapy.layers.inet6 import IPv6
    p = IPv6(pkt)
    p[TCP].chksum = None
    return IPv6(bytes(p))[TCP].chksum


def checksum_of(pkt: bytes) -> int:
    return struct.unpack("!H", pkt[56:58])[0]


def marked(csum: int) -> int:
    """A right checksum made wrong by the mark, in big-endian ones-complement arithmetic (what
    daemon/fuzz/fuzz_nicd_packet.c does)."""
    v = csum + MARK
    return (v & 0xFFFF) + (v >> 16)


def parse(buf: bytes):
    ffi, lib = lib_ffi()
    p, keep = ffi.new("struct nicd_pkt *"), ffi.from_buffer(buf)
    return lib.nicd_parse(keep, len(buf), p), p, keep


def test_constants_and_parse():
    ffi, lib = lib_ffi()
    assert lib.NICD_CSUM_MARK == MARK
    pkt = v6_packet(b"x" * 100, tc=0x29)
    r, p, _ = parse(pkt)
    assert r == lib.NICD_OK
    assert p.v6 == 1 and p.ihl == 40 and p.thl == 32 and p.len == len(pkt) == 40 + 32 + 100
    assert p.payload_off == 72 and p.payload_len == 100
    assert p.tos == 0x29  # the traffic class, ECN bits included
    assert (p.sport, p.dport, p.seq, p.ack) == (40000, 5001, 1000, 7)
    import ipaddress
    assert bytes(p.saddr6) == ipaddress.IPv6Address(SRC).packed and bytes(p.daddr6) == ipaddress.IPv6Address(DST).packed
    assert p.saddr == p.daddr == 0
    # the C checksum (stored as it lies in memory) is scapy's
    zeroed = bytearray(pkt)
    zeroed[56:58] = b"\0\0"
    assert struct.pack("=H", lib.nicd_tcp_checksum(bytes(zeroed), len(pkt))) == struct.pack("!H", scapy_checksum(pkt))


@pytest.mark.parametrize("stream_off", [0, 1, 3])
@pytest.mark.parametrize("codec", [1, 2])
def test_compress_restore(grads, stream_off, codec):
    """Compressed: traffic class 0x2C (ECN kept), payload length right, flow label and hop limit
    kept, TCP checksum scapy's plus the mark; restored: the original header bytes exactly, the
    payload the codec's roundtrip (codec 1) or its scaled one, the checksum right by scapy."""
    ffi, lib = lib_ffi()
    head = (4 - stream_off) & 3
    floats = grads[5000:5000 + 360]
    payload = bytes(range(head)) + floats.tobytes() + b"\x05"
    pkt = v6_packet(payload, tc=0x28 | 1 if codec == 1 else 0x24 | 1)
    r, p, _ = parse(pkt)
    assert r == 0
    out, scratch = ffi.new("uint8_t[]", 70000), ffi.new("float[]", 16400)
    n = lib.nicd_compress_codec(p, stream_off, codec, -10, 0x2C | 1, 0xABC, out, len(out), scratch, ffi.NULL)
    assert n > 2, lib.nicd_strerror(n)
    c = bytes(ffi.buffer(out, n))
    assert n < len(pkt)
    assert c[0] >> 4 == 6 and ((c[0] & 15) << 4 | c[1] >> 4) == 0x2D
    assert (c[1] & 15, c[2:4]) == (pkt[1] & 15, pkt[2:4])  # flow label untouched
    assert struct.unpack("!H", c[4:6])[0] == n - 40 and c[6:40] == pkt[6:40]
    assert c[40:56] == pkt[40:56] and c[58:72] == pkt[58:72]  # TCP header but the checksum
    assert checksum_of(c) == marked(scapy_checksum(c)) != scapy_checksum(c)
    rc, cp, _ = parse(c)
    assert rc == 0 and lib.nicd_marked_checksum(cp) == 1 and lib.nicd_echo(cp) == 0xABC
    assert lib.nicd_codec_of(cp) == codec
    back = ffi.new("uint8_t[]", 70000)
    b = lib.nicd_restore(cp, 0x28 | 1 if codec == 1 else 0x24 | 1, back, len(back), scratch)
    assert b == len(pkt), lib.nicd_strerror(b)
    got = bytes(ffi.buffer(back, b))
    assert got[:56] == pkt[:56] and got[58:72] == pkt[58:72]
    assert checksum_of(got) == scapy_checksum(got)
    assert got[72:72 + head] == payload[:head] and got[-1:] == b"\x05"
    if codec == 1:
        assert_words_equal(got[72 + head:-1], recon(floats, -10).tobytes(), "restored payload")
    else:  # scaled: its own error bound relative to the packet's largest value
        back_f = np.frombuffer(got[72 + head:-1], np.float32)
        assert np.max(np.abs(back_f - floats)) <= np.max(np.abs(floats)) * 2.0 ** -6
    # a right checksum: an ordinary segment, never restored
    _, op, _ = parse(pkt)
    assert lib.nicd_marked_checksum(op) == 0
    assert lib.nicd_restore(op, 0x28, back, len(back), scratch) == lib.NICD_E_CHECKSUM


def test_corrupted_compressed_packets_are_refused(grads):
    """Any flipped bit in the addresses (the pseudo-header) or the payload: checksum refused; a
    marked checksum with a broken CRC: CRC refused."""
    ffi, lib = lib_ffi()
    pkt = v6_packet(grads[:400].tobytes())
    _, p, _ = parse(pkt)
    out, scratch, back = ffi.new("uint8_t[]", 70000), ffi.new("float[]", 16400), ffi.new("uint8_t[]", 70000)
    n = lib.nicd_compress(p, 0, -10, 0x2C, 0, out, len(out), scratch, ffi.NULL)
    c = bytes(ffi.buffer(out, n))
    for at in (8, 23, 24, 39, 80, n - 1):  # source, destination, payload
        bad = bytearray(c)
        bad[at] ^= 0x10
        r, bp, _ = parse(bytes(bad))
        assert r == 0 and lib.nicd_restore(bp, 0x28, back, len(back), scratch) == lib.NICD_E_CHECKSUM, at
    # a flipped payload bit under a checksum marked anew (a forger, or a box that rewrote it): the CRC
    bad = bytearray(c)
    bad[n - 1] ^= 0x10
    bad[56:58] = struct.pack("!H", marked(scapy_checksum(bytes(bad))))
    r, bp, _ = parse(bytes(bad))
    assert r == 0 and lib.nicd_restore(bp, 0x28, back, len(back), scratch) == lib.NICD_E_CRC
    # the traffic class and flow label are not in the pseudo-header: changing them is harmless
    tc = bytearray(c)
    tc[1] ^= 0x20
    tc[3] ^= 0xFF
    r, tp, _ = parse(bytes(tc))
    assert lib.nicd_restore(tp, 0x28, back, len(back), scratch) == len(pkt)


@pytest.mark.parametrize("mtu", [1280, 1500, 9000])
def test_super_packet_cut_for_an_ipv6_mtu(grads, mtu):
    """nicd_compress_gso on an IPv6 super-packet: every packet within the MTU with its own
    payload length, no IP id to advance (IPv6 has none), flow label and hop limit kept, seq
    contiguous, FIN/PSH on the last only; each restores alone, right by scapy."""
    ffi, lib = lib_ffi()
    payload = grads[:16000].tobytes()
    pkt = v6_packet(payload, flags="FPA", seq=0xFFFFFFFF - 3000)
    _, p, _ = parse(pkt)
    out, seg_len, nsegs = ffi.new("uint8_t[]", 65536 + 64 * 128), ffi.new("size_t[]", 64), ffi.new("int *")
    scratch, stream = ffi.new("float[]", 16400), ffi.new("uint8_t[]", 2048 * 34)
    r = lib.nicd_compress_gso(p, 0, -10, 0x2C, 0x123, mtu, out, len(out), seg_len, nsegs, 64, scratch, stream,
                              len(stream), ffi.NULL)
    assert r > 2, lib.nicd_strerror(r)
    buf, at, covered, restored = bytes(ffi.buffer(out, r)), 0, 0, b""
    n = nsegs[0]
    assert n > 1
    back = ffi.new("uint8_t[]", 70000)
    for i in range(n):
        seg = buf[at:at + seg_len[i]]
        at += seg_len[i]
        assert len(seg) <= mtu and struct.unpack("!H", seg[4:6])[0] == len(seg) - 40
        assert ((seg[0] & 15) << 4 | seg[1] >> 4) == 0x2C and (seg[1] & 15, seg[2:4]) == (pkt[1] & 15, pkt[2:4])
        assert seg[6:40] == pkt[6:40]  # flow label, next header, hop limit, addresses
        assert checksum_of(seg) == marked(scapy_checksum(seg))
        rc, c, _ = parse(seg)
        assert rc == 0 and c.seq == (0xFFFFFFFF - 3000 + covered) & 0xFFFFFFFF
        assert (seg[53] & 0x09 != 0) == (i == n - 1)
        b = lib.nicd_restore(c, 0x28, back, len(back), scratch)
        assert b > 0, lib.nicd_strerror(b)
        whole = bytes(ffi.buffer(back, b))
        assert checksum_of(whole) == scapy_checksum(whole)
        restored += whole[72:]
        covered += b - 72
    assert covered == len(payload)
    assert_words_equal(restored, recon(grads[:16000], -10).tobytes(), "restored super-packet")


EXT_HEADERS = ["hop-by-hop", "routing", "fragment", "destination"]


def ext_header(kind):
    from scapy.layers.inet6 import (IPv6ExtHdrDestOpt, IPv6ExtHdrFragment, IPv6ExtHdrHopByHop,
                                    IPv6ExtHdrRouting)
    return {"hop-by-hop": IPv6ExtHdrHopByHop(), "routing": IPv6ExtHdrRouting(addresses=[DST]),
            "fragment": IPv6ExtHdrFragment(m=0, offset=0, id=7), "destination": IPv6ExtHdrDestOpt()}[kind]


@pytest.mark.parametrize("kind", EXT_HEADERS)
def test_extension_headers_are_never_transformed(grads, kind):
    """A TCP packet behind any extension header does not parse (NICD_E_EXT_HEADER), with its
    traffic class read so egress can count it (the ingress path drops such a packet marked
    compressed: the end-to-end tests below)."""
    ffi, lib = lib_ffi()
    pkt = v6_packet(grads[:300].tobytes(), tc=0x29, ext=ext_header(kind))
    r, p, _ = parse(pkt)
    assert r == lib.NICD_E_EXT_HEADER
    assert p.v6 == 1 and p.tos == 0x29
    assert ffi.string(lib.nicd_strerror(r)) == b"IPv6 extension header"


def test_other_next_headers_and_lying_lengths_are_refused():
    ffi, lib = lib_ffi()
    from scapy.layers.inet import UDP
    from scapy.layers.inet6 import IPv6
    udp = bytes(IPv6(src=SRC, dst=DST, tc=0x2C) / UDP(sport=1, dport=2) / (b"\x49\x21" + bytes(30)))
    assert parse(udp)[0] == lib.NICD_E_NOT_TCP
    assert parse(bytes(IPv6(src=SRC, dst=DST, nh=59)))[0] == lib.NICD_E_NOT_TCP  # no next header
    pkt = v6_packet(b"y" * 40)
    assert parse(pkt)[0] == 0

    def with_plen(b, plen):
        return b[:4] + struct.pack("!H", plen) + b[6:]
    assert parse(with_plen(pkt, len(pkt) - 40 + 1))[0] == lib.NICD_E_IP  # claims a byte more than there is
    assert parse(with_plen(pkt, 0xFFFF))[0] == lib.NICD_E_IP
    assert parse(with_plen(pkt, 0))[0] == lib.NICD_E_TCP  # a jumbogram's 0: no room for TCP
    assert parse(with_plen(pkt, 19))[0] == lib.NICD_E_TCP
    assert parse(with_plen(pkt, 31))[0] == lib.NICD_E_TCP  # shorter than its TCP header (32)
    r, p, _ = parse(with_plen(pkt, 32))  # the header alone: a packet without payload
    assert r == 0 and p.payload_len == 0 and p.len == 72
    assert parse(pkt[:39])[0] == lib.NICD_E_IP
    assert parse(pkt[:60])[0] == lib.NICD_E_IP  # captured shorter than the payload length says
    r, p, _ = parse(pkt + b"trailing")  # bytes past the payload length are not the packet's
    assert r == 0 and p.len == len(pkt)
    assert parse(b"\x50" + pkt[1:])[0] == lib.NICD_E_IP  # version 5


def test_hello_option_on_an_ipv6_syn():
    """The hello option goes first into an IPv6 SYN (checksum right by scapy, payload length
    +16), is found, and removing it gives back the original bytes with the original class."""
    ffi, lib = lib_ffi()
    from scapy.layers.inet import TCP
    from scapy.layers.inet6 import IPv6
    syn = v6_packet(flags="S", tc=0x28, ack=0, options=[("MSS", 1440), ("SAckOK", b""), ("Timestamp", (5, 0)),
                                                        ("NOP", None), ("WScale", 7)])
    _, p, _ = parse(syn)
    o = ffi.new("struct nicd_hello_opt *")
    o.version, o.role, o.codec, o.tos_compressed, o.orig_tos, o.error_bound = 2, 1, 2, 0x2C, 0x28, -10
    o.nonce = list(range(1, 7))
    out = ffi.new("uint8_t[]", 2048)
    n = lib.nicd_add_option(p, o, 0x30, out, len(out))
    assert n == len(syn) + 16
    h = bytes(ffi.buffer(out, n))
    assert struct.unpack("!H", h[4:6])[0] == n - 40 and ((h[0] & 15) << 4 | h[1] >> 4) == 0x30
    assert checksum_of(h) == scapy_checksum(h)
    assert IPv6(h)[TCP].dataofs * 4 == len(h) - 40 == 20 + 20 + 16  # scapy finds no payload
    assert h[60:76] == bytes([253, 16, 0x49, 0x4E, 0x21, 2, 0xF6, 0x2C, 0x28, 0, 1, 2, 3, 4, 5, 6])
    _, hp, _ = parse(h)
    found = ffi.new("struct nicd_hello_opt *")
    assert lib.nicd_find_option(hp, found) == 20
    assert (found.version, found.role, found.codec, found.orig_tos) == (2, 1, 2, 0x28)
    back = ffi.new("uint8_t[]", 2048)
    b = lib.nicd_strip_option(hp, 20, 0x28, back, len(back))
    assert bytes(ffi.buffer(back, b)) == syn
    # a corrupted hello: not laundered by the fresh checksum
    bad = bytearray(h)
    bad[30] ^= 1
    _, bp, _ = parse(bytes(bad))
    assert lib.nicd_strip_option(bp, 20, 0x28, back, len(back)) == lib.NICD_E_CHECKSUM


def test_set_tos_and_finish_keep_the_flow_label():
    ffi, lib = lib_ffi()
    pkt = bytearray(v6_packet(b"z" * 10, tc=0xFF))
    lib.nicd_set_tos(ffi.from_buffer(pkt), 0x28)
    assert pkt[0] == 0x62 and pkt[1] == 0x81 and pkt[2:4] == b"\x23\x45"
    buf = bytearray(pkt + b"\0" * 8)
    lib.nicd_finish(ffi.from_buffer(buf), len(pkt) - 4, 0x2C)
    b = bytes(buf[:len(pkt) - 4])
    assert struct.unpack("!H", b[4:6])[0] == len(b) - 40 and b[1] & 15 == 1 and b[2:4] == b"\x23\x45"
    assert checksum_of(b) == scapy_checksum(b)


def flow_key(ffi, v6: bool, src: str, dst: str, sport=40000, dport=5001):
    import ipaddress
    k = ffi.new("struct nicd_flow_key *")
    k.sport, k.dport, k.v6 = sport, dport, int(v6)
    if v6:
        k.saddr6 = list(ipaddress.IPv6Address(src).packed)
        k.daddr6 = list(ipaddress.IPv6Address(dst).packed)
    else:
        k.saddr = int.from_bytes(ipaddress.IPv4Address(src).packed, "little")
        k.daddr = int.from_bytes(ipaddress.IPv4Address(dst).packed, "little")
    return k


def test_flow_table_keys_ipv6_flows_by_their_addresses():
    """IPv6 flows that differ only in one address bit are two flows; an IPv4 flow with the same
    ports is a third; each keeps its own ISNs; nonces differ between them."""
    ffi, lib = lib_ffi()
    assert lib.nicd_flows_init(64, 300, 64) == 0
    try:
        a = flow_key(ffi, True, SRC, DST)
        b = flow_key(ffi, True, SRC, "2001:2:0:2::3")
        c = flow_key(ffi, False, "198.18.0.1", "198.18.0.2")
        mapped = flow_key(ffi, True, "::ffff:198.18.0.1", "::ffff:198.18.0.2")
        for i, k in enumerate((a, b, c, mapped)):
            assert lib.nicd_flows_negotiate(k, 100 + i, 200 + i, 1400 + i, 1) == 0
        fi = ffi.new("struct nicd_flow_info *")
        for i, k in enumerate((a, b, c, mapped)):
            assert lib.nicd_flows_egress(k, 101 + i, 10, 0, 0, fi) == lib.NICD_FLOW_COMPRESS
            assert (fi.isn, fi.peer_isn, fi.mss) == (100 + i, 200 + i, 1400 + i)
        nonces = set()
        for k in (a, b, c, mapped):
            n = ffi.new("uint8_t[6]")
            lib.nicd_flows_nonce(k, 5, n)
            nonces.add(bytes(n))
        assert len(nonces) == 4
        lib.nicd_flows_forget(a)
        assert lib.nicd_flows_egress(a, 101, 10, 0, 0, fi) == lib.NICD_FLOW_NONE
        assert lib.nicd_flows_egress(b, 102, 10, 0, 0, fi) == lib.NICD_FLOW_COMPRESS
        h = ffi.new("struct nicd_hello *")
        h.state, h.isn = lib.NICD_HELLO_SENT, 77
        lib.nicd_hello_put(b, h)
        got = ffi.new("struct nicd_hello *")
        assert lib.nicd_hello_get(b, got) == 1 and got.isn == 77
        assert lib.nicd_hello_get(a, got) == 0 and lib.nicd_hello_get(mapped, got) == 0
    finally:
        lib.nicd_flows_free()


# --- end to end: real TCP over IPv6 through the soft NICs -------------------------------------

# "gso" is format v2's raw-socket path (trains' IPv6 runs are tests/test_nicd_v3.py's)
MODES = {"per-packet": ("--no-gso",), "gso": V2_GSO}


@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_ipv6_stream_compressed(tmp_path, small, mode):
    """A tagged float32 stream h1 -> h2 between IPv6 addresses, MTU 1500: negotiated by the hello
    option on the IPv6 SYN/SYN-ACK, compressed (seen on h2's wire with DSCP 11 in the traffic
    class), restored; the application gets the codec's roundtrip."""
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "compressed6", "-s", h1.ip6, "-p", "tcp", "-m", "dscp", "--dscp", "11", family=6)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, *MODES[mode], family=6)
        on_wire = rule_counts(h2, "compressed6", family=6)[0]
    assert_restored_or_raw(got, small.tobytes(), want, raw, f"IPv6, {mode}")
    assert c1["flows_negotiated"] == 1 and c2["flows_negotiated"] == 1
    assert c1["hello_sent"] >= 1 and c2["hello_received"] >= 1
    assert c1["egress_compressed"] > 0 and c2["ingress_restored"] == c1["egress_compressed"]
    assert_went_compressed(c1, small.nbytes, f"IPv6, {mode}")
    assert c1["egress_wire_bytes"] < c1["egress_orig_bytes"] / 3
    assert c2["ingress_orig_bytes"] == c1["egress_orig_bytes"]
    assert on_wire >= c1["egress_compressed"]
    if mode == "gso":
        assert c1["gso_super_packets"] > 0 and c1["gso_send_errors"] == 0
    else:
        assert c1["gso_super_packets"] == 0
    assert c1["egress_raw_ext_header"] == 0
    for key in DROPS:
        assert c2[key] == 0, (key, c2)


@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_ipv6_random_loss(tmp_path, small, mode):
    """5% of what reaches h2 dropped by ip6tables -m statistic, before its daemon: lost
    compressed packets, retransmitted and compressed again, maybe with other boundaries."""
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        h2.run(["ip6tables", "-w", "5", "-t", "raw", "-A", "PREROUTING", "-i", h2.ifname, "-p", "tcp",
                *LOSS_5PCT, "-m", "comment", "--comment", "nt-loss", "-j", "DROP"], check=True)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, *MODES[mode], family=6)
        lost = rule_counts(h2, "loss", family=6)[0]
    assert lost > 0, "the loss rule dropped nothing"
    assert_restored_or_raw(got, small.tobytes(), recon(small, -10).tobytes(), raw, "IPv6 with 5% loss")
    assert c1["egress_compressed"] > c2["ingress_restored"] > 0
    assert c2["drop_crc"] == c2["drop_checksum"] == c2["drop_header"] == 0


@needs_root
def test_ipv6_hostile_packets_dropped_and_counted(tmp_path):
    """Crafted IPv6 packets with the compressed mark: each kind dropped and counted as the IPv4
    ones are, a valid compressed packet behind an extension header too (drop_ext_header); none
    reaches the stack marked compressed; the valid ones are restored."""
    from test_nicd_hostile import crafted_to_a_daemon
    kinds = "random,truncated,magic,version,bad_crc,decode,checksum,huge_n,tiny_ip,ext_header,scaled"
    delta, compressed_in_stack, restored_in_stack = crafted_to_a_daemon(tmp_path, kinds, 3, 9, family=6)
    seen = {k: v for k, v in delta.items() if v}
    assert delta["ingress_packets"] == 33, seen
    assert delta["drop_header"] == 12 and delta["drop_crc"] == 3 and delta["drop_decode"] == 3, seen
    assert delta["drop_checksum"] == 3 and delta["drop_too_big"] == 3 and delta["drop_ext_header"] == 3, seen
    assert delta["drop_malformed"] == 3, seen  # an IPv6 header saying TCP, and no TCP header
    assert delta["ingress_restored"] == 3, seen
    assert compressed_in_stack == 0, "a compressed packet reached the stack"
    assert restored_in_stack == 3  # the scaled ones, restored with their sender's mark (DSCP 9)


@needs_root
def test_ipv6_extension_headers_leave_raw(tmp_path, small):
    """A tagged IPv6 connection whose every packet carries a destination-options header
    (IPV6_DSTOPTS): never transformed, not even its SYN (so no hello, no negotiation); counted as
    egress_raw_ext_header; the stream arrives byte for byte."""
    data = small[:128 * 1024].tobytes()
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path) as d1, running_nicd(h2, tmp_path) as d2:
            got = transfer(h1, h2, data, tmp_path, family=6, extra=["--dstopts"])
            c1, c2 = d1.counters(), d2.counters()
    assert got == data
    assert c1["egress_raw_ext_header"] > 10 and c1["hello_sent"] == 0 and c1["egress_compressed"] == 0
    assert c1["flows_negotiated"] == c2["flows_negotiated"] == 0
    assert c2["ingress_restored"] == 0 and c2["drop_ext_header"] == 0


@needs_root
@pytest.mark.parametrize("mode", MODES)
def test_dual_stack_flows_at_once(tmp_path, small, grads, mode):
    """An IPv4 and an IPv6 tagged flow between the same two hosts at the same time, on the same
    queues: both negotiated, both compressed, both the codec's roundtrip."""
    x4, x6 = small, np.ascontiguousarray(grads[-512 * 1024:])
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "c4", "-s", h1.ip, "-p", "tcp", "-m", "dscp", "--dscp", "11")
        add_counting_rule(h2, "c6", "-s", h1.ip6, "-p", "tcp", "-m", "dscp", "--dscp", "11", family=6)
        count_raw_tagged(h2, family=4)
        count_raw_tagged(h2, family=6)
        with running_nicd(h1, tmp_path, *MODES[mode]) as d1, running_nicd(h2, tmp_path, *MODES[mode]) as d2:
            t4 = Transfer(h1, h2, x4.tobytes(), tmp_path, family=4)
            t6 = Transfer(h1, h2, x6.tobytes(), tmp_path, family=6)
            try:
                got4, got6 = t4.finish(), t6.finish()
            finally:
                t4.close()
                t6.close()
            c1, c2 = d1.counters(), d2.counters()
        on_wire4, on_wire6 = rule_counts(h2, "c4")[0], rule_counts(h2, "c6", family=6)[0]
        raw4, raw6 = raw_sent(h2, c1, family=4), raw_sent(h2, c1, family=6)  # (the edge bytes are both flows')
    assert_restored_or_raw(got4, x4.tobytes(), recon(x4, -10).tobytes(), raw4, "IPv4 flow")
    assert_restored_or_raw(got6, x6.tobytes(), recon(x6, -10).tobytes(), raw6, "IPv6 flow")
    assert c1["flows_negotiated"] == 2 and c2["flows_negotiated"] == 2
    assert_went_compressed(c1, x4.nbytes + x6.nbytes, "IPv4 and IPv6 flows")
    if c1["egress_raw_view_pending"] == 0:  # (else a flow's super-packets may all have left raw)
        assert on_wire4 > 0 and on_wire6 > 0, (on_wire4, on_wire6)
    assert c2["ingress_restored"] == c1["egress_compressed"]
    for key in DROPS:
        assert c2[key] == 0, (key, c2)


@needs_root
def test_ipv6_gso_cuts_to_the_route_mtu(tmp_path, small):
    """h1's route to h2 says MTU 1280 (IPv6's minimum; the links say 1500): gso must cut its
    compressed packets to the path MTU it reads with IPV6_MTU, or the kernel refuses them (no
    router and no host fragments them). No compressed packet over 1280 bytes, some near it, none
    lost. Only compressed ones (DSCP 11) count: a raw one may be a whole GSO skb (a queue full
    under load fails open), which crosses veths and the bridge uncut and would be cut to the
    MSS only by a real NIC's TSO."""
    from inceptionn.kernel_tc import netns as ns
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        with ns.ipr(h1.netns) as ipr:
            eth = ipr.link_lookup(ifname=h1.ifname)[0]
            ipr.route("add", family=10, dst=h2.ip6, dst_len=128, oif=eth, metrics={"mtu": 1280})
        add_counting_rule(h2, "big", "-s", h1.ip6, "-p", "tcp", "-m", "dscp", "--dscp", "11",
                          "-m", "length", "--length", "1281:65535", family=6)
        add_counting_rule(h2, "near", "-s", h1.ip6, "-p", "tcp", "-m", "dscp", "--dscp", "11",
                          "-m", "length", "--length", "1200:1280", family=6)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, *V2_GSO, family=6)
        big, near = rule_counts(h2, "big", family=6)[0], rule_counts(h2, "near", family=6)[0]
    assert_restored_or_raw(got, small.tobytes(), want, raw, "IPv6 at a 1280-byte path MTU")
    assert big == 0, f"{big} compressed packets over the path MTU arrived"
    assert near > 0.5 * c1["egress_compressed"], (near, c1["egress_compressed"])
    assert c1["gso_super_packets"] > 0 and c1["gso_send_errors"] == 0
    assert c2["ingress_restored"] == c1["egress_compressed"]


VIP6 = "2001:2::99"  # a service address h1's own NAT maps to h2 (nat OUTPUT DNAT, as kube-proxy)


@needs_root
def test_ipv6_dnat_on_the_sender(tmp_path, small):
    """h1 reaches h2 through a service address its own NAT66 maps (ip6tables nat OUTPUT DNAT).
    The gso path's raw-socket packets must carry the connection's original tuple (asked from
    conntrack with CTA_IP_V6_SRC/DST) and be NATed as its own: no RST, the stream whole."""
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        h1.run(["ip6tables", "-w", "5", "-t", "nat", "-A", "OUTPUT", "-d", VIP6, "-p", "tcp", "-j", "DNAT",
                "--to-destination", h2.ip6], check=True)
        add_counting_rule(h1, "rst", "-p", "tcp", "--tcp-flags", "RST", "RST", family=6)
        got, c1, c2, raw = nicd_transfer(h1, h2, small.tobytes(), tmp_path, *V2_GSO, family=6, dest=VIP6, timeout=40)
        rsts = rule_counts(h1, "rst", family=6)[0]
    assert_restored_or_raw(got, small.tobytes(), want, raw, "through h1's DNAT66")
    assert rsts == 0
    assert c1["gso_super_packets"] > 0 and c1["flows_fell_back"] == 0
    assert c2["ingress_restored"] == c1["egress_compressed"] > 0


@needs_root
def test_ipv6_flow_gives_up_when_compressed_packets_never_arrive(tmp_path, small):
    """Something in front of h2's daemon drops every IPv6 packet with the compressed DSCP (a
    middlebox's policy): TCP resends the same range again and again, h1's daemon gives the flow
    up (logged once with the IPv6 addresses in brackets), resends the last byte raw through its
    IPv6 raw socket, and the stream arrives as the original, byte for byte."""
    import re
    data = small[:64 * 1024].tobytes()
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path) as d1, running_nicd(h2, tmp_path):
            h2.run(["ip6tables", "-w", "5", "-t", "raw", "-I", "PREROUTING", "1", "-i", h2.ifname, "-m", "dscp",
                    "--dscp", "11", "-m", "comment", "--comment", "nt-middlebox", "-j", "DROP"], check=True)
            got = transfer(h1, h2, data, tmp_path, family=6, timeout=60)
            c1 = d1.counters()
            lines = fell_back_lines(d1)
        dropped = rule_counts(h2, "middlebox", family=6)[0]
    assert got == data
    assert dropped > 0 and c1["egress_compressed"] > 0
    assert c1["flows_fell_back"] == 1 and c1["egress_raw_fell_back"] > 0, c1
    assert len(lines) == 1 and re.search(rf"flow \[{h1.ip6}\]:\d+ -> \[{h2.ip6}\]:\d+", lines[0]), lines


@needs_root
def test_ipv6_gso_recuts_when_the_path_mtu_falls(tmp_path, small):
    """The sender pauses after 1 MiB; its route to h2 then falls from 1500 to 1280 bytes while
    nicd still has 1500 cached. The first super-packets cut for 1500 are refused by the IPv6 raw
    socket (EMSGSIZE: no host or router fragments them); nicd looks the path MTU up again and
    re-cuts: nothing over 1280 arrives after the change, nothing counts as a send error, every
    compressed packet sent is restored."""
    from inceptionn.kernel_tc import netns as ns
    want = recon(small, -10).tobytes()
    with make_testbed(mtu=1500, ipv6=True) as tb:
        h1, h2 = tb.hosts
        count_raw_tagged(h2, family=6)
        with running_nicd(h1, tmp_path, *V2_GSO) as d1, running_nicd(h2, tmp_path, *V2_GSO) as d2:
            t = Transfer(h1, h2, small.tobytes(), tmp_path, family=6, pause_at=1 << 20)
            try:
                t.wait_paused()
                t.wait_received(1 << 20)
                with ns.ipr(h1.netns) as ipr:
                    eth = ipr.link_lookup(ifname=h1.ifname)[0]
                    ipr.route("add", family=10, dst=h2.ip6, dst_len=128, oif=eth, metrics={"mtu": 1280})
                add_counting_rule(h2, "big", "-s", h1.ip6, "-p", "tcp", "-m", "dscp", "--dscp", "11",
                          "-m", "length", "--length", "1281:65535", family=6)
                t.go.touch()
                got = t.finish()
            finally:
                t.close()
            c1, c2 = d1.counters(), d2.counters()
        big = rule_counts(h2, "big", family=6)[0]
        raw = raw_sent(h2, c1, family=6)
    assert_restored_or_raw(got, small.tobytes(), want, raw, "IPv6, path MTU 1500 -> 1280")
    assert big == 0, f"{big} packets over the new path MTU arrived"
    assert c1["gso_send_errors"] == 0 and c1["gso_super_packets"] > 0
    assert c2["ingress_restored"] == c1["egress_compressed"]
