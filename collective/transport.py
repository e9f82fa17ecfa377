"""TCP plumbing of the collectives: one listener per rank, typed connections, exact reads.

Every rank listens on one TCP port (``bind_addr``). A connection is opened by the rank that
*sends* on it, and says who it is with a 16-byte hello of four float32 values, all integers in
``[1, 2^24)``: ``[MAGIC, group token, rank + 1, kind]``. Floats >= 1.0 travel unchanged through
the INCEPTIONN codec (NO_COMPRESS tier), so even the hello of a tagged socket is float32 data the
soft NIC may touch without changing it: a tagged stream carries float32 values and nothing else,
from its first byte.

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
``data`` (every other data direction, WA weights included) and ``control``.
"""
from __future__ import annotations

import enum
import errno
import socket
import struct
import threading
import time

import numpy as np

HELLO_MAGIC = 4_718_593          # < 2^24: exact in float32
HELLO_BYTES = 16
FRAME = struct.Struct("<I")      # length prefix of a codec blob on an untagged data socket
MAX_TOKEN = (1 << 23) - 1


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


def hello_bytes(token: int, rank: int, kind: Kind) -> bytes:
    return np.array([HELLO_MAGIC, token + 1, rank + 1, int(kind)], dtype=np.float32).tobytes()


def parse_hello(raw: bytes) -> tuple[int, int, Kind] | None:
    v = np.frombuffer(raw, dtype=np.float32)
    if v.size != 4 or not np.all(np.isfinite(v)) or v[0] != HELLO_MAGIC:
        return None
    token, rank, kind = int(v[1]) - 1, int(v[2]) - 1, int(v[3])
    if kind not in Kind._value2member_map_:
        return None
    return token, rank, Kind(kind)


class Endpoint:
    """This rank's listener plus an acceptor thread that files incoming connections by
    (kind, peer rank). ``wait(kind, peer)`` hands them out."""

    def __init__(self, bind_addr: str, port: int, counters: PlaneCounters, timeout: float | None):
        self.counters = counters
        self.timeout = timeout
        self.token: int | None = None
        self.world: int | None = None
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
        self.addr = self.listener.getsockname()[:2]
        self._cond = threading.Condition()
        self._ready: dict[tuple[Kind, int], socket.socket] = {}
        self._pending: list[tuple[bytes, socket.socket]] = []   # arrived before the token was known
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._accept_loop, name="inceptionn-accept", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self.addr
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def set_group(self, token: int, world: int) -> None:
        with self._cond:
            self.token, self.world = token, world
            pending, self._pending = self._pending, []
        for raw, sock in pending:
            self._file(raw, sock)

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # listener closed
            try:
                sock.settimeout(10.0)  # a hello that never comes must not block the acceptor
                raw = b""
                while len(raw) < HELLO_BYTES:
                    b = sock.recv(HELLO_BYTES - len(raw))
                    if not b:
                        raise ConnectionError("closed before hello")
                    raw += b
            except OSError:
                sock.close()
                continue
            with self._cond:
                if self.token is None:
                    self._pending.append((raw, sock))
                    continue
            self._file(raw, sock)

    def _file(self, raw: bytes, sock: socket.socket) -> None:
        h = parse_hello(raw)
        with self._cond:
            if h is None or h[0] != self.token or not 0 <= h[1] < (self.world or 0) or self._closed:
                sock.close()  # a stranger, or a connection of another group: ignore it
                return
            _, peer, kind = h
            old = self._ready.pop((kind, peer), None)
            if old is not None:
                old.close()
            _set_common(sock, self.timeout)
            # the answering direction of an accepted connection is never tagged
            if sock.family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, 0)
            else:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0)
            self._ready[(kind, peer)] = sock
            self._cond.notify_all()

    def wait(self, kind: Kind, peer: int, timeout: float | None) -> Conn:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (kind, peer) not in self._ready:
                if self._closed:
                    raise ConnectionError("group closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"rank {peer} did not open its {kind.name} connection within {timeout:.0f} s")
                self._cond.wait(left if left is None else min(left, 1.0))
            sock = self._ready.pop((kind, peer))
        return Conn(sock, kind, peer, self.counters, initiator=False)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ready, self._ready = self._ready, {}
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self._thread.join(timeout=5)
        for s in list(ready.values()) + [s for _, s in pending]:
            s.close()


def connect(endpoint: str, *, bind_addr: str | None, token: int, rank: int, peer: int, kind: Kind,
            tos: int, counters: PlaneCounters, timeout: float | None, connect_timeout: float = 60.0) -> Conn:
    """Open a connection of ``kind`` to ``peer``; tagged kinds get ``tos`` before connect()."""
    host, port = parse_endpoint(endpoint)
    deadline = time.monotonic() + connect_timeout
    delay = 0.02
    while True:
        sock = socket.socket(address_family(host), socket.SOCK_STREAM)
        try:
            if kind.tagged:
                from ..shim.tagging import tag_socket
                tag_socket(sock, tos)
            if bind_addr and bind_addr not in ("0.0.0.0", "::"):
                sock.bind((bind_addr, 0))   # source address on the chosen interface
            _set_common(sock, min(10.0, connect_timeout))
            sock.connect((host, port))
            _set_common(sock, timeout)
            sock.sendall(hello_bytes(token, rank, kind))
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
    return Conn(sock, kind, peer, counters, initiator=True)
