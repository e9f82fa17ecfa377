"""The one IPv4/TCP parser of the tests' AF_PACKET sniffers (tests/reorder_sniffer.py,
tests/ring_sniffer.py). Stdlib only: the sniffers run as plain scripts from tests/ (their
directory is on sys.path), inside testbed hosts, as root."""
from __future__ import annotations

import struct
from typing import NamedTuple, Optional

ETH_HLEN = 14  # what an AF_PACKET SOCK_RAW socket hands over before the IP header


class Segment(NamedTuple):
    src: bytes      # the IPv4 source address, 4 bytes as on the wire
    dst: bytes      # the IPv4 destination address
    sport: int
    dport: int
    seq: int
    payload: bytes  # the TCP payload, up to the IP total length (empty for a pure ACK)


def parse_ipv4_tcp(frame: bytes) -> Optional[Segment]:
    """The TCP segment in an Ethernet frame carrying IPv4/TCP, or None: another protocol, or
    too short for the IP and TCP headers its header lengths say it has."""
    ip = frame[ETH_HLEN:]
    if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
        return None
    ihl = (ip[0] & 15) * 4
    total = struct.unpack("!H", ip[2:4])[0]
    tcp = ip[ihl:total]
    if ihl < 20 or len(tcp) < 20 or (tcp[12] >> 4) * 4 < 20:
        return None
    sport, dport, seq = struct.unpack("!HHI", tcp[:8])
    return Segment(ip[12:16], ip[16:20], sport, dport, seq, tcp[(tcp[12] >> 4) * 4:])
