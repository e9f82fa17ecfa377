"""Counts, as root in a testbed host, the TCP data packets from one address that arrive out of order
on the host's wire side (an AF_PACKET socket on its interface: before netfilter, so compressed
packets as they came): a packet is out of order when its sequence number is below the highest one
its flow has shown and no packet of the flow started there before: a packet that came late, or a
retransmission that fills a gap (a duplicate of a start already seen, as a spurious retransmission
is, is not counted). Sequence numbers count original bytes for compressed packets
too, so starts compare whatever the packets carry. Prints "ready" once bound; on SIGTERM writes
{"data": packets, "out_of_order": count} as JSON to the path given. Stdlib only (the
headers are parsed by tests/ipv4_tcp.py).

    python reorder_sniffer.py IFNAME SRC_ADDRESS OUT_JSON
"""
import json
import signal
import socket
import sys

from ipv4_tcp import parse_ipv4_tcp


def main(ifname: str, src: str, out: str) -> int:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((ifname, 0))
    want = socket.inet_aton(src)
    flows: dict = {}
    counts = {"data": 0, "out_of_order": 0}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    s.settimeout(0.2)
    print("ready", flush=True)
    while not stop:
        try:
            pkt, addr = s.recvfrom(70000)
        except (socket.timeout, InterruptedError):
            continue
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        seg = parse_ipv4_tcp(pkt)
        if seg is None or seg.src != want or not seg.payload:
            continue  # not IPv4/TCP from src, or no payload: not data
        key, seq = (seg.sport, seg.dport), seg.seq
        counts["data"] += 1
        f = flows.setdefault(key, {"high": seq, "seen": set()})
        if (seq - f["high"]) & 0xFFFFFFFF >= 0x80000000 and seq not in f["seen"]:
            counts["out_of_order"] += 1  # below the highest start, and new
        elif (seq - f["high"]) & 0xFFFFFFFF < 0x80000000:
            f["high"] = seq
        f["seen"].add(seq)
    with open(out, "w") as fh:
        json.dump(counts, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
