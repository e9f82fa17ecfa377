"""Helper program the soft-NIC end-to-end tests (tests/test_nicd.py) run inside testbed hosts.

    recv  --bind IP --port P --out FILE [--tos 0x30] [--md5-peer IP]
          listen, print "listening", accept one connection and append what arrives to FILE,
          flushing after every read (the test watches FILE grow), until the peer closes.
          --tos marks the listening socket (its SYN-ACKs) and so the accepted one.
    send  --host IP --port P --data FILE [--tos 0x28] [--mss N] [--mark N] [--pause-at N --go FILE] [--md5-peer IP]
          [--dstopts] [--sport S]
          connect (IP_TOS, TCP_MAXSEG and SO_MARK set before connect; from port S if given), send FILE; with --pause-at, send
          the first N bytes, print "paused", wait until the file --go exists, send the rest.
          Then half-close and wait for the receiver to close: exit 0 means all was delivered.
    craft --dst IP --kinds K1,K2,... --count N
          send N hostile packets of each kind with scapy from a raw socket (see KINDS).
    spoof-synack --iface IF [--port P]
          sniff the next handshake (to port P) on IF (run it in the server's namespace), then send
          the client copies of the server's real SYN-ACK marked DSCP 12 (see SPOOFS), in order.
    serve --bind IP --port P --data FILE --go FILE [--tos 0x28]
          listen, print "listening", accept one connection, print "accepted", wait until the
          file --go exists, send FILE, close.
    fetch --host IP --port P --sport S --out FILE
          connect from port S (untagged), print "connected", write all that arrives to FILE.
    spoof-hello --src IP --sport S --dst IP --dport P --isn X
          an off-path attacker: send one SYN from src:S with the hello option (our settings, a
          made-up nonce) and the hello mark, through a raw socket.
    guess-confirm --src IP --sport S --dst IP --dport P --seq X [--steps 16384] [--echo E]
          then guess the answerer's confirmation: compressed segments from src:S (seq X, built
          by the soft NIC's own code) whose acks step through the sequence space by 2^32/steps.

Addresses with a colon are IPv6: recv/send/serve/fetch then open AF_INET6 sockets and --tos
sets IPV6_TCLASS (the traffic class) instead of IP_TOS; craft sends IPv6 packets to an IPv6 --dst.

Only the standard library for recv/send, so they start fast.
"""
import argparse
import os
import socket
import struct
import sys
import time


TCP_MD5SIG = 14  # linux/tcp.h


def tcp_socket(addr: str) -> socket.socket:
    """A TCP socket of the address's family (IPv6 if it has a colon)."""
    return socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)


def set_tos(s: socket.socket, tos: int) -> None:
    """The IPv4 ToS byte, or the IPv6 traffic class (the shim's IPV6_TCLASS), of s."""
    if s.family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    else:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


def set_md5(s, peer: str, key: bytes = b"inceptionn-test") -> None:
    """RFC 2385 signatures with ``peer`` (struct tcp_md5sig): the SYN then has no room left for
    the hello option (MD5 takes 20 option bytes, and Linux drops timestamps for it)."""
    addr = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 0) + socket.inet_aton(peer)
    s.setsockopt(socket.IPPROTO_TCP, TCP_MD5SIG,
                 addr.ljust(128, b"\0") + struct.pack("=BBHi", 0, 0, len(key), 0) + key.ljust(80, b"\0"))


def recv(a):
    return _drain(_accept_one(a, a.md5_peer), a.out)


def _accept_one(a, md5_peer=None):
    """Listen on a.bind:a.port (IP_TOS a.tos if given), print "listening", accept one."""
    s = tcp_socket(a.bind)
    if md5_peer:
        set_md5(s, md5_peer)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if a.tos is not None:
        set_tos(s, a.tos)
    s.bind((a.bind, a.port))
    s.listen(1)
    print("listening", flush=True)
    s.settimeout(a.timeout)
    c, _ = s.accept()
    c.settimeout(a.timeout)
    return c


def _drain(c, path) -> int:
    """Append what arrives on c to path, flushed after every read (tests watch it grow), until
    the peer closes."""
    with open(path, "wb") as f:
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            f.write(b)
            f.flush()
    c.close()
    return 0


def send(a):
    data = open(a.data, "rb").read()
    s = tcp_socket(a.host)
    if a.md5_peer:
        set_md5(s, a.md5_peer)
    set_tos(s, a.tos)
    if a.dstopts:  # every packet of the connection carries an (empty) destination-options header
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DSTOPTS, bytes([0, 0, 1, 4, 0, 0, 0, 0]))  # PadN of 4
    if a.mss:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, a.mss)
    if a.mark is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, a.mark)
    if a.sport:  # a known 4-tuple (tests/test_nicd_queues.py: which queue the flow takes)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", a.sport))
    s.settimeout(a.timeout)
    deadline = time.monotonic() + 10
    while True:
        try:
            s.connect((a.host, a.port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if a.write:  # each write its own skb (a GSO skb of a few MSS): no coalescing by Nagle or corking
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(data), a.write):
            s.sendall(data[i:i + a.write])
            time.sleep(0.001)
    elif a.pause_at is not None:
        s.sendall(data[:a.pause_at])
        print("paused", flush=True)
        while not os.path.exists(a.go):
            time.sleep(0.02)
        s.sendall(data[a.pause_at:])
    else:
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    while s.recv(65536):
        pass
    s.close()
    return 0


def serve(a):
    c = _accept_one(a)
    print("accepted", flush=True)
    while not os.path.exists(a.go):
        time.sleep(0.02)
    c.sendall(open(a.data, "rb").read())
    c.close()
    return 0


def fetch(a):
    s = tcp_socket(a.host)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", a.sport))
    s.settimeout(a.timeout)
    s.connect((a.host, a.port))
    print("connected", flush=True)
    return _drain(s, a.out)


def tcp_segment(src: str, dst: str, sport: int, dport: int, seq: int, ack: int, flags: int, tos: int,
                 options: bytes = b"", payload: bytes = b"") -> bytes:
    from inceptionn.daemon._datapath import lib
    thl = 20 + len(options)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, (thl // 4) << 4, flags, 64240, 0, 0) + options
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, 20 + thl + len(payload), 0, 0x4000, 64, 6, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    pkt = bytearray(ip + tcp + payload)
    pkt[36:38] = struct.pack("=H", lib.nicd_tcp_checksum(bytes(pkt), len(pkt)))
    return bytes(pkt)


def parsed(buf: bytes):
    from inceptionn.daemon._datapath import ffi, lib
    p, keep = ffi.new("struct nicd_pkt *"), ffi.from_buffer(buf)
    assert lib.nicd_parse(keep, len(buf), p) == 0
    return p, keep


def _raw_socket():
    return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)


def spoof_hello(a):
    from inceptionn.daemon._datapath import ffi, lib
    syn = tcp_segment(a.src, a.dst, a.sport, a.dport, a.isn, 0, 0x02, 0x28, struct.pack("!BBH", 2, 4, 1460))
    p, keep = parsed(syn)
    o = ffi.new("struct nicd_hello_opt *")
    # the settings a soft NIC of this build announces (codec: the highest it decodes)
    o.version, o.role, o.error_bound, o.tos_compressed, o.orig_tos = getattr(lib, "NICD_VERSION", 1), 1, -10, 0x2C, 0x28
    o.codec = getattr(lib, "NICD_CODEC_SCALED", 1)
    o.nonce = list(os.urandom(6))
    out = ffi.new("uint8_t[]", 200)
    n = lib.nicd_add_option(p, o, 0x30, out, len(out))
    assert n > 0, n
    _raw_socket().sendto(bytes(ffi.buffer(out, n)), (a.dst, 0))
    print("spoofed hello", flush=True)
    return 0


def guess_confirm(a):
    import numpy as np
    from inceptionn.daemon._datapath import ffi, lib
    x = (np.random.default_rng(7).standard_normal(360) * 1e-3).astype(np.float32).tobytes()
    out, scratch = ffi.new("uint8_t[]", 4096), ffi.new("float[]", 16400)
    pkts, step = [], (1 << 32) // a.steps
    for i in range(a.steps):
        seg = tcp_segment(a.src, a.dst, a.sport, a.dport, a.seq, (i * step + 1) & 0xFFFFFFFF, 0x18, 0x28, payload=x)
        p, keep = parsed(seg)
        try:  # the soft NIC's own packet, whichever wire version this build speaks
            n = lib.nicd_compress(p, 0, -10, 0x2C, a.echo, out, len(out), scratch, ffi.NULL)
        except TypeError:
            n = lib.nicd_compress(p, 0, -10, 0x2C, out, len(out), scratch, ffi.NULL)
        assert n > 40, n
        pkts.append(bytes(ffi.buffer(out, n)))
    s = _raw_socket()
    for pkt in pkts:
        while True:
            try:
                s.sendto(pkt, (a.dst, 0))
                break
            except OSError:  # ENOBUFS: the qdisc is full for a moment
                time.sleep(0.001)
    print(f"guessed {len(pkts)}", flush=True)
    return 0


# --- hostile packets -------------------------------------------------------------------------

def _crc32c(buf: bytes) -> int:
    from inceptionn.daemon._datapath import ffi, lib
    return lib.nicd_crc32c(0, ffi.from_buffer(buf), len(buf))


def tcp_offset(raw: bytes) -> int:
    """Where the TCP header of an IPv4 packet, or of an IPv6 one behind any extension headers, starts."""
    if raw[0] >> 4 != 6:
        return (raw[0] & 15) * 4
    at, nh = 40, raw[6]
    while nh != 6:  # each extension header: next header, then its length in 8-byte units past 8
        nh, at = raw[at], at + (raw[at + 1] + 1) * 8
    return at


def mark_checksum(raw: bytes) -> bytes:
    """An IPv4/TCP or IPv6/TCP packet whose TCP checksum is right, made wrong by exactly
    NICD_CSUM_MARK, as a soft NIC sends a compressed packet (daemon/nicd_packet.h)."""
    from inceptionn.daemon._datapath import lib
    at = tcp_offset(raw) + 16
    v = struct.unpack("!H", raw[at:at + 2])[0] + lib.NICD_CSUM_MARK
    return raw[:at] + struct.pack("!H", (v & 0xFFFF) + (v >> 16)) + raw[at + 2:]


def shim(n: int, body: bytes, *, magic=0x49, ver=0x21, ht=0, x=0, crc=None) -> bytes:
    """A compressed payload: 11-byte header (daemon/nicd_packet.h) + body, CRC32C made valid
    unless ``crc`` is given. ``x``: byte 10, codec 2's scale exponent (int8); echo 0."""
    hdr = bytes([magic, ver, ht, 0]) + struct.pack("<H", n)
    if crc is None:
        crc = _crc32c(hdr + b"\0\0\0\0" + bytes([x & 0xFF]) + body)
    return hdr + struct.pack("<I", crc) + bytes([x & 0xFF]) + body


KINDS = {
    # kind: what h2's daemon must count for it (None: must not reach its queue at all)
    "random": "drop_header",       # random bytes, first byte not the magic
    "truncated": "drop_header",    # shorter than the 10-byte header
    "magic": "drop_header",        # well-formed header with the wrong magic
    "version": "drop_header",      # wrong version/codec byte (version 1's)
    "huge_n": "drop_too_big",      # valid CRC, n = 65535 floats (would restore to 256 KiB)
    "bad_crc": "drop_crc",         # valid header, CRC does not match
    "decode": "drop_decode",       # valid header and CRC, n = 200 but no group stream
    "checksum": "drop_checksum",   # valid compressed payload, TCP checksum wrong
    "tiny_ip": "drop_malformed",   # IPv4 header only, protocol TCP, no TCP header
    "udp": None,                   # UDP with the compressed mark: not ours, never queued
    "wrap": "drop_too_big",        # valid, restores to 65532-65535 bytes (wraps the netlink length)
    "fits": "ingress_restored",    # the same at 65531 bytes, the largest a verdict can carry
    "exponent": "drop_header",     # codec 2, valid CRC and stream, scale exponent 127, -127 or -128
    "exponent1": "drop_header",    # codec 1 with a non-zero byte 3 (only codec 2 has an exponent)
    "scaled": "ingress_restored",  # codec 2, valid, exponent +-126 (the limits) or 0
    "ext_header": "drop_ext_header",  # IPv6 only: a valid compressed packet behind a destination-options header
}
BAD_EXPONENTS = (127, -127, -128)


def zeros_restoring_to(total: int, ver=0x21, scale=0) -> bytes:
    """A valid compressed payload (no TCP options) whose restored IP packet is ``total`` bytes:
    zero floats, tail bytes making up the rest (codec 2 when ver is 0x22, exponent ``scale``)."""
    import numpy as np
    from inceptionn.codecs._native import ffi, lib
    n, tail = divmod(total - 40, 4)
    out = ffi.new("uint8_t[]", n + 64)
    x = np.zeros(n, np.float32)
    slen = lib.inc_encode(ffi.from_buffer("float[]", x), n, -10, out, n + 64, 0)
    assert slen > 0, slen
    return shim(n, bytes(ffi.buffer(out, slen)) + b"T" * tail, ht=tail << 2, ver=ver, x=scale)



def craft(a):
    import random

    from scapy.all import IP, TCP, UDP, IPv6, IPv6ExtHdrDestOpt, Raw, conf, send as scapy_send
    conf.verb = 0
    rnd = random.Random(a.seed)
    pkts = []
    v6 = ":" in a.dst
    for k, i in [(k, i) for k in a.kinds.split(",") for i in range(a.count)]:
        ip = IPv6(dst=a.dst, tc=0x2C) if v6 else IP(dst=a.dst, tos=0x2C)
        tcp = TCP(sport=rnd.randrange(20000, 60000), dport=a.dport, flags="PA", seq=rnd.getrandbits(32),
                  ack=rnd.getrandbits(32))
        if k == "random":
            body = bytes([rnd.choice([b for b in range(256) if b != 0x49])]) + rnd.randbytes(rnd.randrange(10, 1400))
            pkts.append(ip / tcp / Raw(body))
        elif k == "truncated":
            pkts.append(ip / tcp / Raw(bytes([0x49, 0x21, 0, 0, 5])[: 1 + i % 5]))
        elif k == "magic":
            pkts.append(ip / tcp / Raw(shim(4, rnd.randbytes(12), magic=0x48)))
        elif k == "version":
            pkts.append(ip / tcp / Raw(shim(4, rnd.randbytes(12), ver=0x11)))
        elif k == "huge_n":
            pkts.append(ip / tcp / Raw(shim(65535, rnd.randbytes(64))))
        elif k == "bad_crc":
            good = shim(8, rnd.randbytes(20))
            pkts.append(ip / tcp / Raw(good[:6] + bytes([good[6] ^ 0xFF]) + good[7:]))
        elif k == "decode":
            pkts.append(ip / tcp / Raw(shim(200, b"")))
        elif k == "checksum":
            pkt = (IPv6 if v6 else IP)(bytes(ip / tcp / Raw(shim(8, rnd.randbytes(20)))))  # checksums filled in
            pkt[TCP].chksum ^= 0x5A5A
            pkts.append(pkt)
        elif k == "tiny_ip":
            pkts.append(IPv6(dst=a.dst, tc=0x2C, nh=6) if v6 else IP(dst=a.dst, tos=0x2C, proto=6))
        elif k == "ext_header":
            if not v6:
                raise SystemExit("ext_header: IPv6 only")
            pkts.append(ip / IPv6ExtHdrDestOpt() / tcp / Raw(zeros_restoring_to(200)))
        elif k == "wrap":
            pkts.append(ip / tcp / Raw(zeros_restoring_to(65532 + i % 4)))
        elif k == "fits":
            pkts.append(ip / tcp / Raw(zeros_restoring_to(65531)))
        elif k == "exponent":
            pkts.append(ip / tcp / Raw(zeros_restoring_to(200, ver=0x22, scale=BAD_EXPONENTS[i % 3])))
        elif k == "exponent1":
            pkts.append(ip / tcp / Raw(zeros_restoring_to(200, ver=0x21, scale=1 + i % 255)))
        elif k == "scaled":
            pkts.append(ip / tcp / Raw(zeros_restoring_to(200, ver=0x22, scale=(126, -126, 0)[i % 3])))
        elif k == "udp":
            pkts.append(ip / UDP(sport=rnd.randrange(20000, 60000), dport=a.dport)
                        / Raw(shim(8, rnd.randbytes(20))))
        else:
            raise SystemExit(f"unknown kind {k!r}")
    # TCP checksums as a soft NIC sends them (wrong by the mark), but for the kinds about checksums
    pkts = [(IPv6 if v6 else IP)(mark_checksum(bytes(p))) if k not in ("checksum", "tiny_ip", "udp") else p
            for p, k in zip(pkts, [k for k in a.kinds.split(",") for _ in range(a.count)])]
    scapy_send(pkts, inter=0.002)
    print(f"sent {len(pkts)}", flush=True)
    return 0


SPOOFS = {
    # kind: the copy of the real SYN-ACK (seq, ack, options kept) sent to the client
    "badack": "hello option echoing the SYN's real nonce, ack = ISN + 1001 (the stack refuses it)",
    "badnonce": "hello option with a wrong nonce, ack = ISN + 1 (the stack accepts it)",
    "plain": "only the DSCP 12 mark, as a reflecting kernel or an AF12 socket sends it",
}
# only when asked for (--kinds codec1): a right answer from a soft NIC that knows codec 1 only
ON_REQUEST = {"codec1": "hello option echoing the real nonce, ack = ISN + 1, codec byte 1"}


def spoof_synack(a):
    from scapy.all import IP, TCP, AsyncSniffer, conf, send as scapy_send
    conf.verb = 0
    def handshake(p):  # (no libpcap here: a Python filter instead of BPF)
        return TCP in p and p[TCP].flags & 0x02 and (not a.port or a.port in (p[TCP].sport, p[TCP].dport))
    sniffer = AsyncSniffer(iface=a.iface, count=2, lfilter=handshake,
                           started_callback=lambda: print("sniffing", flush=True))
    sniffer.start()
    sniffer.join(timeout=a.timeout)
    seen = [p[IP] for p in (sniffer.results or [])]
    syn = next((p for p in seen if p[TCP].flags == "S"), None)
    synack = next((p for p in seen if syn is not None and p[TCP].flags == "SA" and p[TCP].sport == syn[TCP].dport
                   and p[TCP].dport == syn[TCP].sport), None)
    if syn is None or synack is None:
        raise SystemExit(f"spoof-synack: no handshake seen: {seen!r}")
    hello = next((v for k, v in syn[TCP].options if k == 253), None)
    if hello is None:
        raise SystemExit("spoof-synack: the client's SYN carried no hello option")
    pkts = []
    answering = (hello[2] & 0xF0) | 2   # the hello's version, role ANSWER
    for kind in a.kinds.split(","):
        p = IP(bytes(synack))
        p.tos = 0x30
        if kind == "badack":
            p[TCP].ack += 1000
            answer = bytes([hello[0], hello[1], answering]) + hello[3:]  # our settings
            p[TCP].options = [(253, answer)] + p[TCP].options
        elif kind == "codec1":  # a soft NIC from before codec 2: the right answer, codec byte 1
            answer = bytes([hello[0], hello[1], answering, 1]) + hello[4:]
            p[TCP].options = [(253, answer)] + p[TCP].options
        elif kind == "badnonce":
            answer = bytes([hello[0], hello[1], answering]) + hello[3:8] + bytes(b ^ 0xA5 for b in hello[8:14])
            p[TCP].options = [(253, answer)] + p[TCP].options
        elif kind != "plain":
            raise SystemExit(f"unknown spoof {kind!r}")
        del p.len, p.chksum, p[TCP].chksum, p[TCP].dataofs
        pkts.append(IP(bytes(p)))
    for p in pkts:
        scapy_send(p)
        time.sleep(0.05)
    print(f"spoofed {len(pkts)}", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=float, default=60)
    r.add_argument("--tos", type=lambda t: int(t, 0))
    r.add_argument("--md5-peer", metavar="IP", help="sign with TCP MD5 (RFC 2385) for this peer")
    s = sub.add_parser("send")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--tos", type=lambda t: int(t, 0), default=0x28)
    s.add_argument("--mss", type=int)
    s.add_argument("--mark", type=int)
    s.add_argument("--pause-at", type=int)
    s.add_argument("--write", type=int, help="send in writes of this many bytes, 1 ms apart, TCP_NODELAY")
    s.add_argument("--go")
    s.add_argument("--timeout", type=float, default=60)
    s.add_argument("--md5-peer", metavar="IP", help="sign with TCP MD5 (RFC 2385) for this peer")
    s.add_argument("--dstopts", action="store_true", help="IPv6: a destination-options header on every packet")
    s.add_argument("--sport", type=int, help="connect from this port")
    c = sub.add_parser("craft")
    c.add_argument("--dst", required=True)
    c.add_argument("--kinds", required=True, help=f"comma-separated, from {', '.join(KINDS)}")
    c.add_argument("--count", type=int, default=3)
    c.add_argument("--dport", type=int, default=5999)
    c.add_argument("--seed", type=int, default=1)
    f = sub.add_parser("spoof-synack")
    f.add_argument("--iface", required=True)
    f.add_argument("--port", type=int, default=0, help="the server's port (default: the first SYN's)")
    f.add_argument("--kinds", default=",".join(SPOOFS), help=f"comma-separated, from {', '.join(SPOOFS | ON_REQUEST)}")
    f.add_argument("--timeout", type=float, default=30)
    v = sub.add_parser("serve")
    v.add_argument("--bind", required=True)
    v.add_argument("--port", type=int, required=True)
    v.add_argument("--data", required=True)
    v.add_argument("--go", required=True)
    v.add_argument("--tos", type=lambda t: int(t, 0), default=0x28)
    v.add_argument("--timeout", type=float, default=60)
    g = sub.add_parser("fetch")
    g.add_argument("--host", required=True)
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--sport", type=int, required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--timeout", type=float, default=60)
    for name in ("spoof-hello", "guess-confirm"):
        h = sub.add_parser(name)
        h.add_argument("--src", required=True)
        h.add_argument("--sport", type=int, required=True)
        h.add_argument("--dst", required=True)
        h.add_argument("--dport", type=int, required=True)
        if name == "spoof-hello":
            h.add_argument("--isn", type=int, required=True)
        else:
            h.add_argument("--seq", type=int, required=True)
            h.add_argument("--steps", type=int, default=16384)
            h.add_argument("--echo", type=int, default=0)
    a = p.parse_args()
    return {"recv": recv, "send": send, "craft": craft, "spoof-synack": spoof_synack, "serve": serve, "fetch": fetch,
            "spoof-hello": spoof_hello, "guess-confirm": guess_confirm}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
