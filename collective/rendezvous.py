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

``default_bind_addr()`` picks the address the data sockets use when the caller gives none:
``$INCEPTIONN_BIND_ADDR``, else the only non-loopback IPv4 address of this host (inside a
testbed host: its testbed address), else the first one, else 127.0.0.1.
"""
from __future__ import annotations

import fcntl
import os
import socket
import struct
import tempfile
import time
import urllib.parse
from pathlib import Path


class FileStore:
    """A minimal store in a shared directory: ``set`` writes a file atomically, ``get`` waits for it."""

    def __init__(self, path: str | os.PathLike, timeout: float = 300.0):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.timeout = float(timeout)

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
