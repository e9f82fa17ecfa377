"""Captures, as root in a testbed host, the first HELLO and PROOF (48 + 64 bytes) a ring
connection of the MPI_Allreduce library sends over the host's loopback, and writes them to a
file the unprivileged attacker (tests/ring_attacker.py) replays: what someone who once saw the
traffic would hold. Stdlib only: an AF_PACKET socket, IPv4/TCP parsed by tests/ipv4_tcp.py."""
import os
import socket
import struct
import sys
import time

from ipv4_tcp import parse_ipv4_tcp

START = struct.pack("<2f", 20181024.0, 2.0)   # magic, handshake version
WANT = 48 + 64


def main(path: str, seconds: float) -> int:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.settimeout(0.5)
    flows: dict = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            pkt, (ifname, _, pkttype, _, _) = s.recvfrom(65535)
        except socket.timeout:
            continue
        if ifname != "lo" or pkttype == socket.PACKET_OUTGOING:
            continue
        seg = parse_ipv4_tcp(pkt)
        if seg is None or not seg.payload:
            continue
        payload = seg.payload
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        if key not in flows:
            if not payload.startswith(START):
                continue
            flows[key] = b""
        flows[key] += payload
        if len(flows[key]) >= WANT:
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(flows[key][:WANT])
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
