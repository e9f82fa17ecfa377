"""Tag a socket as carrying gradients: IP ToS 0x28 (IPv4) or traffic class 0x28 (IPv6).

The explicit call a program can make instead of (or besides) the LD_PRELOAD policy. Only sockets
that carry float32 gradient bytes and nothing else may be tagged: the soft NIC compresses their
payload lossily.
"""
from __future__ import annotations

import socket

from .contract import TOS_TAGGED as GRADIENT_TOS


def tag_socket(sock: socket.socket, tos: int = GRADIENT_TOS) -> None:
    """Set the ToS/traffic class of a TCP socket (IPv4 or IPv6). Raises ValueError otherwise."""
    if not 0 <= tos <= 0xFF:
        raise ValueError(f"ToS must be 0..255, got {tos}")
    if sock.type != socket.SOCK_STREAM:
        raise ValueError("only TCP sockets carry tagged gradients")
    if sock.family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    elif sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    else:
        raise ValueError(f"cannot tag a socket of family {sock.family!r}")
