"""Spoofed soft-NIC handshakes at a fixed rate, for the hostile-host test and ``bench nic --flood``:
prebuilt IPv4/TCP SYNs (or SYN-ACKs) marked DSCP 12 and carrying a well-formed hello option with
random nonces, from random testbed sources and ports unless given, sent from a raw socket.

    python -m inceptionn.bench.synflood --dst IP --dport P [--count N | --until-killed]
        [--rate PPS] [--src IP] [--sport P] [--synack --ack N] [--error-bound K] [--seed S]
        [--wait-go]

Prints "flooding" when it starts (with --wait-go: "ready" once the packets are built, then it
waits for a line on stdin) and "sent N" when done (also on SIGTERM). Addresses must lie in the testbed range
198.18.0.0/15: run it only inside a testbed host.
"""
from __future__ import annotations

import argparse
import ipaddress
import random
import signal
import socket
import struct
import sys
import time

from ..shim.contract import DEFAULT_ERROR_BOUND, TOS_COMPRESSED, TOS_HELLO, TOS_TAGGED

TESTBED_NET = ipaddress.ip_network("198.18.0.0/15")  # kernel_tc.testbed.BENCHMARK_NET
POOL = 65536  # distinct packets built; a longer flood cycles through them
# A Linux SYN's options: MSS, SACK permitted, timestamps, NOP, window scale (20 bytes).
LINUX_SYN_OPTIONS = struct.pack("!BBH BB BBII B BBB", 2, 4, 1460, 4, 2, 8, 10, 1, 0, 1, 3, 3, 7)


def in_testbed(addr: str, what: str) -> str:
    if ipaddress.ip_address(addr) not in TESTBED_NET:
        raise SystemExit(f"synflood: {what} {addr} is outside the testbed range {TESTBED_NET}")
    return addr


def build(rnd: random.Random, a) -> list[bytes]:
    from inceptionn.daemon._datapath import ffi, lib

    net = ipaddress.ip_network(a.prefix)
    hosts = [str(h) for h in net.hosts() if str(h) not in (a.dst, *a.exclude)]
    flags = 0x12 if a.synack else 0x02
    pkt, out = ffi.new("struct nicd_pkt *"), ffi.new("uint8_t[]", 256)
    opt = ffi.new("struct nicd_hello_opt *")
    opt.version, opt.role, opt.codec = 1, 2 if a.synack else 1, 1
    opt.error_bound, opt.tos_compressed, opt.orig_tos = a.error_bound, TOS_COMPRESSED, TOS_TAGGED
    pool = []
    for _ in range(min(a.count, POOL) if a.count else POOL):
        src = a.src or rnd.choice(hosts)
        sport = a.sport or rnd.randrange(1024, 65536)
        tcp = struct.pack("!HHIIBBHHH", sport, a.dport, rnd.getrandbits(32),
                          a.ack if a.ack is not None else (rnd.getrandbits(32) if a.synack else 0),
                          (20 + len(LINUX_SYN_OPTIONS)) // 4 << 4, flags, 64240, 0, 0) + LINUX_SYN_OPTIONS
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, TOS_TAGGED, 20 + len(tcp), 0, 0x4000, 64, 6, 0,
                         socket.inet_aton(src), socket.inet_aton(a.dst))
        raw = ip + tcp
        opt.nonce = list(rnd.randbytes(6))
        if lib.nicd_parse(ffi.from_buffer(raw), len(raw), pkt) != 0:
            raise SystemExit("synflood: built a packet the soft NIC cannot parse")
        n = lib.nicd_add_option(pkt, opt, TOS_HELLO, out, len(out))  # also writes the checksums
        if n < 0:
            raise SystemExit("synflood: no room for the hello option")
        pool.append(bytes(ffi.buffer(out, n)))
    return pool


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="synflood", description=__doc__.split("\n\n")[0])
    p.add_argument("--dst", required=True)
    p.add_argument("--dport", type=int, required=True)
    p.add_argument("--count", type=int, default=100_000, help="packets to send (default 100000)")
    p.add_argument("--until-killed", action="store_true", help="send until SIGTERM instead of --count")
    p.add_argument("--rate", type=float, default=20_000, help="packets per second (default 20000)")
    p.add_argument("--src", help="one source address (default: random in --prefix)")
    p.add_argument("--sport", type=int, help="one source port (default: random)")
    p.add_argument("--prefix", default="198.18.0.0/24", help="random sources from here")
    p.add_argument("--exclude", action="append", default=[], help="a source never to use (repeatable)")
    p.add_argument("--synack", action="store_true", help="spoof answers (SYN-ACK) instead of hellos")
    p.add_argument("--ack", type=int, help="acknowledgment number (default random for --synack)")
    p.add_argument("--error-bound", type=int, default=DEFAULT_ERROR_BOUND)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--wait-go", action="store_true", help="build, print \"ready\", start on a line on stdin")
    a = p.parse_args(argv)
    in_testbed(a.dst, "destination")
    if a.src:
        in_testbed(a.src, "source")
    net = ipaddress.ip_network(a.prefix)
    if not net.subnet_of(TESTBED_NET):
        raise SystemExit(f"synflood: --prefix {net} is outside {TESTBED_NET}")
    if a.until_killed:
        a.count = 0
    pool = build(random.Random(a.seed), a)

    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True
    signal.signal(signal.SIGTERM, on_term)
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)  # IP_HDRINCL implied
    if a.wait_go:
        print("ready", flush=True)
        sys.stdin.readline()
    sent, t0 = 0, time.monotonic()
    print("flooding", flush=True)
    while not stop and (not a.count or sent < a.count):
        for _ in range(64):
            pkt = pool[sent % len(pool)]
            try:
                s.sendto(pkt, (a.dst, 0))
            except (BlockingIOError, OSError):
                time.sleep(0.001)  # local queue full: retry this packet, it is counted when sent
                break
            sent += 1
            if a.count and sent >= a.count:
                break
        ahead = t0 + sent / a.rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    print(f"sent {sent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
