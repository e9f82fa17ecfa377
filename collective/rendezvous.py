"""How the ranks of a group find each other: every rank publishes ``host:port`` of its listener
and reads everybody else's.

Three ways in, all giving ``exchange(value) -> [value of rank 0, ..., value of rank N-1]``:

- a key-value **store** with ``set(key, bytes)`` and a blocking ``get(key) -> bytes``:
  ``torch.distributed.TCPStore`` fits, and so does ``FileStore`` below (a directory every rank
  can see: the processes of a namespace testbed share the filesystem). Keys are
  ``<prefix>/ep/<rank>``; two groups on one store need different prefixes.
- **MPI**: ``comm.allgather`` (``MPIExchange``), used by ``Group.from_mpi``.
- **torch.distributed**: ``all_gather_object`` on an initialised process group
  (``TorchExchange``), used by ``Group.from_torch``.

The exchange also makes the group's secret (``group_key``): every rank adds 16 random bytes to
its entry, and the secret is an HMAC of all entries, keyed with ``secret=`` (or
``$INCEPTIONN_GROUP_SECRET``, hex) when the caller gives one. Through MPI or torch.distributed
only the ranks see the entries. A store is as private as its files: ``FileStore`` makes its
directory 0700 and its files 0600 (only the same user, and root, can read them), and reports
``private``; a ``TCPStore`` serves its keys to anyone who can connect, so give such a group a
secret of its own (docs/collectives.md, "Who can connect").

``default_bind_addr()`` picks the address the data sockets use when the caller gives none:
``$INCEPTIONN_BIND_ADDR``, else the only non-loopback IPv4 address of this host (inside a
testbed host: its testbed address), else the first one, else 127.0.0.1.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import socket
import stat
import struct
import tempfile
import time
import urllib.parse
from pathlib import Path


SECRET_ENV = "INCEPTIONN_GROUP_SECRET"
MIN_SECRET_BYTES = 16


class FileStore:
    """A minimal store in a shared directory: ``set`` writes a file atomically (mode 0600), ``get``
    waits for it. A directory it creates is 0700. ``private``: no other user can read or write
    the entries (the directory is this user's and nobody else may write it)."""

    def __init__(self, path: str | os.PathLike, timeout: float = 300.0):
        self.path = Path(path)
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.timeout = float(timeout)
        st = self.path.stat()
        self.private = st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)

    def _file(self, key: str) -> Path:
        return self.path / urllib.parse.quote(str(key), safe="")

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self._file(key))

    def get(self, key: str) -> bytes:
        f = self._file(key)
        deadline = time.monotonic() + self.timeout
        delay = 0.005
        while True:
            try:
                return f.read_bytes()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"store {self.path}: key {key!r} not set within {self.timeout:.0f} s "
                                       "(did every rank start?)") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)


def resolve_secret(secret) -> bytes | None:
    """The caller's secret: ``secret`` (bytes), else ``$INCEPTIONN_GROUP_SECRET`` (hex), else None."""
    where = "secret"
    if secret is None:
        env = os.environ.get(SECRET_ENV, "").strip()
        if not env:
            return None
        try:
            secret = bytes.fromhex(env)
        except ValueError:
            raise ValueError(f"${SECRET_ENV} must be hex digits (e.g. python3 -c 'import secrets; "
                             "print(secrets.token_hex(16))')") from None
        where = f"${SECRET_ENV}"
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"secret must be bytes, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{where} must be at least {MIN_SECRET_BYTES} bytes ({2 * MIN_SECRET_BYTES} hex digits), "
                         f"got {len(secret)}")
    return bytes(secret)


def entry(endpoint: str) -> str:
    """What a rank publishes: its endpoint and its random share of the group's secret."""
    return f"{endpoint} {os.urandom(16).hex()}"


def group_key(entries: list[str], secret: bytes | None):
    """(endpoints, GroupKey) from every rank's entry, the same on every rank."""
    from .transport import GroupKey, parse_endpoint
    endpoints = []
    for r, e in enumerate(entries):
        ep, _, share = str(e).rpartition(" ")
        if len(share) != 32 or not ep or any(c not in "0123456789abcdef" for c in share):
            raise ValueError(f"rendezvous: rank {r}'s entry {str(e)[:60]!r} is not 'host:port share' (a rank of "
                             "another version, or a store shared with another program?)")
        endpoints.append(ep)
    blob = "\n".join(entries).encode()
    key = hmac.new(secret or b"inceptionn group", b"inceptionn group secret v2\n" + blob, hashlib.sha256).digest()
    gid = hashlib.sha256(b"inceptionn group id v2\n" + blob).digest()[:16]
    return endpoints, GroupKey(key, gid, len(entries), tuple(parse_endpoint(ep)[0] for ep in endpoints))


class StoreExchange:
    def __init__(self, store, rank: int, world: int, prefix: str):
        if not (callable(getattr(store, "set", None)) and callable(getattr(store, "get", None))):
            raise TypeError(f"store must have set(key, bytes) and get(key) -> bytes (torch.distributed.TCPStore, "
                            f"FileStore, ...), got {type(store).__name__}")
        self.store, self.rank, self.world, self.prefix = store, rank, world, prefix.rstrip("/")

    def exchange(self, value: str) -> list[str]:
        self.store.set(f"{self.prefix}/ep/{self.rank}", value.encode())
        out = []
        for r in range(self.world):
            raw = self.store.get(f"{self.prefix}/ep/{r}")
            out.append(bytes(raw).decode() if not isinstance(raw, str) else raw)
        return out


class MPIExchange:
    def __init__(self, comm):
        self.comm = comm

    def exchange(self, value: str) -> list[str]:
        return list(self.comm.allgather(value))


class TorchExchange:
    def __init__(self, process_group=None):
        self.pg = process_group

    def exchange(self, value: str) -> list[str]:
        import torch.distributed as dist

        out = [None] * dist.get_world_size(self.pg)
        dist.all_gather_object(out, value, group=self.pg)
        return [str(v) for v in out]


def make_exchange(store, rank: int, world: int, prefix: str):
    if hasattr(store, "exchange") and callable(store.exchange):
        return store
    return StoreExchange(store, rank, world, prefix)


_SIOCGIFFLAGS, _SIOCGIFADDR, _IFF_UP, _IFF_LOOPBACK = 0x8913, 0x8915, 0x1, 0x8


def local_ipv4_addresses() -> list[str]:
    """IPv4 addresses of the interfaces that are up, loopback excluded, in interface order."""
    out = []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req)[16:18])[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
            except OSError:
                continue  # no IPv4 address on it
            out.append(addr)
    finally:
        s.close()
    return out


def default_bind_addr() -> str:
    env = os.environ.get("INCEPTIONN_BIND_ADDR")
    if env:
        return env
    addrs = local_ipv4_addresses()
    return addrs[0] if addrs else "127.0.0.1"
