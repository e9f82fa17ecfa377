"""--queues N spreads one host pair's flows over N queues (issue 31): each queue rule is repeated
per queue with a cBPF match of the 4-tuple's hash (daemon/rules.py, FLOW_HASH), so a flow's
packets all take one queue and different flows between the same two hosts take different ones.

Checked three ways: the rule table itself (no root); the hash programs as the kernel runs them
(xt_bpf) on crafted IPv4 and IPv6 packets against rules.flow_queue, the same hash in Python; and
real tagged connections between one host pair through two daemons with --queues 2, whose ports
are picked with flow_queue so that both queues must carry flows (deterministic: no chance
involved), compressed and restored, with each queue thread's own counters.

The kernel parts need root (namespaces, iptables, ip6tables, NFQUEUE).
"""
from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import socket
import struct

import numpy as np
import pytest

from inceptionn.daemon import rules
from inceptionn.daemon.config import NicdConfig
from inceptionn.kernel_tc import testbed as tbm
from test_nicd import (PY, Transfer, address, assert_restored_or_raw, assert_went_compressed, count_raw_tagged,
                       make_testbed, raw_sent, recon, running_nicd, stats, xtables)

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip6tables"),
                                reason="needs root and ip6tables (namespaces, netfilter)")


# --- the rule table --------------------------------------------------------------------------------

def _without_hash(args: list[str]) -> tuple[list[str], str | None, str]:
    """(the rule without its flow-hash match and queue number, that match's program, the queue)."""
    args = list(args)
    queue = args[args.index("--queue-num") + 1]
    args[args.index("--queue-num") + 1] = "Q"
    program = None
    for at in [i for i, a in enumerate(args) if a == "--bytecode"]:
        if args[at + 1] in {rules.flow_hash_program(i, n, f) for n in (2, 3) for i in range(n) for f in (4, 6)}:
            program = args[at + 1]
            del args[at - 2:at + 2]  # -m bpf --bytecode PROGRAM
            break
    return args, program, queue


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("gso_accept_only", [False, True])
def test_each_queue_rule_repeated_per_queue_with_its_hash(family, gso_accept_only):
    """--queues 3: every rule of --queues 1 becomes 3, in place, the same but for the hash match of
    queue i and queue base+i (egress) or base+3+i (ingress): the bypass choice, chains, matches and
    comment stay. --queues 1 has no hash match (and no --queue-balance: the kernel's hash would
    leave one host pair on one queue)."""
    one = rules.rule_specs(NicdConfig(interfaces=["eth0"], accept_only=gso_accept_only), family)
    cfg = NicdConfig(interfaces=["eth0"], queues=3, accept_only=gso_accept_only)
    three = rules.rule_specs(cfg, family)
    assert len(three) == 3 * len(one)
    for k, (table, args) in enumerate(one):
        assert "--queue-balance" not in args
        base, program, queue = _without_hash(args)
        assert program is None
        ingress = int(queue) in NicdConfig(interfaces=["eth0"]).ingress_queues
        for i in range(3):
            t3, a3 = three[3 * k + i]
            b3, p3, q3 = _without_hash(a3)
            assert (t3, b3) == (table, base), (a3, args)
            assert p3 == rules.flow_hash_program(i, 3, family)
            assert int(q3) == (cfg.ingress_queues if ingress else cfg.egress_queues)[i]


def test_flow_hash_programs_differ_only_in_the_queue():
    for family in (4, 6):
        progs = [rules.flow_hash_program(i, 4, family).split(",") for i in range(4)]
        assert len({p[0] for p in progs}) == 1 and int(progs[0][0]) <= 64  # xt_bpf takes 64 at most
        diff = [j for j in range(len(progs[0])) if len({p[j] for p in progs}) > 1]
        # the JEQ against i, and the early exits' "queue 0?" answer
        assert all(progs[i][j].split()[0] in ("21", "6") for j in diff for i in range(4)), diff
    with pytest.raises(ValueError):
        rules.flow_hash_program(2, 2)


def test_flow_queue_spreads_ports():
    """The Python hash spreads one host pair's consecutive ports about evenly (a sanity check of
    the mixing, not of the kernel: that is the next test)."""
    for n in (2, 3, 4):
        got = [rules.flow_queue("198.18.0.1", "198.18.0.2", p, 5001, n) for p in range(40000, 41000)]
        counts = np.bincount(got, minlength=n)
        assert counts.min() > 1000 / n * 0.8, counts
        got6 = [rules.flow_queue("2001:2::1", "2001:2::2", 5001, p, n) for p in range(40000, 41000)]
        assert np.bincount(got6, minlength=n).min() > 1000 / n * 0.8


# --- the programs in the kernel ---------------------------------------------------------------------

def tcp(sport: int, dport: int, flags: int = 0x10, payload: bytes = b"") -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1000, 1, 5 << 4, flags, 512, 0, 0) + payload


def ipv4(src: str, dst: str, body: bytes, options: bytes = b"") -> bytes:
    """Total length and checksum are filled in by the kernel (IP_HDRINCL)."""
    assert len(options) % 4 == 0
    return struct.pack("!BBHHHBBH", 0x45 + len(options) // 4, 0, 0, 0, 0, 64, 6, 0) \
        + socket.inet_aton(src) + socket.inet_aton(dst) + options + body


def ipv6(src: str, dst: str, body: bytes, next_header: int = 6) -> bytes:
    return struct.pack("!IHBB", 6 << 28, len(body), next_header, 64) + socket.inet_pton(socket.AF_INET6, src) \
        + socket.inet_pton(socket.AF_INET6, dst) + body


SEND = ("import socket,sys; f=socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET; "
        "s=socket.socket(f, socket.SOCK_RAW, socket.IPPROTO_RAW); "
        "[s.sendto(bytes.fromhex(p), (sys.argv[1], 0)) for p in sys.argv[2:]]")


def hash_counts(host, family: int) -> dict[str, int]:
    out = host.run([f"{xtables(family)}-save", "-c", "-t", "raw"], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+):\d+\].*--comment (nq\S+)", line)
        if m:
            found[m[2]] = int(m[1])
    return found


@needs_root
def test_flow_hash_in_the_kernel_equals_flow_queue(tb_name):
    """Each crafted packet matches exactly one queue's program of N (2 and 3), the one
    rules.flow_queue names: random ports, IPv4 with IP options (the ports found after them), and
    the packets without ports to hash (too short; IPv6 behind an extension header), which take
    queue 0."""
    rng = random.Random(31)
    with tbm.Testbed(hosts=2, name=tb_name, ipv6=True) as tb:
        h1, h2 = tb.hosts
        for family in (4, 6):
            for n in (2, 3):
                for i in range(n):
                    h2.run([xtables(family), "-w", "5", "-t", "raw", "-A", "PREROUTING", "-i", h2.ifname,
                            "-s", address(h1, family), "-p", "tcp", "-m", "bpf", "--bytecode",
                            rules.flow_hash_program(i, n, family), "-m", "comment", "--comment", f"nq{n}-{i}"],
                           check=True)
        for family in (4, 6):
            src, dst = address(h1, family), address(h2, family)
            pack = (lambda body: ipv4(src, dst, body)) if family == 4 else (lambda body: ipv6(src, dst, body))
            cases = [(f"ports {sp} -> {dp}", pack(tcp(sp, dp)), rules.flow_queue(src, dst, sp, dp, 2),
                      rules.flow_queue(src, dst, sp, dp, 3))
                     for sp, dp in [(rng.randrange(1, 65536), rng.randrange(1, 65536)) for _ in range(14)]
                     + [(40000 + k, 5001) for k in range(6)]]
            if family == 4:
                sp, dp = 33333, 7
                cases += [("IP options before the ports", ipv4(src, dst, tcp(sp, dp), options=bytes([1] * 8)),
                           rules.flow_queue(src, dst, sp, dp, 2), rules.flow_queue(src, dst, sp, dp, 3)),
                          ("too short for the ports", ipv4(src, dst, b"\x01\x02"), 0, 0)]
            else:
                cases += [("extension header before TCP",
                           ipv6(src, dst, bytes([6, 0, 1, 4, 0, 0, 0, 0]) + tcp(44444, 8), next_header=60), 0, 0),
                          ("too short for the ports", ipv6(src, dst, b"\x01\x02"), 0, 0)]
            assert {c[2] for c in cases} == {0, 1} and {c[3] for c in cases} == {0, 1, 2}  # all queues in play
            for what, packet, q2, q3 in cases:
                before = hash_counts(h2, family)
                h1.run([PY, "-c", SEND, dst, packet.hex()], check=True, timeout=30)
                after = hash_counts(h2, family)
                hit = sorted(k for k in after if after[k] != before.get(k, 0))
                assert hit == [f"nq2-{q2}", f"nq3-{q3}"], f"IPv{family} {what}: matched {hit}, want queues {q2}, {q3}"


# --- one host pair, several flows, two queues --------------------------------------------------------

def ports_spread(src: str, dst: str, n_flows: int, queues: int, first_port: int) -> list[tuple[int, int]]:
    """(sport, dport) of n_flows connections src -> dst, dports from first_port, each sport
    picked so that the flows take the queues in turn (flow k: queue k % queues)."""
    chosen, sports = [], itertools.count(42000)
    for k in range(n_flows):
        dport = first_port + k
        sport = next(p for p in sports if rules.flow_queue(src, dst, p, dport, queues) == k % queues)
        chosen.append((sport, dport))
    return chosen


@needs_root
@pytest.mark.parametrize("family", [4, 6])
def test_one_host_pair_spreads_over_two_queues(tmp_path, small, family, no_leaks):
    """8 concurrent tagged connections h1 -> h2, nicd --queues 2 on both: every stream arrives
    restored (or raw where the rules allow it), and each of the sender's two queue threads
    compressed packets and each of the receiver's restored some; each sender queue saw the hellos
    of the 4 flows the hash gives it. Stopping the daemons leaves none of their queue rules."""
    n_flows, chunk = 8, small.nbytes // 8
    data = [small[k * chunk // 4:(k + 1) * chunk // 4] for k in range(n_flows)]
    with make_testbed(ipv6=family == 6) as tb:
        h1, h2 = tb.hosts
        src, dst = address(h1, family), address(h2, family)
        flows = ports_spread(src, dst, n_flows, 2, 6101)
        count_raw_tagged(h2, family)
        with running_nicd(h1, tmp_path, "--queues", 2) as d1, running_nicd(h2, tmp_path, "--queues", 2) as d2:
            transfers = []
            try:
                for (sport, dport), x in zip(flows, data):
                    transfers.append(Transfer(h1, h2, x.tobytes(), tmp_path, family=family, port=dport,
                                              extra=("--sport", sport)))
                got = [t.finish() for t in transfers]
            finally:
                for t in transfers:
                    t.close()
            s1, s2 = stats(d1.sock), stats(d2.sock)
        c1 = s1["counters"]
        raw = raw_sent(h2, c1, family)
        for h in (h1, h2):  # stopped: only the persistent fail-closed drop is left of nicd's rules
            left = [line for fam in (4, 6) for line in h.run([f"{xtables(fam)}-save"], capture_output=True,
                                                            text=True, check=True).stdout.splitlines()
                    if rules.COMMENT in line and rules.FAILCLOSED_COMMENT not in line]
            assert left == [], left
    for k, (g, x) in enumerate(zip(got, data)):
        assert_restored_or_raw(g, x.tobytes(), recon(x, -10).tobytes(), raw, f"flow {k} {flows[k]}")
    assert c1["flows_negotiated"] == n_flows, c1
    assert c1["egress_compressed"] > 0, c1
    assert_went_compressed(c1, sum(x.nbytes for x in data), f"{n_flows} flows")
    q1, q2 = s1["queues"], s2["queues"]
    assert [q["egress_queue"] for q in q1] == [7100, 7101] and [q["ingress_queue"] for q in q2] == [7102, 7103]
    for i in range(2):
        # the sender's queue i compressed packets, and got the hellos of its 4 flows' SYNs (more if
        # a SYN was retransmitted: never fewer, unless a flow took the other queue)
        assert q1[i]["counters"]["egress_compressed"] > 0, q1
        assert q1[i]["counters"]["hello_sent"] >= n_flows // 2, q1
        # no NAT: the receiver hashes the same 4-tuple, so its queue i restored those flows' packets
        assert q2[i]["counters"]["ingress_restored"] > 0, q2
    assert sum(q["counters"]["ingress_restored"] for q in q2) == s2["counters"]["ingress_restored"]
    assert s2["counters"]["ingress_restored"] == c1["egress_compressed"]
    for key in ("drop_crc", "drop_header", "drop_checksum", "drop_decode", "drop_malformed", "drop_too_big"):
        assert s2["counters"][key] == 0, (key, s2["counters"])
