"""Named network namespaces: create, list, open for netlink, delete, and run programs inside.

Namespaces are the iproute2 kind (a bind mount under /run/netns), so ``ip netns exec`` and
every other tool see them. Netlink work goes through pyroute2; only exec'ing a program needs
an external helper, because pyroute2 cannot exec.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

from pyroute2 import IPRoute
from pyroute2 import netns as _netns

from inceptionn.errors import UserError

NETNS_DIR = "/run/netns"


def _natural_key(name: str):
    # inc-tb-h10 sorts after inc-tb-h9
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def list_netns(prefix: str = "") -> list[str]:
    """Names of the named namespaces starting with ``prefix``, in natural order."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted((n for n in names if n.startswith(prefix)), key=_natural_key)


def exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def create(name: str) -> None:
    """Create a named namespace; it must not exist yet."""
    if exists(name):
        raise UserError(f"network namespace {name!r} already exists")
    _netns.create(name)


@contextmanager
def ipr(name: str | None = None) -> Iterator[IPRoute]:
    """An IPRoute socket bound to namespace ``name`` (None: this process's namespace).

    Never creates the namespace: a typo must not leave a stray namespace behind.
    """
    if name is not None and not exists(name):
        raise UserError(f"network namespace {name!r} does not exist (see `ip netns list`)")
    sock = IPRoute(netns=name, flags=0) if name is not None else IPRoute()
    try:
        yield sock
    finally:
        sock.close()


def pids(name: str) -> list[int]:
    """Processes whose network namespace is ``name``."""
    try:
        target = os.stat(os.path.join(NETNS_DIR, name))
    except FileNotFoundError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # exited meanwhile, or a kernel thread
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.append(int(entry))
    return found


def delete(name: str, grace: float = 2.0) -> None:
    """Stop every process inside ``name``, then remove the namespace.

    Processes are stopped first because a namespace stays alive (just unnamed) as long as
    anything runs in it, and then nothing can find and clean it any more.
    """
    victims = [p for p in pids(name) if p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while victims and time.monotonic() < deadline:
            victims = [p for p in victims if _alive(p)]
            if victims:
                time.sleep(0.02)
        if not victims:
            break
    if exists(name):
        _netns.remove(name)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # a zombie is gone for our purposes: its namespace reference is dropped
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def command(netns: str | None, argv: Sequence[str], *, hostname: str | None = None) -> list[str]:
    """The argv that runs ``argv`` inside namespace ``netns``.

    The one place that decides how programs enter a namespace, so options grow here:
    ``hostname`` gives the program its own UTS namespace with that host name (OpenMPI tells
    nodes apart by hostname, and all namespaces share the machine's otherwise).
    ``ip netns exec`` also remounts /sys so tools see the namespace's own interfaces.
    """
    argv = [str(a) for a in argv]
    if hostname is not None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}", hostname):
            raise UserError(f"bad hostname {hostname!r}")
        argv = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]
    if netns is None:
        return argv
    return ["ip", "netns", "exec", netns, *argv]


def popen(netns: str | None, argv: Sequence[str], *, hostname: str | None = None, **kwargs) -> subprocess.Popen:
    """subprocess.Popen of ``argv`` inside ``netns`` (keyword arguments go to Popen)."""
    return subprocess.Popen(command(netns, argv, hostname=hostname), **kwargs)


def run(netns: str | None, argv: Sequence[str], *, hostname: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of ``argv`` inside ``netns`` (keyword arguments go to run)."""
    return subprocess.run(command(netns, argv, hostname=hostname), **kwargs)
