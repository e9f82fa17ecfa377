"""The soft NIC's flow tables (daemon/nicd_flows.c) tested directly through the cffi module:
SipHash-2-4 against the reference vectors, backward-shift deletion inside a probe chain, a full
table, how a full hello set is shared between parties, expiry, and the one winner of
nicd_hello_take. The tables get known keys and a clock the test moves (the nicd_flows_test_*
hooks), so every slot and set is computed here, not guessed. Also: the counter names come from the C side; the slow
path's conntrack requests (daemon/nicd_conntrack.c) reach the flow they were asked for; the
table under concurrent threads (daemon/tests/stress_nicd_flows.c, under TSan and ASan)."""
from __future__ import annotations

import itertools
import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from inceptionn.daemon._datapath import ffi, lib

# SipHash-2-4 reference vectors (the paper's appendix, the reference implementation's
# vectors.h): key 00 01 .. 0f, message 00 01 .. n-1, for n = 0..32.
SIPHASH_VECTORS = [
    0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
    0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
    0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
    0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
    0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
    0xbed65cf21aa2ee98, 0xd0f2cbb02e3b67c7, 0x93536795e3a33e88, 0xa80c038ccd5ccec8,
    0xb8ad50c6f649af94, 0xbce192de8a85b8ea, 0x17d835b85bbb15f3, 0x2f2e6163076bcfad,
    0xde4daaaca71dc9a5, 0xa6a2506687956571, 0xad87a3535c49ef28, 0x32d892fad841c342,
    0x7127512f72f27cce,
]

TABLE_KEY = bytes(range(16))
NONCE_KEY = bytes(range(16, 32))
CAPACITY = 64            # the smallest table: 64 slots, at most 48 flows (3/4)
HELLO_SETS = 256 // 8    # the smallest hello table: 256 ways in sets of 8
HELLO_TIMEOUT_MS = 75_000
OWNER = (1 << 32) | 1000  # NICD_OWNER_UID(1000): the flows of local user 1000
ROOT, NOBODY = (1 << 32) | 0, (1 << 32) | 65534


def siphash(key: bytes, data: bytes) -> int:
    return int(lib.nicd_flows_test_siphash(key, data, len(data)))


def key(sport: int, dport: int = 5000, saddr: int = 0x0100_12C6, daddr: int = 0x0200_12C6):
    k = ffi.new("struct nicd_flow_key *")
    k.saddr, k.daddr, k.sport, k.dport = saddr, daddr, sport, dport
    return k


def key_hash(k) -> int:
    """The table's hash of a key: SipHash of its 12 bytes as they lie in the struct."""
    return siphash(TABLE_KEY, struct.pack("<IIHH", k.saddr, k.daddr, k.sport, k.dport))


def home(k) -> int:
    return key_hash(k) & (CAPACITY - 1)


def hello_set(k) -> int:
    return (key_hash(k) >> 32) & (HELLO_SETS - 1)


def keys_where(pred, count: int, start: int = 1) -> list:
    """The first ``count`` keys (by source port from ``start``) for which pred(key) holds."""
    found = []
    for sport in itertools.count(start):
        k = key(sport)
        if pred(k):
            found.append(k)
            if len(found) == count:
                return found
        assert sport < 60000, "no such keys"


@pytest.fixture
def tables():
    """Fresh tables with known keys, freed afterwards (the module's tables are process-wide)."""
    assert lib.nicd_flows_init(CAPACITY, 30, CAPACITY) == 0
    lib.nicd_flows_test_keys(TABLE_KEY, NONCE_KEY)
    yield
    lib.nicd_flows_free()


_sent = itertools.count()


def negotiated(k) -> int | None:
    """Our ISN if k is negotiated, as the egress path asks (one new byte each time: fresh data,
    never a retransmission that the give-up rule would count; it refreshes the flow's clock)."""
    fi = ffi.new("struct nicd_flow_info *")
    state = lib.nicd_flows_egress(k, next(_sent), 1, 0, 0, fi)
    return int(fi.isn) if state != lib.NICD_FLOW_NONE else None


def slot(k) -> int:
    return int(lib.nicd_flows_test_slot(k))


def hello(state: int, isn: int = 0, owner: int = 0):
    h = ffi.new("struct nicd_hello *")
    h.state, h.isn, h.owner = state, isn, owner
    return h


def peer_owner(n: int) -> int:
    """An owner of nicd_flows_owner_of_peer's form (a peer's address, hashed)."""
    return (2 << 32) | n


def hello_state(k) -> int:
    h = ffi.new("struct nicd_hello *")
    lib.nicd_hello_get(k, h)
    return int(h.state)


def expire() -> tuple[int, int, int]:
    active, in_flight = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    n = lib.nicd_flows_expire(active, in_flight)
    return int(n), int(active[0]), int(in_flight[0])


def test_siphash_reference_vectors():
    for n, want in enumerate(SIPHASH_VECTORS):
        assert siphash(bytes(range(16)), bytes(range(n))) == want, n


def test_table_and_nonce_use_siphash_with_their_keys(tables):
    k = key(1234)
    assert lib.nicd_flows_negotiate(k, 77, 0, 1460, OWNER) == 0
    assert slot(k) == home(k)
    nonce = ffi.new("uint8_t[6]")
    lib.nicd_flows_nonce(k, 0xDEADBEEF, nonce)
    want = siphash(NONCE_KEY, struct.pack("<IIHHI", k.saddr, k.daddr, k.sport, k.dport, 0xDEADBEEF))
    assert bytes(nonce) == want.to_bytes(8, "little")[:6]


def test_deletion_inside_a_probe_chain_shifts_back(tables):
    # A chain that wraps: A, B, C share home 62; F's home is 0, where it lands between them:
    #   62:A 63:B 0:F 1:C  --forget B-->  62:A 63:C 0:F  (F stays home, C moves back, 1 empty)
    h = CAPACITY - 2
    a, b, c = keys_where(lambda k: home(k) == h, 3)
    (f,) = keys_where(lambda k: home(k) == 0, 1)
    for k, isn in ((a, 1), (b, 2), (f, 3), (c, 4)):
        assert lib.nicd_flows_negotiate(k, isn, 0, 1460, OWNER) == 0
    assert [slot(k) for k in (a, b, f, c)] == [62, 63, 0, 1]

    lib.nicd_flows_forget(b)
    assert negotiated(b) is None and slot(b) == -1
    assert [slot(k) for k in (a, c, f)] == [62, 63, 0]
    assert [negotiated(k) for k in (a, c, f)] == [1, 4, 3]

    # Deleting the chain's head moves the rest up too; the count follows.
    lib.nicd_flows_forget(a)
    assert [slot(k) for k in (c, f)] == [62, 0]
    assert expire() == (0, 2, 0)


def test_a_full_table_refuses_new_flows_only(tables):
    ks = keys_where(lambda k: True, CAPACITY * 3 // 4 + 1)
    for i, k in enumerate(ks[:-1]):
        assert lib.nicd_flows_negotiate(k, i, 0, 1460, OWNER) == 0
    assert lib.nicd_flows_negotiate(ks[-1], 99, 0, 1460, OWNER) == -1  # 3/4 full: new flows stay raw
    assert negotiated(ks[-1]) is None
    assert lib.nicd_flows_negotiate(ks[0], 1000, 0, 1460, OWNER) == 0  # a known flow is still replaced
    assert [negotiated(k) for k in ks[:-1]] == [1000] + list(range(1, len(ks) - 1))
    lib.nicd_flows_forget(ks[5])
    assert lib.nicd_flows_negotiate(ks[-1], 99, 0, 1460, OWNER) == 0 and negotiated(ks[-1]) == 99
    assert expire() == (0, CAPACITY * 3 // 4, 0)


def owned(owner: int) -> int:
    return int(lib.nicd_flows_test_owned(owner))


def test_one_owner_cannot_fill_the_table():
    """flow_owner_cap: an owner at its cap gets NICD_FLOWS_OWNER_FULL (its new flow stays raw)
    while every other owner still negotiates; each way an entry ends gives its place back."""
    assert lib.nicd_flows_init(CAPACITY, 30, 5) == 0
    try:
        lib.nicd_flows_test_keys(TABLE_KEY, NONCE_KEY)
        ks = keys_where(lambda k: True, 40)
        users = [(1 << 32) | uid for uid in range(8)]
        for k in ks[:5]:
            assert lib.nicd_flows_negotiate(k, 1, 0, 1460, users[0]) == 0
        assert lib.nicd_flows_negotiate(ks[5], 1, 0, 1460, users[0]) == lib.NICD_FLOWS_OWNER_FULL == -2
        assert negotiated(ks[5]) is None and owned(users[0]) == 5
        for i, k in enumerate(ks[5:30]):  # five other users, five flows each: all fit
            assert lib.nicd_flows_negotiate(k, 2, 0, 1460, users[1 + i // 5]) == 0
        assert [owned(u) for u in users] == [5] * 6 + [0, 0]
        # a key negotiated again (a new connection on the 4-tuple) moves to its new owner
        assert lib.nicd_flows_negotiate(ks[0], 3, 0, 1460, users[6]) == 0
        assert owned(users[0]) == 4 and owned(users[6]) == 1
        # forget (a new SYN), RST, and expiry each give the owner its place back
        lib.nicd_flows_forget(ks[1])
        assert lib.nicd_flows_close(ks[2], 1) == 1
        assert owned(users[0]) == 2
        for k in ks[3:5]:
            assert lib.nicd_flows_close(k, 0) == 1  # our FIN: lingers, still owned
        assert owned(users[0]) == 2
        lib.nicd_flows_test_advance((lib.NICD_FIN_LINGER_S + 1) * 1000)
        assert expire()[0] == 2 and owned(users[0]) == 0
        assert lib.nicd_flows_negotiate(ks[5], 1, 0, 1460, users[0]) == 0
        # owner 0 (none given) is an owner of its own, never a free slot
        assert lib.nicd_flows_negotiate(ks[30], 1, 0, 1460, 0) == 0 and owned(3 << 32) == 1
        lib.nicd_flows_test_advance(31_000)
        assert expire() == (27, 0, 0) and [owned(u) for u in users] == [0] * 8 and owned(3 << 32) == 0
    finally:
        lib.nicd_flows_free()


def test_the_slow_paths_view_reaches_the_data_path_of_that_connection_only(tables):
    """A negotiated flow's view is unknown (0: its super-packets leave raw) until the slow path
    stores conntrack's answer; the answer is stored only for the connection (our ISN) it was asked
    for, never for a newer one on the 4-tuple; a flow whose view is still unknown asks again
    after NICD_VIEW_RETRY_S (its first request may not have fit the queue)."""
    k = key(4321)
    assert lib.nicd_flows_negotiate(k, 9, 0, 1460, OWNER) == 0
    fi = ffi.new("struct nicd_flow_info *")
    assert lib.nicd_flows_egress(k, 10, 1, 0, 0, fi) == lib.NICD_FLOW_COMPRESS
    assert fi.view.known == 0 and fi.ask_view == 0  # asked when it was negotiated
    v = ffi.new("struct nicd_flow_view *")
    v.known, v.saddr, v.daddr, v.sport, v.dport = 2, 0x0A00_000A, 0x0B00_000B, 1234, 80
    assert lib.nicd_flows_set_view(k, 8, v) == 0  # an answer for another connection's ISN
    lib.nicd_flows_test_advance(lib.NICD_VIEW_RETRY_S * 1000)
    assert lib.nicd_flows_egress(k, 11, 1, 0, 0, fi) == lib.NICD_FLOW_COMPRESS
    assert fi.view.known == 0 and fi.ask_view == 1  # still unknown: ask again,
    assert lib.nicd_flows_egress(k, 12, 1, 0, 0, fi) == lib.NICD_FLOW_COMPRESS and fi.ask_view == 0  # once
    assert lib.nicd_flows_set_view(k, 9, v) == 1
    assert lib.nicd_flows_egress(k, 13, 1, 0, 0, fi) == lib.NICD_FLOW_COMPRESS
    assert (fi.view.known, fi.view.saddr, fi.view.daddr, fi.view.sport, fi.view.dport, fi.ask_view) == \
        (2, 0x0A00_000A, 0x0B00_000B, 1234, 80, 0)
    assert lib.nicd_flows_set_view(key(4322), 9, v) == 0  # no such flow


def wait_answered(n: int) -> None:
    deadline = time.monotonic() + 5
    while lib.nicd_ct_answered() < n:
        assert time.monotonic() < deadline, "the slow path did not answer"
        time.sleep(0.005)


def test_the_slow_path_answers_off_the_asking_thread(tables):
    """nicd_ct_ask only posts: the conntrack thread asks (one question per flow) and stores the
    answer in the flow. Nothing here is tracked by conntrack (no such connection in this
    namespace): the answer is 'as the hook sees them' (1), with the flow's own addresses; that is
    also the answer without a thread (no ctnetlink)."""
    k = key(5555)
    assert lib.nicd_flows_negotiate(k, 21, 0, 1460, OWNER) == 0
    fi = ffi.new("struct nicd_flow_info *")
    before, asked = lib.nicd_ct_answered(), lib.nicd_ct_questions()
    assert lib.nicd_ct_ask(k, 21) == 0  # no thread: answered at once, no question asked
    assert lib.nicd_ct_answered() == before + 1 and lib.nicd_ct_questions() == asked
    assert lib.nicd_flows_egress(k, 22, 1, 0, 0, fi) == lib.NICD_FLOW_COMPRESS and fi.view.known == 1
    assert lib.nicd_ct_start() == 0, "no ctnetlink here (run as root)"
    try:
        k2 = key(5556)
        assert lib.nicd_flows_negotiate(k2, 31, 0, 1460, OWNER) == 0
        before = lib.nicd_ct_answered()
        assert lib.nicd_ct_ask(k2, 31) == 0
        wait_answered(before + 1)
        assert lib.nicd_ct_questions() == asked + 1  # one question, not three
        assert lib.nicd_flows_egress(k2, 32, 1, 0, 0, fi) == lib.NICD_FLOW_COMPRESS
        assert (fi.view.known, fi.view.saddr, fi.view.daddr) == (1, k2.saddr, k2.daddr)
        assert (fi.view.sport, fi.view.dport) == (socket.htons(5556), socket.htons(5000))
    finally:
        lib.nicd_ct_stop()


def test_a_full_request_queue_refuses_without_blocking(tables):
    """The queue threads never wait for the slow path: with NICD_CT_QUEUE requests that its
    thread has not taken (held here by the test hook), nicd_ct_ask says -1 at once; let go, the
    thread answers every request it took."""
    k = key(6000)
    assert lib.nicd_flows_negotiate(k, 41, 0, 1460, OWNER) == 0
    assert lib.nicd_ct_start() == 0
    try:
        lib.nicd_ct_test_hold(1)
        before = lib.nicd_ct_answered()
        t0 = time.monotonic()
        assert all(lib.nicd_ct_ask(k, 41) == 0 for _ in range(lib.NICD_CT_QUEUE))
        assert lib.nicd_ct_ask(k, 41) == -1 and lib.nicd_ct_ask(k, 41) == -1
        assert time.monotonic() - t0 < 1.0 and lib.nicd_ct_answered() == before
        lib.nicd_ct_test_hold(0)
        wait_answered(before + lib.NICD_CT_QUEUE)
        assert lib.nicd_ct_ask(k, 41) == 0  # room again
    finally:
        lib.nicd_ct_test_hold(0)
        lib.nicd_ct_stop()


def test_rst_removes_and_fin_lingers(tables):
    """Our RST removes the flow at once; our FIN leaves it for retransmissions until
    NICD_FIN_LINGER_S idle seconds (each one refreshes it), not the idle timeout (30 s here)."""
    a, b, c = keys_where(lambda k: True, 3)
    for k in (a, b, c):
        assert lib.nicd_flows_negotiate(k, 7, 0, 1460, OWNER) == 0
    assert lib.nicd_flows_close(a, 1) == 1 and negotiated(a) is None and slot(a) == -1
    assert lib.nicd_flows_close(a, 1) == 0  # nothing left to remove
    assert lib.nicd_flows_close(b, 0) == 1 and lib.nicd_flows_close(b, 0) == 0  # the FIN counted once
    linger_ms = lib.NICD_FIN_LINGER_S * 1000
    lib.nicd_flows_test_advance(linger_ms - 1000)
    assert negotiated(b) == 7  # a retransmission after the FIN: still compressed, clock refreshed
    lib.nicd_flows_test_advance(linger_ms - 1000)
    assert expire() == (0, 2, 0)
    lib.nicd_flows_test_advance(2000)
    assert expire() == (1, 1, 0) and negotiated(b) is None
    assert negotiated(c) == 7  # the open flow keeps the whole idle timeout


def test_owner_of_a_peer_is_its_address_or_its_64(tables):
    k1, k2 = key(1000, daddr=0x0200_12C6), key(2000, dport=6000, daddr=0x0200_12C6)
    k3 = key(1000, daddr=0x0300_12C6)
    o = [int(lib.nicd_flows_owner_of_peer(k)) for k in (k1, k2, k3)]
    assert o[0] == o[1] != o[2] and all(x >> 32 == 2 for x in o)

    def key6(last: int, sport: int = 1000):
        k = ffi.new("struct nicd_flow_key *")
        k.v6, k.sport, k.dport = 1, sport, 5000
        k.daddr6 = bytes([0x20, 0x01, 0, 2] + [0] * 11 + [last])
        return k
    o6 = [int(lib.nicd_flows_owner_of_peer(k)) for k in (key6(1), key6(2, 3000))]
    assert o6[0] == o6[1]  # one /64, one owner
    k = key6(1)
    k.daddr6 = bytes([0x20, 0x01, 0, 3] + [0] * 11 + [1])
    assert int(lib.nicd_flows_owner_of_peer(k)) != o6[0]


def test_a_full_hello_set_is_shared_between_parties(tables):
    """A new hello in a full set evicts the oldest of the party holding the most ways, its own
    party counted with it (a tie goes against the network, then against the newcomer); parties:
    each local user (our SENT hellos), and the network (the peers' hellos) as one, within which
    the groups of one peer's hellos to one port of ours compete the same way."""
    sent, peer, answered = lib.NICD_HELLO_SENT, lib.NICD_HELLO_PEER, lib.NICD_HELLO_ANSWERED
    own = lib.NICD_HELLO_EVICTED_OWN
    ks = iter(keys_where(lambda k: hello_set(k) == 5, 40))

    def put(k, state, owner) -> int:
        r = int(lib.nicd_hello_put(k, hello(state, owner=owner)))
        lib.nicd_flows_test_advance(10)  # every hello a different age
        return r

    def present(*keys) -> bool:
        return all(hello_state(k) != lib.NICD_HELLO_NONE for k in keys)

    r1, p1a, p1b = next(ks), next(ks), next(ks)
    assert put(r1, sent, ROOT) == 0 and put(p1a, peer, peer_owner(1)) == 0 and put(p1b, answered, peer_owner(1)) == 0
    flood = [next(ks) for _ in range(21)]
    assert [put(k, sent, NOBODY) for k in flood[:5]] == [0] * 5 and lib.nicd_hello_count() == 8
    assert put(r1, sent, ROOT) == 0  # a replacement evicts nothing (and makes r1 young again)

    # nobody's flood evicts only its own hellos, oldest first: root's and the peer's stay
    assert [put(k, sent, NOBODY) for k in flood[5:15]] == [own] * 10
    assert present(r1, p1a, p1b, *flood[10:15]) and not any(present(k) for k in flood[:10])

    # root's new hellos take nobody's ways until the two hold as many; then root evicts its own
    r2, r3, r4 = next(ks), next(ks), next(ks)
    assert put(r2, sent, ROOT) == 1 and not present(flood[10])   # root 2, nobody 4, network 2
    assert put(r3, sent, ROOT) == 1 and not present(flood[11])   # root 3, nobody 3
    assert put(r4, sent, ROOT) == own and not present(r1)        # root's oldest
    assert put(flood[15], sent, NOBODY) == own and not present(flood[12])
    assert present(r2, r3, r4, *flood[13:16], p1a, p1b) and lib.nicd_hello_count() == 8

    # the network holds fewer ways than either user: a spoofed flood of new addresses evicts
    # only the network's hellos (the oldest owner's first), never a user's
    spoofed = [next(ks) for _ in range(6)]
    assert [put(k, peer, peer_owner(10 + i)) for i, k in enumerate(spoofed)] == [1] * 6
    assert present(r2, r3, r4, *flood[13:16], *spoofed[-2:]) and not present(p1a) and not present(p1b)
    # a real host's flood (spoofed[-1]'s address) to one port of ours evicts its own hellos there
    port = spoofed[-1].sport  # ours: the key is our egress direction
    a, b = [k for k in (key(port, d) for d in range(5001, 60000)) if hello_set(k) == 5][:2]
    assert put(a, peer, peer_owner(15)) == own and not present(spoofed[-1]) and present(spoofed[-2])
    assert put(b, peer, peer_owner(15)) == own and not present(a)
    # its hello to another port is a group of its own: the oldest group's hello goes
    assert put(next(ks), peer, peer_owner(15)) == 1 and not present(spoofed[-2]) and present(b)

    # An expired way is free again: no eviction
    lib.nicd_flows_test_advance(HELLO_TIMEOUT_MS + 1)
    assert put(r1, sent, ROOT) == 0


def test_idle_flows_and_stale_hellos_expire(tables):
    # timeout 30 s; a and b share a home, so expiring a must leave b findable
    a, b = keys_where(lambda k: home(k) == 7, 2)
    (c,) = keys_where(lambda k: home(k) not in (7, 8), 1)
    for k in (a, b, c):
        assert lib.nicd_flows_negotiate(k, 5, 0, 1460, OWNER) == 0
    lib.nicd_flows_test_advance(20_000)
    assert negotiated(b) == 5  # use refreshes its clock
    lib.nicd_flows_test_advance(15_000)
    assert expire() == (2, 1, 0)
    assert slot(b) == 7 and negotiated(b) == 5 and negotiated(a) is None and negotiated(c) is None
    lib.nicd_flows_test_advance(31_000)
    assert negotiated(b) is None  # a lookup past the timeout drops it too
    assert expire() == (0, 0, 0)

    h1, h2 = keys_where(lambda k: True, 2, start=40000)
    lib.nicd_hello_put(h1, hello(lib.NICD_HELLO_SENT))
    lib.nicd_hello_put(h2, hello(lib.NICD_HELLO_PEER))
    lib.nicd_flows_test_advance(HELLO_TIMEOUT_MS - 1000)
    assert hello_state(h1) == lib.NICD_HELLO_SENT and expire()[2] == 2
    lib.nicd_flows_test_advance(2000)
    assert hello_state(h1) == lib.NICD_HELLO_NONE and hello_state(h2) == lib.NICD_HELLO_NONE
    assert expire()[2] == 0 and lib.nicd_hello_count() == 0


def test_hello_take_has_exactly_one_winner(tables):
    k = key(999)
    lib.nicd_hello_put(k, hello(lib.NICD_HELLO_ANSWERED, 1234))
    assert lib.nicd_hello_take(k, lib.NICD_HELLO_SENT, 1234) == 0    # other state
    assert lib.nicd_hello_take(k, lib.NICD_HELLO_ANSWERED, 1235) == 0  # other ISN
    assert hello_state(k) == lib.NICD_HELLO_ANSWERED

    threads, rounds = 4, 300
    start = threading.Barrier(threads)
    wins = [[0] * rounds for _ in range(threads)]

    def racer(t):
        for r in range(rounds):
            start.wait()
            wins[t][r] = lib.nicd_hello_take(k, lib.NICD_HELLO_ANSWERED, r)  # cffi drops the GIL
            start.wait()
            if t == 0:  # the next round's hello, put while the others wait
                lib.nicd_hello_put(k, hello(lib.NICD_HELLO_ANSWERED, r + 1))

    lib.nicd_hello_take(k, lib.NICD_HELLO_ANSWERED, 1234)
    lib.nicd_hello_put(k, hello(lib.NICD_HELLO_ANSWERED, 0))
    workers = [threading.Thread(target=racer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert [sum(wins[t][r] for t in range(threads)) for r in range(rounds)] == [1] * rounds
    assert lib.nicd_hello_count() == 1  # the last round's put, untaken


def test_counter_names_come_from_the_c_list():
    from inceptionn.daemon.datapath import COUNTERS

    assert len(COUNTERS) == lib.NICD_NCOUNTERS == len(set(COUNTERS))
    assert len(ffi.new("struct nicd_stats *").c) == lib.NICD_NCOUNTERS
    assert COUNTERS[0] == "egress_packets" and "tier32" in COUNTERS
    assert ffi.NULL == lib.nicd_counter_name(lib.NICD_NCOUNTERS) == lib.nicd_counter_help(lib.NICD_NCOUNTERS)
    helps = [ffi.string(lib.nicd_counter_help(i)).decode() for i in range(lib.NICD_NCOUNTERS)]
    assert all(len(h) > 10 for h in helps), helps   # every counter says what it counts (the metrics' HELP)


def test_every_setting_the_c_loop_reads_has_its_field():
    from inceptionn.daemon.settings import SETTINGS

    fields = dict(ffi.typeof("struct nicd_config").fields)
    wanted = {s.c_field for s in SETTINGS if s.c_field}
    assert wanted == {"tos_tagged", "tos_scaled", "tos_compressed", "tos_hello", "error_bound", "queue_maxlen",
                      "accept_only", "gso", "trains"}
    assert wanted <= set(fields)


@pytest.mark.parametrize("build", ["tsan", "san"])
def test_the_table_under_concurrent_readers_and_writers(build):
    """daemon/tests/stress_nicd_flows.c: queue threads look flows up and update them without a
    shared lock while writers negotiate, replace, close and expire entries in one long probe
    chain (every deletion shifts it under the readers), and put and take hellos (whose lookup of
    an absent key is lock-free). No wrong or torn entry or hello, no false miss or hit, the books
    balance; under ThreadSanitizer (no data race) and ASan + UBSan."""
    root = Path(__file__).resolve().parent.parent
    target = f"build/stress_nicd_flows_{build}"
    subprocess.run(["make", "-s", "--no-print-directory", target], cwd=root, check=True)
    r = subprocess.run([root / target, "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING: ThreadSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    m = re.search(r"(\d+) lookups \((\d+) hits\), (\d+) negotiations, (\d+) hello lookups, 0 failures", r.stdout)
    assert m and int(m.group(2)) > 1000 and int(m.group(3)) > 1000 and int(m.group(4)) > 1000, r.stdout


@pytest.mark.parametrize("build", ["tsan", "san"])
def test_the_request_queue_under_concurrent_producers(build):
    """daemon/tests/stress_nicd_conntrack.c: four queue threads post conntrack requests at once
    while the conntrack thread drains them, then against a held thread and a full queue: every
    posted request answered exactly once, a held thread answers nothing, a full queue refuses,
    every flow ends with its view; under ThreadSanitizer and ASan + UBSan."""
    root = Path(__file__).resolve().parent.parent
    target = f"build/stress_nicd_conntrack_{build}"
    subprocess.run(["make", "-s", "--no-print-directory", target], cwd=root, check=True)
    r = subprocess.run([root / target], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING: ThreadSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    m = re.search(r"(\d+) requests answered, (\d+) refused \(queue full\), 0 failures", r.stdout)
    assert m and int(m.group(1)) > 1000 and int(m.group(2)) > 0, r.stdout
