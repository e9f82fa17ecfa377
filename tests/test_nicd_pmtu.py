"""The path MTU table of gso's cuts (daemon/nicd_pmtu.c) through the cffi module: a lookup stores
what the kernel says, reads (the data path's) return it without a system call, the refresh
looks every entry up again and forgets one nobody read for NICD_PMTU_IDLE_S refreshes, and
readers racing the refresh never see a torn entry. On loopback only: a route lookup reads the
machine's own tables and changes nothing (MTU changes on real routes: tests/test_nicd_gso.py,
tests/test_nicd_ipv6.py)."""
from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from inceptionn.daemon._datapath import ffi, lib

LO = socket.if_nametoindex("lo")
V4 = socket.inet_aton("127.0.0.1") + bytes(12)
V6 = socket.inet_pton(socket.AF_INET6, "::1")
IP_MTU, IPV6_MTU = 14, 24  # linux/in.h, linux/in6.h


def kernel_says(family: int, addr: str) -> int:
    """The interface's MTU lowered to the route's, asked the same way by hand."""
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        route = s.getsockopt(socket.IPPROTO_IP, IP_MTU) if family == socket.AF_INET else \
            s.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU)
    return min(int(Path("/sys/class/net/lo/mtu").read_text()), route)


LO_MTU = kernel_says(socket.AF_INET, "127.0.0.1")


@pytest.fixture
def pmtu():
    assert lib.nicd_pmtu_init() == 0
    yield
    lib.nicd_pmtu_free()


def get(ifindex: int, v6: int, daddr: bytes) -> int | None:
    mtu = ffi.new("size_t *")
    return int(mtu[0]) if lib.nicd_pmtu_get(ifindex, v6, daddr, mtu) else None


def test_lookup_stores_and_get_reads(pmtu):
    assert get(LO, 0, V4) is None  # nothing stored: the caller looks it up
    assert lib.nicd_pmtu_lookup(LO, 0, V4) == LO_MTU
    assert get(LO, 0, V4) == LO_MTU
    assert get(LO, 1, V4) is None and get(LO + 1000, 0, V4) is None  # family and interface count
    if socket.has_ipv6 and Path("/proc/net/if_inet6").exists():
        want = kernel_says(socket.AF_INET6, "::1")
        assert lib.nicd_pmtu_lookup(LO, 1, V6) == want and get(LO, 1, V6) == want
    assert lib.nicd_pmtu_lookup(0, 0, V4) == 0 and get(0, 0, V4) is None  # no interface: unknown, not stored


def test_refresh_keeps_what_is_read_and_forgets_what_is_not(pmtu):
    lib.nicd_pmtu_lookup(LO, 0, V4)
    other = socket.inet_aton("127.0.0.2") + bytes(12)
    lib.nicd_pmtu_lookup(LO, 0, other)
    for _ in range(lib.NICD_PMTU_IDLE_S - 1):
        assert get(LO, 0, V4) == LO_MTU  # read between refreshes: stays
        lib.nicd_pmtu_refresh()
    assert get(LO, 0, other) == LO_MTU  # one refresh short of its limit: still there
    assert lib.nicd_pmtu_refresh() == 2
    for _ in range(lib.NICD_PMTU_IDLE_S):
        lib.nicd_pmtu_refresh()
    assert get(LO, 0, V4) is None and get(LO, 0, other) is None and lib.nicd_pmtu_refresh() == 0


def test_a_full_set_takes_the_destination_idle_longest(pmtu):
    # 127.0.x.y on loopback: many destinations, some sharing a set; every one is stored and read
    # back while at most 4 share its set, and a lookup never fails for want of room.
    addrs = [socket.inet_aton(f"127.0.{i // 250}.{i % 250 + 1}") + bytes(12) for i in range(600)]
    for a in addrs:
        assert lib.nicd_pmtu_lookup(LO, 0, a) == LO_MTU and get(LO, 0, a) == LO_MTU
    kept = sum(get(LO, 0, a) is not None for a in addrs)
    assert 0 < kept <= 256 and get(LO, 0, addrs[-1]) == LO_MTU


def test_readers_never_see_a_torn_entry(pmtu):
    lib.nicd_pmtu_lookup(LO, 0, V4)
    bad, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            m = get(LO, 0, V4)
            if m != LO_MTU:
                bad.append(m)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(300):  # each refresh rewrites the entry under its seqlock
        lib.nicd_pmtu_refresh()
    stop.set()
    for t in threads:
        t.join()
    assert bad == []
