"""A bulk TCP peer for benchmarks, run inside testbed hosts:

  python -m inceptionn.bench.stream_peer recv ADDR PORT [OUT]    -> prints {"bytes", "seconds"} as JSON
                                                                    (OUT: also keep what arrived)
  python -m inceptionn.bench.stream_peer send ADDR PORT FILE REPS TOS

The receiver times from the first byte to the end of the stream (goodput as the application
sees it); the sender marks its socket with TOS before connecting, as the shim would (the IPv6
traffic class for an IPv6 ADDR).
"""
import json
import socket
import sys
import time

from ..collective.transport import address_family as family
from ..shim.tagging import tag_socket


def recv(addr: str, port: int, out: str | None = None) -> None:
    srv = socket.socket(family(addr))
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    buf = memoryview(bytearray(4 << 20))
    total, first = 0, None
    keep = open(out, "wb") if out else None
    while True:
        n = conn.recv_into(buf)
        if first is None:
            first = time.perf_counter()
        if n == 0:
            break
        total += n
        if keep:
            keep.write(buf[:n])
    if keep:
        keep.close()
    print(json.dumps({"bytes": total, "seconds": time.perf_counter() - (first or time.perf_counter())}), flush=True)


def send(addr: str, port: int, path: str, reps: int, tos: int) -> None:
    data = open(path, "rb").read()
    s = socket.socket(family(addr))
    if tos:
        tag_socket(s, tos)
    s.connect((addr, port))
    for _ in range(reps):
        s.sendall(data)
    s.close()


if __name__ == "__main__":
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "recv":
        recv(addr, port, sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        send(addr, port, sys.argv[4], int(sys.argv[5]), int(sys.argv[6], 0))
