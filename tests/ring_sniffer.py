"""Captures, as root in a testbed host, the first HELLO and PROOF (48 + 64 bytes) a ring
connection of the MPI_Allreduce library sends over the host's loopback, and writes them to a
file the unprivileged attacker (tests/ring_attacker.py) replays: what someone who once saw the
traffic would hold. Stdlib only: an AF_PACKET socket, IPv4/TCP parsed by hand."""
import os
import socket
import struct
import sys
import time

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
        if ifname != "lo" or pkttype == socket.PACKET_OUTGOING or len(pkt) < 14 + 20:
            continue
        ip = pkt[14:]
        if ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 15) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        off = (tcp[12] >> 4) * 4
        payload = tcp[off:]
        if not payload:
            continue
        key = (ip[12:16], tcp[0:2], ip[16:20], tcp[2:4])
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
