"""The netfilter rules that feed nicd's queues, and the drop that keeps ingress closed without it.

iptables (nf_tables backend through the xtables compat layer): this kernel has no native nft
`queue` statement. Every rule below exists twice, for IPv4 (iptables) and IPv6 (ip6tables), made
from the one table in rule_specs: the same chains, queues, comments and bypass choices; only the
length threshold and the cBPF programs differ (an IPv6 header is 40 bytes, no IHL). A host
without ip6tables or without IPv6 in its kernel gets the IPv4 rules and one log line saying IPv6
is not covered. A namespace that merely has disable_ipv6=1 still gets both: one sysctl write
turns IPv6 on again, and the rules cost nothing meanwhile.

With --queues N > 1 every queue rule below is N rules, one per queue, each also matching a cBPF
hash of the packet's addresses and ports (flow_hash_program, FLOW_HASH), so one host pair's flows
spread over the N queues and each flow keeps to one. No packet mark is read or written.

Each instance's rules carry the comment ``inceptionn-nicd-<queue_base>`` (its first queue
number, unique among the instances of a network namespace, since two processes cannot bind one
queue), so an instance finds exactly its own rules in both families, also after a crash, and
leaves the other instances' alone. Rules are inserted at the top of their chains,
in order, ahead of whatever firewall the host has (behind leading rules that only count or
drop, see _top).

Egress (mangle POSTROUTING -o IFACE, after conntrack saw the original segment), may fail open
(--queue-bypass):
  tagged TCP SYN (DSCP of `tos` or of `tos_scaled`, one rule each)
                                  -> egress queue: remember the ISN, mark "soft NIC here"
  tagged TCP, IP length >= 100 (IPv6: >= 120) (one rule per mark)
                                  -> egress queue: compress (pure ACKs and tiny segments,
                                     which could never shrink, never cost a queue round trip)
  tagged TCP with FIN or RST (one rule per mark; the long ones took the rule above)
                                  -> egress queue: the flow's entry ends (nicd_flows_close)
  any TCP SYN-ACK                 -> egress queue: answer a peer's hello
Ingress:
  raw PREROUTING -i IFACE: `tos_compressed` TCP with a payload, not a SYN (MAY_BE_COMPRESSED)
                                  -> ingress queue, NO bypass: fail closed, TCP retransmits.
                                     In raw, before conntrack, so conntrack and every firewall
                                     rule see the restored lengths (an INVALID-drop rule would
                                     otherwise stall the flow)
  raw PREROUTING -i IFACE: TCP without `tos_compressed` whose payload starts like a shim header
                                     (LOOKS_COMPRESSED) -> ingress queue, bypass: a compressed
                                     packet whose DSCP a router rewrote. nicd restores it if its
                                     TCP checksum is wrong by exactly the mark (counted as
                                     `ingress_marks_rewritten`), and passes anything else
                                     untouched. Without nicd the stack drops such a packet by
                                     its checksum, so this rule needs no fail-closed twin
  mangle PREROUTING -i IFACE: SYN / SYN-ACK with `tos_hello` -> ingress queue, bypass: without
                                     us the flow stays raw. Left after conntrack: nicd restores
                                     the ToS byte and removes its 16-byte hello option; conntrack
                                     looks at neither (a SYN has no payload; options are skipped
                                     by length)
Persistent (comment ``inceptionn-failclosed``), raw PREROUTING right after the queue rule:
  the same compressed match -> DROP. Installed on start, kept by stop, crash and `--cleanup`,
  removed only by `inceptionn nicd --uninstall`: a peer keeps compressing the flows it
  negotiated while this daemon restarts or stays down, and those bytes must never reach an
  application. While the daemon runs, the queue rule takes the packets first (an accepted
  verdict leaves the chain), and a restored packet no longer carries the compressed mark.
"""
from __future__ import annotations

import ipaddress
import logging
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..shim import contract
from .config import NicdConfig

# + "-<queue_base>" per instance (inceptionn/inceptionn_contract.h); "-" keeps it unquoted in
# `iptables -S`, which list_ours and the status probe of shim/mpirun.py read.
COMMENT = contract.RULE_COMMENT
FAILCLOSED_COMMENT = contract.FAILCLOSED_COMMENT  # the persistent drops, all instances
TABLES = ("raw", "mangle")
FAMILIES = (4, 6)
_TOOL = {4: "iptables", 6: "ip6tables"}
# Smallest tagged IP packet worth a queue round trip: 20 (IP) + up to 60 (TCP) + 20 bytes of
# payload; below that the 11-byte shim header and tag words leave nothing to gain.
MIN_QUEUED_LENGTH = 100
# The same for IPv6: ip6tables' `-m length` counts the 40-byte header too (xt_length:
# payload_len + sizeof(struct ipv6hdr)), so 40 + 60 + 20.
MIN_QUEUED_LENGTH6 = 120
IPV6_HDR_LEN, IPPROTO_TCP = 40, 6


def _cbpf(*insns: tuple[int, int, int, int]) -> str:
    """A classic BPF program in the form `-m bpf --bytecode` takes."""
    return ",".join([str(len(insns))] + [" ".join(map(str, i)) for i in insns])


# Classic BPF opcodes (linux/filter.h); xt_bpf runs the program on the IP packet.
_LDX_IPHDR, _LDB_X, _LD_LEN, _TXA, _TAX = 0xB1, 0x50, 0x80, 0x87, 0x07
_ADD_K, _ADD_X, _RSH_K, _AND_K, _JGE_X, _JGT_X, _JSET_K, _RET_K = 0x04, 0x0C, 0x74, 0x54, 0x3D, 0x2D, 0x45, 0x06
_SUB_K, _LDH_X, _JEQ_K, _LDX_IMM = 0x14, 0x48, 0x15, 0x01
# Matches a TCP packet that could be a compressed segment: not a SYN, and a payload after the
# headers (compressed segments always carry one, an 11-byte shim header at least), so SYNs and
# pure ACKs of hosts that happen to use the compressed DSCP are never queued or dropped. A
# packet too short for a TCP header matches too: nicd drops and counts it. (u32 cannot test
# "payload of 1 byte or more", and a length match cannot see the header lengths.)
# A = IP + TCP header length, with X = IP header length (4 instructions, no jumps)
_HEADERS_LEN = ((_LDB_X, 0, 0, 12), (_RSH_K, 0, 0, 2), (_AND_K, 0, 0, 0x3C), (_ADD_X, 0, 0, 0))
MAY_BE_COMPRESSED = _cbpf(
    (_LDX_IPHDR, 0, 0, 0),   # 0  X = IP header length
    (_TXA, 0, 0, 0),         # 1
    (_ADD_K, 0, 0, 20),      # 2  A = IP header + the smallest TCP header
    (_TAX, 0, 0, 0),         # 3
    (_LD_LEN, 0, 0, 0),      # 4  A = packet length
    (_JGE_X, 1, 0, 0),       # 5  room for a TCP header? -> 7
    (_RET_K, 0, 0, 1),       # 6  no: malformed, match (nicd counts it)
    (_LDX_IPHDR, 0, 0, 0),   # 7  X = IP header length
    (_LDB_X, 0, 0, 13),      # 8  A = TCP flags
    (_JSET_K, 0, 1, 0x02),   # 9  SYN? -> 10, else 11
    (_RET_K, 0, 0, 0),       # 10 a SYN: no match
    *_HEADERS_LEN,           # 11-14 A = IP + TCP header length
    (_TAX, 0, 0, 0),         # 15
    (_LD_LEN, 0, 0, 0),      # 16
    (_JGT_X, 0, 1, 0),       # 17 anything after the headers? -> 18, else 19
    (_RET_K, 0, 0, 1),       # 18 a payload: match
    (_RET_K, 0, 0, 0),       # 19 a pure ACK: no match
)
# The first two bytes of a compressed payload: magic 0x49, version 2 in the high nibble (the low
# one is the codec, masked off), and the shim header's length (nicd_packet.h;
# tests/test_nicd_routed.py checks them against the C constants).
SHIM_START, SHIM_START_MASK, SHIM_LEN = 0x4920, 0xFFF0, 11
# Matches a TCP segment, not a SYN, whose payload holds a shim header's worth of bytes and starts
# with SHIM_START: what a compressed packet looks like after a router rewrote its DSCP. Only a
# candidate: nicd tells by its TCP checksum (wrong by exactly NICD_CSUM_MARK) and lets every
# other packet through untouched.
# After the header lengths are in A: does a shim header's worth of payload start with SHIM_START?
_SHIM_AT_PAYLOAD = (
    (_ADD_K, 0, 0, SHIM_LEN),  # +0
    (_TAX, 0, 0, 0),         # +1  X = payload offset + a shim header
    (_LD_LEN, 0, 0, 0),      # +2
    (_JGE_X, 0, 7, 0),       # +3  room for a shim header? -> +4, else +11
    (_TXA, 0, 0, 0),         # +4
    (_SUB_K, 0, 0, SHIM_LEN),  # +5
    (_TAX, 0, 0, 0),         # +6  X = payload offset
    (_LDH_X, 0, 0, 0),       # +7  A = the payload's first two bytes
    (_AND_K, 0, 0, SHIM_START_MASK),  # +8 any codec
    (_JEQ_K, 0, 1, SHIM_START),  # +9 -> +10, else +11
    (_RET_K, 0, 0, 1),       # +10 looks compressed: match
    (_RET_K, 0, 0, 0),       # +11 no match
)
LOOKS_COMPRESSED = _cbpf(
    (_LDX_IPHDR, 0, 0, 0),   # 0  X = IP header length
    (_LDB_X, 0, 0, 13),      # 1  A = TCP flags
    (_JSET_K, 0, 1, 0x02),   # 2  SYN? -> 3, else 4
    (_RET_K, 0, 0, 0),       # 3  a SYN: no match
    *_HEADERS_LEN,           # 4-7 A = IP + TCP header length
    *_SHIM_AT_PAYLOAD,       # 8-19
)

# The IPv6 versions read a fixed 40-byte header. Only a TCP header right after it (next header
# at byte 6 is TCP) is parsed: nicd refuses compressed packets behind extension headers. So
# MAY_BE_COMPRESSED6 matches any other packet (the rule's `-p tcp` already found TCP behind
# the extension headers, and a compressed-marked one must be refused, queued or dropped: fail
# closed), while LOOKS_COMPRESSED6, which only looks for rewritten marks, never matches one.
_LDB_ABS = 0x30


def _tcp6_not_syn(other: int) -> tuple:
    """Instructions 0-13 of an IPv6 program: return ``other`` for a packet without a whole TCP
    header right after the IPv6 header, 0 for a SYN, else go on with A = 40 + TCP header length."""
    return (
        (_LDB_ABS, 0, 0, 6),     # 0  A = next header
        (_JEQ_K, 1, 0, IPPROTO_TCP),  # 1  TCP right after the header? -> 3
        (_RET_K, 0, 0, other),   # 2  extension headers
        (_LDX_IMM, 0, 0, IPV6_HDR_LEN + 20),  # 3  X = IPv6 + the smallest TCP header
        (_LD_LEN, 0, 0, 0),      # 4  A = packet length
        (_JGE_X, 1, 0, 0),       # 5  room for a TCP header? -> 7
        (_RET_K, 0, 0, other),   # 6  no: malformed
        (_LDB_ABS, 0, 0, IPV6_HDR_LEN + 13),  # 7  A = TCP flags
        (_JSET_K, 0, 1, 0x02),   # 8  SYN? -> 9, else 10
        (_RET_K, 0, 0, 0),       # 9  a SYN: no match
        (_LDB_ABS, 0, 0, IPV6_HDR_LEN + 12), (_RSH_K, 0, 0, 2), (_AND_K, 0, 0, 0x3C),
        (_ADD_K, 0, 0, IPV6_HDR_LEN),  # 10-13 A = IPv6 + TCP header length
    )


MAY_BE_COMPRESSED6 = _cbpf(
    *_tcp6_not_syn(1),       # 0-13 extension headers or malformed: match (nicd refuses, counts)
    (_TAX, 0, 0, 0),         # 14
    (_LD_LEN, 0, 0, 0),      # 15
    (_JGT_X, 0, 1, 0),       # 16 anything after the headers? -> 17, else 18
    (_RET_K, 0, 0, 1),       # 17 a payload: match
    (_RET_K, 0, 0, 0),       # 18 a pure ACK: no match
)
LOOKS_COMPRESSED6 = _cbpf(
    *_tcp6_not_syn(0),       # 0-13
    *_SHIM_AT_PAYLOAD,       # 14-25
)

# --queues N > 1: which queue a flow's packets take. The kernel's own spreading (NFQUEUE
# --queue-balance) hashes the two addresses and the protocol only (hash_v4, hash_v6 in
# include/net/netfilter/nf_queue.h), so one host pair's flows all reached one queue; and xt_HMARK,
# which does hash the ports, overwrites the whole packet mark (skb->mark = hash: no mask), which
# policy routing, other tools and the gso raw send (it copies the original's mark) read. So each
# queue rule is repeated per queue i with a cBPF match that hashes the packet's 4-tuple and
# matches when the hash picks i: no mark is read or written. One flow's packets always pick the
# same queue (the flow table's give-up bookkeeping and the FIN/RST close expect one thread to
# see a flow's packets in order), the egress rules all hash the same way, and egress and ingress
# each spread over their own queues (the hash is not symmetric; it need not be).
# FLOW_HASH (flow_queue is the same in Python, for the tests): x = the XOR of the address words
# (IPv4: 2, IPv6: 8, as loaded: big-endian) and the word (sport << 16 | dport); x ^= x >> 16;
# i = ((x * FLOW_HASH_MUL mod 2^32) >> 16) mod N. A packet too short for its ports, or an IPv6
# one with extension headers before TCP (nicd sends it raw or refuses it, with no flow state),
# takes queue 0.
FLOW_HASH_MUL = 0x9E3779B1  # 2^32 / the golden ratio, odd (Knuth's multiplicative hash)
_LDW_ABS, _LDW_X, _XOR_X, _MUL_K, _MOD_K, _JGE_K = 0x20, 0x40, 0xAC, 0x24, 0x94, 0x35


def flow_hash_program(i: int, n: int, family: int = 4) -> str:
    """The cBPF match of queue i of n (see FLOW_HASH above), for iptables' `-m bpf --bytecode`."""
    if not 0 <= i < n:
        raise ValueError(f"queue {i} of {n}")
    short = (_RET_K, 0, 0, int(i == 0))  # no ports to hash: queue 0
    if family == 4:
        head = (
            (_LDX_IPHDR, 0, 0, 0),   # 0  X = IP header length
            (_TXA, 0, 0, 0),         # 1
            (_ADD_K, 0, 0, 4),       # 2
            (_TAX, 0, 0, 0),         # 3  X = IP header + the two ports
            (_LD_LEN, 0, 0, 0),      # 4
            (_JGE_X, 1, 0, 0),       # 5  room for the ports? -> 7
            short,                   # 6
            (_LDX_IPHDR, 0, 0, 0),   # 7
            (_LDW_X, 0, 0, 0),       # 8  A = sport << 16 | dport
            (_TAX, 0, 0, 0),         # 9
            (_LDW_ABS, 0, 0, 12), (_XOR_X, 0, 0, 0), (_TAX, 0, 0, 0),  # 10-12 ^= source address
            (_LDW_ABS, 0, 0, 16), (_XOR_X, 0, 0, 0),                   # 13-14 ^= destination address
        )
    else:
        head = (
            (_LDB_ABS, 0, 0, 6),     # 0  A = next header
            (_JEQ_K, 1, 0, IPPROTO_TCP),  # 1  TCP right after the header? -> 3
            short,                   # 2  extension headers
            (_LD_LEN, 0, 0, 0),      # 3
            (_JGE_K, 1, 0, IPV6_HDR_LEN + 4),  # 4  room for the ports? -> 6
            short,                   # 5
            (_LDW_ABS, 0, 0, IPV6_HDR_LEN),  # 6  A = sport << 16 | dport
            *[insn for off in range(8, 40, 4)  # 7-30 ^= each word of both addresses
              for insn in ((_TAX, 0, 0, 0), (_LDW_ABS, 0, 0, off), (_XOR_X, 0, 0, 0))],
        )
    return _cbpf(
        *head,
        (_TAX, 0, 0, 0),             # +0 X = x
        (_RSH_K, 0, 0, 16),          # +1
        (_XOR_X, 0, 0, 0),           # +2 A = x ^ (x >> 16)
        (_MUL_K, 0, 0, FLOW_HASH_MUL),  # +3
        (_RSH_K, 0, 0, 16),          # +4
        (_MOD_K, 0, 0, n),           # +5
        (_JEQ_K, 0, 1, i),           # +6 this queue's? -> +7, else +8
        (_RET_K, 0, 0, 1),           # +7
        (_RET_K, 0, 0, 0),           # +8
    )


def flow_queue(saddr: str, daddr: str, sport: int, dport: int, n: int) -> int:
    """Which of n queues (0-based) the rules send the TCP packets saddr:sport -> daddr:dport to:
    FLOW_HASH in Python (addresses as text, IPv4 or IPv6)."""
    x = (sport << 16) | dport
    for addr in (saddr, daddr):
        packed = ipaddress.ip_address(addr).packed
        for off in range(0, len(packed), 4):
            x ^= int.from_bytes(packed[off:off + 4], "big")
    x ^= x >> 16
    return (((x * FLOW_HASH_MUL) & 0xFFFFFFFF) >> 16) % n


# Per family: (smallest queued packet, MAY_BE_COMPRESSED, LOOKS_COMPRESSED)
_FAMILY_MATCH = {4: (MIN_QUEUED_LENGTH, MAY_BE_COMPRESSED, LOOKS_COMPRESSED),
                 6: (MIN_QUEUED_LENGTH6, MAY_BE_COMPRESSED6, LOOKS_COMPRESSED6)}
QUEUE_PROC = Path("/proc/self/net/netfilter/nfnetlink_queue")  # this network namespace's
log = logging.getLogger("inceptionn.nicd")


def instance_comment(cfg: NicdConfig) -> str:
    return f"{COMMENT}-{cfg.queue_base}"


def _iptables(*args: str, check: bool = True, family: int = 4) -> subprocess.CompletedProcess:
    tool = _TOOL[family]
    exe = shutil.which(tool)
    if exe is None:
        raise UserError(f"{tool} is not installed (apt-get install iptables)")
    # A session (process group) of its own: a terminal's Ctrl-C (or `timeout`) signals the whole foreground
    # group, and an iptables killed while it lists the rules of a stopping daemon once read as
    # "no rules", leaving rules behind. The daemon's own handler decides what a signal means.
    r = subprocess.run([exe, "-w", "5", *args], capture_output=True, text=True, start_new_session=True)
    if check and r.returncode != 0:
        raise UserError(f"{tool} {' '.join(args)}: {_failure(r)}")
    return r


def _failure(r: subprocess.CompletedProcess) -> str:
    """What went wrong, in one line (iptables adds a "Try `iptables -h'" line to usage errors)."""
    if r.returncode < 0:
        return f"killed by {signal.Signals(-r.returncode).name}"
    lines = [line.strip() for line in r.stderr.splitlines() if line.strip() and not line.startswith("Try `")]
    return "; ".join(lines) or f"failed (exit {r.returncode})"


def ipv6_missing() -> str | None:
    """Why this network namespace gets no IPv6 rules, None when it does: ip6tables missing, a
    kernel without IPv6, or an ip6tables that cannot read its tables (while iptables can)."""
    if shutil.which(_TOOL[6]) is None:
        return "ip6tables is not installed"
    if not Path("/proc/self/net/if_inet6").exists():  # /proc/self/net: visible under ProcSubset=pid
        return "the kernel has no IPv6 (ipv6.disable=1?)"
    r = _iptables("-t", "raw", "-S", "PREROUTING", check=False, family=6)
    if r.returncode > 0 and not _denied(r.stderr):
        return f"ip6tables cannot read its raw table: {_failure(r)}"
    return None


def _denied(text: str) -> bool:
    """An iptables error that means "not allowed here" (no CAP_NET_ADMIN), not a broken table."""
    return "Permission denied" in text or "must be root" in text


def families() -> tuple[int, ...]:
    """The address families whose rules exist here: IPv4 always, IPv6 unless ipv6_missing() names
    a reason (each asking runs ip6tables)."""
    return FAMILIES if ipv6_missing() is None else (4,)


def _queue_target(queue: int, bypass: bool) -> list[str]:
    return ["-j", "NFQUEUE", "--queue-num", str(queue)] + (["--queue-bypass"] if bypass else [])


def _to_queues(table: str, args: list[str], queues: range, bypass: bool, family: int) -> list[tuple[str, list[str]]]:
    """One queue rule per queue of ``queues``: the rule itself for one queue, else one copy per
    queue i that also matches FLOW_HASH's i (flow_hash_program), so each flow has exactly one."""
    if len(queues) == 1:
        return [(table, args + _queue_target(queues[0], bypass))]
    return [(table, args + ["-m", "bpf", "--bytecode", flow_hash_program(i, len(queues), family)]
             + _queue_target(q, bypass)) for i, q in enumerate(queues)]


def _dscp(tos: int) -> list[str]:
    return ["-m", "dscp", "--dscp", str(tos >> 2)]


def _compressed(cfg: NicdConfig, ifname: str, family: int) -> list[str]:
    """Ingress match of a compressed segment: what the queue takes and the drop refuses."""
    return (["PREROUTING", "-i", ifname, "-p", "tcp"] + _dscp(cfg.tos_compressed)
            + ["-m", "bpf", "--bytecode", _FAMILY_MATCH[family][1]])


def rule_specs(cfg: NicdConfig, family: int = 4) -> list[tuple[str, list[str]]]:
    """This instance's queue rules of one address family as (table, iptables/ip6tables
    arguments from the chain name on), in order within each chain."""
    tag = ["-m", "comment", "--comment", instance_comment(cfg)]
    min_length, _, looks_compressed = _FAMILY_MATCH[family]
    specs = []
    for ifname in cfg.interfaces:
        out = ["POSTROUTING", "-o", ifname, "-p", "tcp"]
        inn = ["PREROUTING", "-i", ifname, "-p", "tcp"]
        marks = (cfg.tos, cfg.tos_scaled)  # the paper's codec, the scaled one: the mark picks it
        queued = []  # (table, matches, queues, bypass), each spread over its queues below
        if cfg.accept_only:  # the same tagged packets through a queue each way, nothing else
            queued += [("mangle", out + _dscp(m), cfg.egress_queues, True) for m in marks]
            queued += [("mangle", inn + _dscp(m), cfg.ingress_queues, True) for m in marks]
        else:
            queued += [("mangle", out + ["--tcp-flags", "SYN,ACK", "SYN"] + _dscp(m), cfg.egress_queues, True)
                      for m in marks]
            queued += [("mangle", out + ["-m", "length", "--length", f"{min_length}:65535"] + _dscp(m),
                       cfg.egress_queues, True) for m in marks]
            queued += [("mangle", out + ["!", "--tcp-flags", "FIN,RST", "NONE"] + _dscp(m), cfg.egress_queues, True)
                      for m in marks]
            queued += [
                ("mangle", out + ["--tcp-flags", "SYN,ACK", "SYN,ACK"], cfg.egress_queues, True),
                ("raw", _compressed(cfg, ifname, family), cfg.ingress_queues, False),
                ("raw", inn + ["-m", "dscp", "!", "--dscp", str(cfg.tos_compressed >> 2), "-m", "bpf", "--bytecode",
                               looks_compressed], cfg.ingress_queues, True),
                ("mangle", inn + ["--tcp-flags", "SYN", "SYN"] + _dscp(cfg.tos_hello), cfg.ingress_queues, True),
            ]
        for table, match, queues, bypass in queued:
            specs += _to_queues(table, match + tag, queues, bypass, family)
    return specs


def failclosed_specs(cfg: NicdConfig, family: int = 4) -> list[tuple[str, list[str]]]:
    """The persistent drops of compressed segments of one address family, one per interface."""
    tag = ["-m", "comment", "--comment", FAILCLOSED_COMMENT]
    return [("raw", _compressed(cfg, ifname, family) + tag + ["-j", "DROP"]) for ifname in cfg.interfaces]


def install(cfg: NicdConfig) -> None:
    """Insert this instance's rules at the top of their chains (after removing its stale ones),
    then make sure the persistent drops sit below them; in both address families, or in IPv4
    alone (said in one line) where IPv6 is missing."""
    removed = remove_instance(cfg.queue_base)
    if sum(removed.values()):
        log.warning("removed %s stale nicd rule(s) of queue base %d left by an earlier run",
                    describe(removed), cfg.queue_base)
    fams = families()
    if 6 not in fams:  # (asks again for the reason: only where IPv6 is missing, once per start)
        log.warning("IPv6 is not covered: %s; only IPv4 packets are compressed and restored", ipv6_missing())
    n = 0
    try:
        for family in fams:
            specs = rule_specs(cfg, family)
            placed: dict[tuple[str, str], int] = {}  # (table, chain) -> the position of our next rule
            for table, (chain, *rest) in specs:
                if (table, chain) not in placed:
                    placed[table, chain] = _top(table, chain, family)
                # -I at increasing positions: at the top of the chain, in our order.
                _iptables("-t", table, "-I", chain, str(placed[table, chain]), *rest, family=family)
                placed[table, chain] += 1
            n += len(specs)
            for table, (chain, *rest) in failclosed_specs(cfg, family):
                # A drop kept from an earlier run already sits below the rules just inserted above it.
                if _iptables("-t", table, "-C", chain, *rest, check=False, family=family).returncode != 0:
                    _iptables("-t", table, "-I", chain, str(placed.get((table, chain)) or _top(table, chain, family)),
                              *rest, family=family)
                    log.info("installed the fail-closed drop of compressed IPv%d packets on %s", family, rest[1])
    except UserError:
        remove_instance(cfg.queue_base)
        raise
    log.info("installed %d netfilter rules (%s) on %s", n, " and ".join(f"IPv{f}" for f in fams),
             ", ".join(cfg.interfaces))


def describe(removed: dict[int, int]) -> str:
    """How many rules a remove_* call deleted, per family: "6 rule(s) (IPv4), 6 (IPv6)"."""
    text = f"{removed.get(4, 0)} rule(s) (IPv4)"
    return text + (f", {removed[6]} (IPv6)" if 6 in removed else "")


def _top(table: str, chain: str, family: int = 4) -> int:
    """Where our rules go in a chain: ahead of every rule that could accept, divert or rewrite
    a packet (or a compressed one could reach the stack unrestored, or lose its mark), behind
    leading rules that only count or drop it (a wire counter, loss emulation, docker's raw
    drops), so those keep seeing packets as they cross the wire."""
    r = _iptables("-t", table, "-S", chain, check=False, family=family)
    pos = 1
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        if not line.startswith("-A "):
            continue
        args = shlex.split(line)
        target = next((v for k, v in zip(args, args[1:]) if k in ("-j", "-g")), None)
        if target not in (None, "DROP") or _comment(args) is not None:
            break  # also stop at our own rules, the fail-closed drop above all
        pos += 1
    return pos


def _comment(args: list[str]) -> str | None:
    """Our comment on a rule (iptables -S words), None for anyone else's."""
    try:
        comment = args[args.index("--comment") + 1]
    except (ValueError, IndexError):
        return None
    # Only numbered instances: no version that wrote a bare COMMENT was ever installed.
    if comment == FAILCLOSED_COMMENT or re.fullmatch(rf"{COMMENT}-\d+", comment):
        return comment
    return None


@dataclass
class Rule:
    table: str
    args: list[str]  # as iptables -S prints it: "-A", chain, matches..., target
    comment: str
    family: int = 4  # 6: an ip6tables rule

    @property
    def queue_base(self) -> int | None:
        """The instance a queue rule belongs to; None for the drops."""
        m = re.fullmatch(rf"{COMMENT}-(\d+)", self.comment)
        return int(m.group(1)) if m else None

    @property
    def failclosed(self) -> bool:
        return self.comment == FAILCLOSED_COMMENT

    def _value(self, *flags: str) -> str | None:
        return next((v for k, v in zip(self.args, self.args[1:]) if k in flags), None)

    @property
    def queues(self) -> range:
        """The NFQUEUE numbers the rule feeds (empty for a drop)."""
        if (num := self._value("--queue-num")) is not None:
            return range(int(num), int(num) + 1)
        if (balance := self._value("--queue-balance")) is not None:
            lo, _, hi = balance.partition(":")
            return range(int(lo), int(hi or lo) + 1)
        return range(0)

    @property
    def interface(self) -> str | None:
        return self._value("-i", "-o")


def check_access() -> None:
    """Refuse early, in one line, when iptables cannot read the rules (not root, no
    CAP_NET_ADMIN): a cleanup that silently found nothing would look like success."""
    _iptables("-t", "raw", "-S", "PREROUTING")


def parse_listing(table: str, text: str, family: int = 4) -> list[Rule]:
    """Our rules in what `iptables -t TABLE -S` (family 6: ip6tables) printed."""
    found = []
    for line in text.splitlines():
        if not line.startswith("-A "):
            continue
        args = shlex.split(line)
        if (comment := _comment(args)) is not None:
            found.append(Rule(table, args, comment, family))
    return found


def list_ours(fams: tuple[int, ...] | None = None) -> list[Rule]:
    """Every rule nicd put in this network namespace, in ``fams`` (default families()): all
    instances, and the drops. A listing that fails is an error, never "no rules" (that once made
    a stop leave rules and say done); only a family this namespace cannot have is not listed."""
    found = []
    for family in families() if fams is None else fams:
        for table in TABLES:
            found += parse_listing(table, _iptables("-t", table, "-S", family=family).stdout, family)
    return found


def _delete(rules: list[Rule], counts: dict[int, int]) -> None:
    for rule in rules:
        if _iptables("-t", rule.table, "-D", *rule.args[1:], check=False, family=rule.family).returncode == 0:
            counts[rule.family] += 1


def bound_queues() -> set[int]:
    """Queue numbers some process has bound in this network namespace (the kernel lists them
    per namespace; an instance dies with its netlink socket, so a crashed daemon's are gone)."""
    try:
        text = QUEUE_PROC.read_text()
    except FileNotFoundError:  # nfnetlink_queue not loaded: nobody can have bound a queue
        return set()
    except OSError as exc:  # guessing "none" here would remove running instances' rules
        raise UserError(f"cannot tell which nicd instances run: {QUEUE_PROC}: {exc.strerror}") from None
    return parse_bound(text)


def parse_bound(text: str) -> set[int]:
    """The bound queue numbers in the text of QUEUE_PROC (first column of each line)."""
    return {int(words[0]) for words in map(str.split, text.splitlines()) if words and words[0].isdigit()}


def _remove_until_gone(select, attempts: int = 3) -> dict[int, int]:
    """Delete the rules ``select`` picks from list_ours() until a listing shows none left;
    returns how many were deleted per family ({4: n, 6: n}; no 6 where IPv6 is missing, see
    describe()). Raises UserError if some stay (or no listing succeeds) after ``attempts``
    rounds: a failed -D or listing is retried, never taken for success."""
    fams = families()  # once: a later answer could name a family n has no count for
    n, problem = dict.fromkeys(fams, 0), ""
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.2 * attempt)
        try:
            left = [r for r in list_ours(fams) if select(r)]
        except UserError as exc:
            problem = str(exc)
            continue
        if not left:
            return n
        _delete(left, n)
        problem = f"{len(left)} rule(s) left: " + "; ".join(
            ("ip6tables " if r.family == 6 else "") + " ".join(r.args) for r in left)
    raise UserError(f"could not remove every nicd rule ({problem})")


def remove_instance(queue_base: int) -> dict[int, int]:
    """Delete one instance's queue rules (never the drops); returns how many."""
    return _remove_until_gone(lambda r: r.queue_base == queue_base)


def remove_dead() -> dict[int, int]:
    """Delete the queue rules of every instance whose queues nobody has bound (a stopped or
    crashed daemon), leaving running instances and the drops alone: what `--cleanup` does."""
    bound = bound_queues()
    return _remove_until_gone(lambda r: not r.failclosed and r.queue_base not in bound)


def running_instances() -> list[int]:
    bound = bound_queues()
    return sorted({r.queue_base for r in list_ours() if r.queue_base is not None and r.queue_base in bound})


def remove_everything() -> dict[int, int]:
    """Delete every nicd rule of every instance and the fail-closed drops: `--uninstall`."""
    return _remove_until_gone(lambda r: True)


# --- another namespace's soft NIC, seen from outside (inceptionn mpirun's report) --------------------

_SECTION = "@@inceptionn-rules@@"


def probe_script() -> str:
    """A shell script printing what probe_status reads, in the namespace it runs in: our tables'
    rules in both families (a missing ip6tables prints no rules) and the bound queues. Needs
    no Python there."""
    parts = [f"echo {_SECTION} {t} {f}; {_TOOL[f]} -w 5 -t {t} -S 2>&1" for f in FAMILIES for t in TABLES]
    parts.append(f"echo {_SECTION} queues; cat {QUEUE_PROC} 2>/dev/null")
    return "; ".join(parts)


@dataclass
class ProbeStatus:
    denied: bool          # iptables could not read the rules (not root)
    rules: list[Rule]     # ours, the drops included
    bound: set[int]       # queue numbers some process has bound

    @property
    def queue_rules(self) -> list[Rule]:
        return [r for r in self.rules if not r.failclosed]

    @property
    def queues(self) -> list[int]:
        """Every queue the instances' rules feed."""
        return sorted({q for r in self.queue_rules for q in r.queues})

    @property
    def interfaces(self) -> list[str]:
        return list(dict.fromkeys(r.interface for r in self.queue_rules if r.interface))

    @property
    def unread(self) -> list[int]:
        """Queues fed by rules that no daemon reads (a stopped or crashed instance)."""
        return sorted(set(self.queues) - self.bound)


def probe_status(output: str) -> ProbeStatus:
    """Read the output of probe_script."""
    rules, bound, denied = [], set(), False
    for section in output.split(_SECTION)[1:]:
        title, _, body = section.partition("\n")
        name, _, family = title.strip().partition(" ")
        if name == "queues":
            bound = parse_bound(body)
        elif name in TABLES and family in ("4", "6"):
            denied |= _denied(body)
            rules += parse_listing(name, body, int(family))
    return ProbeStatus(denied, rules, bound)


_EPHEMERAL = "@@inceptionn-ephemeral@@"
_PROBE = f"{probe_script()}; echo {_EPHEMERAL}; cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null"


def nic_status(host=None) -> dict:
    """Whether nicd runs in ``host``'s namespace (None: here): its rules are installed and every
    queue they feed has a listener (probe_status reads both). Also reads the namespace's
    ephemeral port range."""
    argv = ["sh", "-c", _PROBE]
    try:
        out = subprocess.run(host.command(argv) if host else argv, capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"state": "unknown", "running": False, "detail": f"cannot check: {exc}"}
    rules_text, _, eph_text = out.partition(_EPHEMERAL)
    status: dict = {"ephemeral_ports": None}
    eph = eph_text.split()
    if len(eph) == 2 and all(x.isdigit() for x in eph):
        status["ephemeral_ports"] = [int(eph[0]), int(eph[1])]
    nic = probe_status(rules_text)
    if nic.denied:
        status.update(state="unknown", running=False, detail="cannot read netfilter rules (needs root)")
        return status
    queues, ifaces = nic.queues, nic.interfaces
    status.update(interfaces=ifaces, queues=queues)
    if not nic.queue_rules:
        status.update(state="stopped", running=False,
                      detail="soft NIC not running: tagged packets leave this host uncompressed")
    elif missing := nic.unread:
        status.update(state="stale", running=False,
                      detail=f"soft NIC not running: its rules are left but no daemon reads "
                             f"queue{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                             "(`inceptionn nicd --cleanup` removes them)")
    else:
        status.update(state="running", running=True,
                      detail=f"soft NIC running ({', '.join(ifaces)}; queues {_ranges(queues)})")
    return status


def _ranges(nums: list[int]) -> str:
    return f"{nums[0]}-{nums[-1]}" if nums and nums == list(range(nums[0], nums[-1] + 1)) and len(nums) > 1 \
        else ",".join(str(n) for n in nums)
