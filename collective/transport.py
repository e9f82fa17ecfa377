"""TCP plumbing of the collectives: one listener per rank, typed connections, exact reads.

Every rank listens on one TCP port (``bind_addr``). A connection is opened by the rank that
*sends* on it and must prove, before it is used, that its opener belongs to the group: a
challenge-response with a nonce from each side over the group's secret (``GroupKey``, made by
group.py from random contributions of every rank and an optional ``secret=``), the same
handshake as the MPI library's ring (collective/ring_handshake.h):

    opener -> acceptor    HELLO      magic, version, world, rank + 1, kind, nonce_o
    acceptor -> opener    CHALLENGE  magic, version, nonce_a, MAC("A")
    opener -> acceptor    PROOF      MAC("O")
    MAC(role) = HMAC-SHA256(secret, role | group id | world | opener | acceptor | kind | nonce_o | nonce_a)

A replayed HELLO or PROOF fails (the other side's nonce is new), a connection from an address
that is not the claimed rank's endpoint is closed unread, and the acceptor thread serves every
pending handshake at once, each within one deadline from its accept (``HANDSHAKE_TIMEOUT``), so a
silent or trickling connection holds nothing up. Every handshake byte is a float32 integer in
``[1, 2^24)`` (nonces and MACs 16 bits per float, as 1 + v): floats >= 1.0 travel unchanged
through the INCEPTIONN codec (NO_COMPRESS tier), so even a tagged socket carries float32 values
and nothing else, from its first byte.

Connection kinds (``Kind``) and their ToS:

- ``CONTROL``: rank r -> rank 0, untagged. Metadata, agreement, barriers (both directions).
- ``RING_TAGGED``: rank r -> its right neighbour, ToS 0x28 before ``connect()`` (so the SYN is
  tagged and the soft NICs negotiate the flow). Raw float32 gradient chunks, nothing else.
- ``RING_PLAIN``: rank r -> right neighbour, untagged: raw floats when nothing compresses, framed
  codec output when the codec runs in the collective.
- ``WA_TAGGED`` / ``WA_PLAIN``: worker -> aggregator. The worker's direction carries gradients
  (tagged or not, as above); the aggregator answers with weights on the *accepted* side of the
  same connection, whose ToS is explicitly 0: the paper's WA compresses one leg only.

Byte counters are kept per plane: ``gradient`` (what the opener sends on a ``*_TAGGED`` kind),
``data`` (every other data direction, WA weights included) and ``control``. The handshake is not
counted.
"""
from __future__ import annotations

import enum
import errno
import hashlib
import hmac
import ipaddress
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass

import numpy as np

HELLO_MAGIC = 4_718_593          # < 2^24: exact in float32
HS_VERSION = 2
NONCE_BYTES, MAC_BYTES = 16, 32
HELLO_FLOATS = 5 + NONCE_BYTES // 2
CHALLENGE_FLOATS = 2 + NONCE_BYTES // 2 + MAC_BYTES // 2
PROOF_FLOATS = MAC_BYTES // 2
HANDSHAKE_TIMEOUT = 10.0         # s from its accept for an incoming connection to prove itself
FRAME = struct.Struct("<I")      # length prefix of a codec blob on an untagged data socket


class Kind(enum.IntEnum):
    CONTROL = 1
    RING_TAGGED = 2
    RING_PLAIN = 3
    WA_TAGGED = 4
    WA_PLAIN = 5

    @property
    def tagged(self) -> bool:
        return self in (Kind.RING_TAGGED, Kind.WA_TAGGED)

    @property
    def plane(self) -> str:
        if self is Kind.CONTROL:
            return "control"
        return "gradient" if self.tagged else "data"


PLANES = ("gradient", "data", "control")


class PlaneCounters:
    """Bytes sent/received per plane, shared by all connections of a group (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.sent = dict.fromkeys(PLANES, 0)
        self.received = dict.fromkeys(PLANES, 0)

    def add(self, plane: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.sent[plane] += sent
            self.received[plane] += received

    def snapshot(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self.sent), dict(self.received)


class PeerClosed(ConnectionError):
    pass


class Conn:
    """A connected socket of one kind to one peer rank, with exact send/recv helpers."""

    def __init__(self, sock: socket.socket, kind: Kind, peer: int, counters: PlaneCounters, initiator: bool):
        self.sock = sock
        self.kind = kind
        self.peer = peer
        self.counters = counters
        self.initiator = initiator      # True: we opened it (our direction is the one `kind` says)
        # the opener's direction is the one `kind` describes; the answering direction is untagged
        back = "control" if kind is Kind.CONTROL else "data"
        self.send_plane = kind.plane if initiator else back
        self.recv_plane = back if initiator else kind.plane

    def __repr__(self) -> str:
        return f"Conn({self.kind.name}, peer={self.peer}, tos={self.tos():#x})"

    def tos(self) -> int:
        """The ToS this end writes into its outgoing packets (read back from the kernel)."""
        if self.sock.family == socket.AF_INET6:
            return self.sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
        return self.sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)

    def send(self, data) -> None:
        view = memoryview(data).cast("B")
        try:
            self.sock.sendall(view)
        except socket.timeout:
            raise TimeoutError(f"sending to rank {self.peer} ({self.kind.name}) timed out") from None
        except OSError as e:
            raise PeerClosed(f"rank {self.peer} is gone ({self.kind.name} connection: {e})") from None
        self.counters.add(self.send_plane, sent=view.nbytes)

    def recv_into(self, buf) -> None:
        """Fill ``buf`` (any writable buffer) completely."""
        view = memoryview(buf).cast("B")
        got, n = 0, view.nbytes
        try:
            while got < n:
                r = self.sock.recv_into(view[got:], n - got)
                if r == 0:
                    raise PeerClosed(f"rank {self.peer} closed its {self.kind.name} connection "
                                     f"({got} of {n} bytes of a message received)")
                got += r
        except socket.timeout:
            raise TimeoutError(f"waiting for rank {self.peer} ({self.kind.name}) timed out") from None
        except PeerClosed:
            raise
        except OSError as e:
            raise PeerClosed(f"rank {self.peer} is gone ({self.kind.name} connection: {e})") from None
        self.counters.add(self.recv_plane, received=n)

    def recv_bytes(self, n: int) -> bytearray:
        buf = bytearray(n)
        self.recv_into(buf)
        return buf

    def send_frame(self, blob) -> None:
        """Length-prefixed blob (untagged sockets only: the prefix is not float data)."""
        assert not (self.initiator and self.kind.tagged), "no headers on a tagged socket"
        blob = memoryview(blob).cast("B")
        self.send(FRAME.pack(blob.nbytes))
        self.send(blob)

    def recv_frame(self, limit: int) -> bytearray:
        (n,) = FRAME.unpack(self.recv_bytes(FRAME.size))
        if n > limit:
            raise ConnectionError(f"rank {self.peer} announced a {n}-byte message on {self.kind.name}, "
                                  f"more than the {limit} bytes this exchange allows (protocol mismatch?)")
        return self.recv_bytes(n)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def parse_endpoint(ep: str) -> tuple[str, int]:
    host, _, port = ep.rpartition(":")
    return host.strip("[]"), int(port)


def address_family(addr: str) -> int:
    """AF_INET6 for an IPv6 address literal, else AF_INET."""
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def _set_common(sock: socket.socket, timeout: float | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(timeout)


def _untag(sock: socket.socket) -> None:
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, 0)
        else:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0)
    except OSError:
        pass        # a connection already reset: its handshake fails by itself


def encode16(data: bytes) -> np.ndarray:
    """Bytes (an even count) as float32 integers 1 + v, v each little-endian 16-bit value."""
    return np.frombuffer(data, dtype="<u2").astype(np.float32) + np.float32(1)


def decode16(f: np.ndarray) -> bytes | None:
    """The inverse of encode16; None when a value is not such an integer."""
    if not (np.all(np.isfinite(f)) and np.all(f >= 1) and np.all(f <= 65536) and np.all(f == np.floor(f))):
        return None
    return (f - 1).astype("<u2").tobytes()


def same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%")[0]) == ipaddress.ip_address(b.split("%")[0])
    except ValueError:
        return a == b


@dataclass(frozen=True)
class GroupKey:
    """What a connection proves: the group's secret, bound to this group (``group_id``), its size
    and the addresses its ranks connect from (``hosts[r]``: rank r's endpoint host)."""
    secret: bytes
    group_id: bytes
    world: int
    hosts: tuple[str, ...]

    def mac(self, role: bytes, opener: int, acceptor: int, kind: int, nonce_o: bytes, nonce_a: bytes) -> bytes:
        msg = role + self.group_id + struct.pack("<IIII", self.world, opener, acceptor, kind) + nonce_o + nonce_a
        return hmac.new(self.secret, msg, hashlib.sha256).digest()


def hello_msg(key: GroupKey, rank: int, kind: Kind, nonce_o: bytes) -> bytes:
    head = np.array([HELLO_MAGIC, HS_VERSION, key.world, rank + 1, int(kind)], dtype=np.float32)
    return np.concatenate([head, encode16(nonce_o)]).tobytes()


def parse_hello(raw: bytes, world: int) -> tuple[int, Kind, bytes] | None:
    """(opener rank, kind, opener's nonce) of a well-formed HELLO for a group of ``world``."""
    v = np.frombuffer(raw, dtype=np.float32)
    if v.size != HELLO_FLOATS or not np.all(np.isfinite(v[:5])) or v[0] != HELLO_MAGIC or v[1] != HS_VERSION \
            or v[2] != world:
        return None
    rank, kind = int(v[3]) - 1, int(v[4])
    nonce = decode16(v[5:])
    if not 0 <= rank < world or v[3] != rank + 1 or kind not in Kind._value2member_map_ or nonce is None:
        return None
    return rank, Kind(kind), nonce


class _Pending:
    """An incoming connection that has not proven itself yet (the acceptor thread's state)."""
    __slots__ = ("sock", "deadline", "seq", "buf", "need", "hello", "nonce_a", "polled")

    def __init__(self, sock, deadline, seq):
        self.sock, self.deadline, self.seq = sock, deadline, seq
        self.polled = False        # registered with the selector (only while bytes are wanted)
        self.buf, self.need = b"", HELLO_FLOATS * 4
        self.hello = None          # (rank, kind, nonce_o) once read
        self.nonce_a = None        # set once the challenge is sent


class Endpoint:
    """This rank's listener plus an acceptor thread that runs the handshake of every incoming
    connection at once and files the proven ones by (kind, peer rank). ``wait(kind, peer)`` hands
    them out. Connections that arrive before ``set_group`` (the secret) wait for it, within their
    deadline."""

    def __init__(self, bind_addr: str, port: int, counters: PlaneCounters, timeout: float | None, rank: int,
                 max_pending: int = 64):
        self.counters = counters
        self.rank = rank            # the acceptor's rank is part of every MAC
        self.timeout = timeout
        self.key: GroupKey | None = None
        self.max_pending = max_pending
        self.refused = 0            # connections closed unproven (strangers, replays, the silent)
        fam = address_family(bind_addr)
        self.listener = socket.socket(fam, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((bind_addr, port))
        except OSError as e:
            self.listener.close()
            raise ValueError(f"cannot listen on {bind_addr}:{port} ({e.strerror}); bind_addr must be an "
                             "address of this host") from None
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.addr = self.listener.getsockname()[:2]
        self._cond = threading.Condition()
        self._ready: dict[tuple[Kind, int], socket.socket] = {}
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread = threading.Thread(target=self._accept_loop, name="inceptionn-accept", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self.addr
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def set_group(self, key: GroupKey) -> None:
        with self._cond:
            self.key = key
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        pending: dict[socket.socket, _Pending] = {}
        seq = 0
        keyed = False

        def poll(p: _Pending, on: bool) -> None:
            if on != p.polled:
                (sel.register if on else sel.unregister)(p.sock, *((selectors.EVENT_READ,) if on else ()))
                p.polled = on

        def drop(p: _Pending) -> None:
            poll(p, False)
            del pending[p.sock]
            self.refused += 1
            p.sock.close()

        try:
            while not self._closed:
                now = time.monotonic()
                if not keyed and self.key is not None:
                    # the deadline of a connection that came before the key counts from the key
                    keyed = True
                    for p in pending.values():
                        p.deadline = max(p.deadline, now + HANDSHAKE_TIMEOUT)
                for p in [p for p in pending.values() if p.deadline == 0.0 or keyed and p.deadline <= now]:
                    drop(p)
                wait = min((p.deadline for p in pending.values() if keyed), default=now + 3600) - now
                for k, _ in sel.select(max(wait, 0)):
                    if k.fileobj is self._wake_r:
                        try:
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                    elif k.fileobj is self.listener:
                        while True:
                            try:
                                sock, _ = self.listener.accept()
                            except (BlockingIOError, InterruptedError):
                                break
                            except OSError:
                                if self._closed:
                                    return
                                break   # out of descriptors and the like: the next round retries
                            sock.setblocking(False)
                            # the answering direction is never tagged (a listener the tagging
                            # shim tagged passes its mark on): set before the challenge goes out
                            _untag(sock)
                            if len(pending) >= self.max_pending:
                                drop(min(pending.values(), key=lambda q: q.seq))
                            p = pending[sock] = _Pending(sock, time.monotonic() + HANDSHAKE_TIMEOUT, seq)
                            seq += 1
                            poll(p, True)
                    elif k.fileobj in pending:
                        self._read(pending[k.fileobj])
                for p in list(pending.values()):
                    st = self._step(p)
                    if st < 0:
                        drop(p)
                    elif st > 0:
                        poll(p, False)
                        del pending[p.sock]
                        self._file(p)
                    else:
                        poll(p, len(p.buf) < p.need)   # a full buffer waits for the key, unpolled
        finally:
            for p in pending.values():
                p.sock.close()
            sel.close()

    @staticmethod
    def _read(p: _Pending) -> None:
        try:
            b = p.sock.recv(p.need - len(p.buf)) if len(p.buf) < p.need else b""
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            b = None
        if b == b"" and len(p.buf) < p.need or b is None:
            p.deadline = 0.0        # closed or broken: dropped in this round
        else:
            p.buf += b

    def _step(self, p: _Pending) -> int:
        """1: proven; -1: drop it; 0: waiting (for bytes, or for the group's key)."""
        if p.deadline == 0.0:
            return -1
        if len(p.buf) < p.need:
            return 0
        key = self.key
        if p.hello is None:
            if key is None:
                return 0
            h = parse_hello(p.buf, key.world)
            if h is None:
                return -1
            try:
                peer = p.sock.getpeername()[0]
            except OSError:
                return -1
            if not same_address(peer, key.hosts[h[0]]):
                return -1         # not from the claimed rank's address
            p.hello = h
            p.nonce_a = os.urandom(NONCE_BYTES)
            mac = key.mac(b"A", h[0], self.rank, int(h[1]), h[2], p.nonce_a)
            msg = np.concatenate([np.array([HELLO_MAGIC, HS_VERSION], dtype=np.float32), encode16(p.nonce_a),
                                  encode16(mac)]).tobytes()
            try:
                if p.sock.send(msg) != len(msg):   # a fresh socket's buffer takes 104 bytes at once
                    return -1
            except OSError:
                return -1
            p.buf, p.need = b"", PROOF_FLOATS * 4
            return 0
        got = decode16(np.frombuffer(p.buf, dtype=np.float32))
        rank, kind, nonce_o = p.hello
        want = key.mac(b"O", rank, self.rank, int(kind), nonce_o, p.nonce_a)
        return 1 if got is not None and hmac.compare_digest(got, want) else -1

    def _file(self, p: _Pending) -> None:
        rank, kind, _ = p.hello
        sock = p.sock
        with self._cond:
            if self._closed:
                sock.close()
                return
            old = self._ready.pop((kind, rank), None)
            if old is not None:
                old.close()
            sock.setblocking(True)
            _set_common(sock, self.timeout)
            self._ready[(kind, rank)] = sock
            self._cond.notify_all()

    def wait(self, kind: Kind, peer: int, timeout: float | None) -> Conn:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (kind, peer) not in self._ready:
                if self._closed:
                    raise ConnectionError("group closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rank {peer} did not open its {kind.name} connection within {timeout:.0f} s "
                                       f"({self.refused} unproven connection(s) refused meanwhile)")
                self._cond.wait(left if left is None else min(left, 1.0))
            sock = self._ready.pop((kind, peer))
        return Conn(sock, kind, peer, self.counters, initiator=False)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, {}
            self._cond.notify_all()
        self._wake()
        self._thread.join(timeout=5)
        try:
            self.listener.close()
        finally:
            for s in (self._wake_r, self._wake_w, *ready.values()):
                s.close()


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """n bytes before the deadline (one deadline for all of them, not one per byte)."""
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("handshake timed out")
        sock.settimeout(left)
        b = sock.recv(n - len(buf))
        if not b:
            raise ConnectionResetError(errno.ECONNRESET, "closed during the handshake")
        buf += b
    return buf


def connect(endpoint: str, *, bind_addr: str | None, key: GroupKey, rank: int, peer: int, kind: Kind,
            tos: int, counters: PlaneCounters, timeout: float | None, connect_timeout: float = 60.0) -> Conn:
    """Open a connection of ``kind`` to ``peer`` and prove it (the handshake above) within
    ``connect_timeout``; tagged kinds get ``tos`` before connect()."""
    from ..shim.tagging import GRADIENT_TOS, tag_socket

    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + connect_timeout
    delay = 0.02
    while True:
        sock = socket.socket(address_family(host), socket.SOCK_STREAM)
        try:
            if kind.tagged:
                tag_socket(sock, tos)
            if bind_addr and bind_addr not in ("0.0.0.0", "::"):
                sock.bind((bind_addr, 0))   # source address on the chosen interface
            _set_common(sock, max(0.01, min(10.0, deadline - time.monotonic())))
            sock.connect((host, port))
            break
        except OSError as e:
            sock.close()
            retry = e.errno in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                                errno.ENETUNREACH) or isinstance(e, socket.timeout)
            if not retry or time.monotonic() > deadline:
                raise ConnectionError(f"rank {rank} cannot open its {kind.name} connection to rank {peer} "
                                      f"at {endpoint}: {e}") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    try:
        if kind.tagged and tos != GRADIENT_TOS:
            # The handshake's floats (integers >= 1) arrive exact only under the paper's mark, which
            # sends floats >= 1.0 verbatim; the per-packet scaled mark (0x24) would scale them below
            # 1.0 and round them. The mark is the packet's, so the flow itself stays negotiated.
            tag_socket(sock, GRADIENT_TOS)
        nonce_o = os.urandom(NONCE_BYTES)
        sock.sendall(hello_msg(key, rank, kind, nonce_o))
        v = np.frombuffer(_recv_exact(sock, CHALLENGE_FLOATS * 4, deadline), dtype=np.float32)
        nonce_a = decode16(v[2:2 + NONCE_BYTES // 2])
        mac = decode16(v[2 + NONCE_BYTES // 2:])
        if v[0] != HELLO_MAGIC or v[1] != HS_VERSION or nonce_a is None or mac is None or \
                not hmac.compare_digest(mac, key.mac(b"A", rank, peer, int(kind), nonce_o, nonce_a)):
            raise ConnectionError(f"rank {rank}: the listener at {endpoint} could not prove it is rank {peer} of "
                                  "this group (it does not know the group's secret)")
        sock.sendall(encode16(key.mac(b"O", rank, peer, int(kind), nonce_o, nonce_a)).tobytes())
        if kind.tagged and tos != GRADIENT_TOS:
            tag_socket(sock, tos)
        _set_common(sock, timeout)
    except ConnectionError:
        sock.close()
        raise
    except OSError as e:
        sock.close()
        raise ConnectionError(f"rank {rank}: handshake of its {kind.name} connection to rank {peer} at {endpoint} "
                              f"failed: {e}") from None
    return Conn(sock, kind, peer, counters, initiator=True)
