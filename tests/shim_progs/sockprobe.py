"""Plain Python socket code, no tagging of its own: the twin of sockprobe.c (same arguments,
same JSON lines), for tests/test_shim.py.

    sockprobe.py [--settos-before V] [--settos-after V] [--explicit] [--udp ADDR:PORT] [--unix]
                 ADDR:PORT...            (IPv6: [ADDR]:PORT)

--explicit calls the library's inceptionn_tag_socket() through ctypes, as a Python program
that wants to tag a socket itself can (inceptionn.shim.tagging.tag_socket does the same with
setsockopt and needs no library).
"""
import ctypes
import json
import os
import socket
import sys

CHUNK = 16384
ROUNDS = 4


def endpoint(text):
    host, _, port = text.rpartition(":")
    if host.startswith("["):
        return socket.AF_INET6, (host[1:-1], int(port))
    return socket.AF_INET, (host, int(port))


def tos_of(sock, fam):
    if fam == socket.AF_INET6:
        return sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
    return sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)


def set_tos(sock, fam, value):
    if fam == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, value)
    else:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, value)


def xfer(src, dst):
    for r in range(ROUNDS):
        src.sendall(bytes([r]) * CHUNK)
        got = 0
        while got < CHUNK:
            data = dst.recv(CHUNK - got)
            if not data:
                raise SystemExit("sockprobe.py: connection closed early")
            got += len(data)


def main(argv):
    before = after = None
    explicit = do_unix = False
    udp = None
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        opt = argv[i]
        if opt == "--settos-before":
            i += 1
            before = int(argv[i], 0)
        elif opt == "--settos-after":
            i += 1
            after = int(argv[i], 0)
        elif opt == "--explicit":
            explicit = True
        elif opt == "--udp":
            i += 1
            udp = argv[i]
        elif opt == "--unix":
            do_unix = True
        else:
            print(f"sockprobe.py: bad option {opt}", file=sys.stderr)
            return 2
        i += 1
    tag = None
    if explicit:
        tag = getattr(ctypes.CDLL(None), "inceptionn_tag_socket", None)
        print(json.dumps({"kind": "explicit", "found": tag is not None}), flush=True)
    for ep in argv[i:]:
        fam, addr = endpoint(ep)
        lst = socket.socket(fam, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(addr)
        lst.listen(4)
        cli = socket.socket(fam, socket.SOCK_STREAM)
        if before is not None:
            set_tos(cli, fam, before)
        if tag is not None and tag(cli.fileno()) != 0:
            raise SystemExit(f"sockprobe.py: inceptionn_tag_socket: {os.strerror(ctypes.get_errno())}")
        cli.connect(addr)
        if after is not None:
            set_tos(cli, fam, after)
        srv, _ = lst.accept()
        xfer(cli, srv)
        xfer(srv, cli)
        print(json.dumps({"kind": "tcp", "endpoint": ep, "port": addr[1], "client_tos": tos_of(cli, fam),
                          "server_tos": tos_of(srv, fam), "listener_tos": tos_of(lst, fam)}), flush=True)
        cli.close()
        srv.close()
        lst.close()
    if udp:
        fam, addr = endpoint(udp)
        rcv = socket.socket(fam, socket.SOCK_DGRAM)
        rcv.bind(addr)
        snd = socket.socket(fam, socket.SOCK_DGRAM)
        snd.connect(addr)
        for _ in range(20):
            snd.send(b"gradient?")
            rcv.recv(16)
        print(json.dumps({"kind": "udp", "port": addr[1], "tos": tos_of(snd, fam)}), flush=True)
        snd.close()
        rcv.close()
    if do_unix:
        name = f"\0inceptionn-sockprobe-py-{os.getpid()}"
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(name)
        lst.listen(1)
        cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        cli.connect(name)
        srv, _ = lst.accept()
        xfer(cli, srv)
        print(json.dumps({"kind": "unix", "ok": True}), flush=True)
        for s in (cli, srv, lst):
            s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
