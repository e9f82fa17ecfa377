"""The soft NIC next to firewalls and other nicd instances (issue 11, section 5).

- A host that drops conntrack INVALID packets (ufw, firewalld, docker hosts) must still receive
  compressed flows: nicd restores them before conntrack sees them.
- Only compressed segments that carry a payload are queued (and dropped while no daemon runs);
  SYNs and pure ACKs of hosts that use the same DSCP pass.
- Several instances in one namespace (other queues, other interfaces): starting, stopping or
  cleaning up after one leaves the others' rules alone.

Needs root (namespaces, iptables, NFQUEUE).
"""
from __future__ import annotations

import os
import re
import signal
import textwrap

import pytest

from test_nicd import (INC, PY, assert_restored_or_raw, compressed_skbs, count_raw_tagged, iptables_save, make_testbed, nicd_transfer,
                       raw_sent, recon, running_nicd, transfer)
from netns_helpers import wait_until
from test_nicd_failclosed import DROP_COMMENT, UnitDaemon, counted, raw_prerouting
from inceptionn.daemon.config import NicdConfig
from inceptionn.daemon.rules import rule_specs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")


# an instance's queue rules on one interface (two tagged marks: a SYN and a data rule each)
N_RULES = len(rule_specs(NicdConfig(interfaces=["eth0"])))


def drop_invalid(host):
    """The usual stateful firewall line, counted."""
    host.run(["iptables", "-w", "5", "-A", "INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-m", "comment",
              "--comment", "nt-invalid", "-j", "DROP"], check=True)


def test_conntrack_invalid_drop_does_not_stall_compressed_flows(tmp_path, small):
    data = small.tobytes()
    # MTU 1500: with gso (the default) the stream still takes over 100 compressed packets
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        for h in (h1, h2):
            drop_invalid(h)
        got, c1, c2, raw = nicd_transfer(h1, h2, data, tmp_path, timeout=45)
        invalid = [counted(h, "nt-invalid", "filter")[0] for h in (h1, h2)]
    assert_restored_or_raw(got, data, recon(small, -10).tobytes(), raw, "through an INVALID-drop firewall")
    assert c1["egress_compressed"] > 100 and c2["ingress_restored"] == c1["egress_compressed"]
    assert invalid == [0, 0], f"conntrack found INVALID packets: {invalid}"


# scapy from h1: TCP segments to h2 with the compressed mark (DSCP 11)
CRAFT = textwrap.dedent("""
    import sys
    from scapy.all import IP, TCP, Raw, conf, send
    conf.verb = 0
    dst, kind, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ip = IP(dst=dst, tos=0x2C)
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (1, 2))]
    pkt = {"syn": ip / TCP(dport=5999, flags="S", options=[("MSS", 1460)]),
           "syn_data": ip / TCP(dport=5999, flags="S") / Raw(b"\\x49\\x11" + bytes(30)),
           "ack": ip / TCP(dport=5999, flags="A", seq=1000, ack=2000),
           "ack_options": ip / TCP(dport=5999, flags="A", seq=1000, ack=2000, options=ts + [("SAck", (5, 9))]),
           "one_byte": ip / TCP(dport=5999, flags="PA", options=ts) / Raw(b"\\x49"),
           "payload": ip / TCP(dport=5999, flags="PA", options=ts) / Raw(b"\\x49\\x11\\0\\0\\1\\0" + bytes(30))}[kind]
    send([pkt] * n, inter=0.002)
""")
NOT_COMPRESSED = ("syn", "syn_data", "ack", "ack_options")  # reach the stack, daemon or not
MAYBE_COMPRESSED = ("one_byte", "payload")                  # queued, or dropped without nicd


def test_only_segments_with_a_payload_are_queued_or_dropped(tmp_path):
    """SYNs and pure ACKs with DSCP 11 (a host using that code point for itself) are not
    compressed packets: they reach the stack, with or without the daemon. Segments with a
    payload go to the queue while nicd runs (and are dropped there, counted) and into the
    fail-closed drop when it does not."""
    per_kind = 4
    with make_testbed(hosts=2) as tb:
        h1, h2 = tb.hosts
        h2.run(["iptables", "-w", "5", "-A", "INPUT", "-p", "tcp", "-m", "dscp", "--dscp", "11", "-m", "comment",
                "--comment", "nt-stack"], check=True)

        def craft(kind):
            r = h1.run([PY, "-c", CRAFT, h2.ip, kind, str(per_kind)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr

        def reached_stack():
            return counted(h2, "nt-stack", "filter")[0]

        with running_nicd(h2, tmp_path) as d2:
            for kind in NOT_COMPRESSED:
                before, queued = reached_stack(), d2.counters()["ingress_packets"]
                craft(kind)
                assert wait_until(lambda: reached_stack() - before == per_kind, 5.0), (kind, reached_stack() - before)
                assert d2.counters()["ingress_packets"] == queued, f"{kind} went to the queue"
            for kind in MAYBE_COMPRESSED:
                before, c = reached_stack(), d2.counters()
                craft(kind)
                assert wait_until(lambda: d2.counters()["ingress_packets"] - c["ingress_packets"] == per_kind, 5.0), kind
                after = d2.counters()
                drops = sum(after[k] - c[k] for k in c if k.startswith("drop_"))
                assert drops == per_kind and after["ingress_restored"] == c["ingress_restored"], (kind, after)
                assert reached_stack() == before, kind
        # the daemon is gone; its drop stays
        for kind in NOT_COMPRESSED:
            before = reached_stack()
            craft(kind)
            assert wait_until(lambda: reached_stack() - before == per_kind, 5.0), (kind, reached_stack() - before)
        for kind in MAYBE_COMPRESSED:
            dropped, before = counted(h2, DROP_COMMENT, "raw")[0], reached_stack()
            craft(kind)
            assert wait_until(lambda: counted(h2, DROP_COMMENT, "raw")[0] - dropped == per_kind, 5.0), kind
            assert reached_stack() == before, kind


def _instance_rules(host, base) -> list[str]:
    return [line for line in iptables_save(host).splitlines() if f"--comment inceptionn-nicd-{base} " in line]


def test_instances_in_one_namespace_leave_each_other_alone(tmp_path, small):
    """Instance A (eth0, queues 7100-7101) keeps its rules and serves a compressed flow while
    instance B (another interface, queues 7200-7201, started and stopped like the unit does)
    starts, stops, starts again, crashes and is cleaned up."""
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        h2.run(["ip", "link", "add", "ntb0", "type", "veth", "peer", "name", "ntb1"], check=True)
        h2.run(["ip", "link", "set", "ntb0", "up"], check=True)
        config_b = tmp_path / "b.toml"
        sock_b = tmp_path / "b.sock"
        config_b.write_text(f'interfaces = ["ntb0"]\nqueue_base = 7200\nsocket = "{sock_b}"\n')
        with running_nicd(h2, tmp_path, tag="-a") as a:
            rules_a = _instance_rules(h2, 7100)
            assert len(rules_a) == N_RULES, iptables_save(h2)
            b = UnitDaemon(h2, config_b, tmp_path / "b1.log")
            try:
                assert _instance_rules(h2, 7100) == rules_a, "starting B changed A's rules"
                assert len(_instance_rules(h2, 7200)) == N_RULES
                assert b.stop_like_systemd(signal.SIGTERM) == 0  # ExecStopPost: --cleanup, no arguments
                assert _instance_rules(h2, 7100) == rules_a, "stopping B changed A's rules"
                assert _instance_rules(h2, 7200) == []
                assert f"removed {N_RULES} rule(s)" in (tmp_path / "b1.log").read_text()
                saved = iptables_save(h2)
                assert saved.count(DROP_COMMENT) == 2 and "-i ntb0" in saved, saved  # both drops stay
                assert a.sock.exists(), "B's cleanup removed A's socket"

                b = UnitDaemon(h2, config_b, tmp_path / "b2.log")
                assert "stale" not in (tmp_path / "b2.log").read_text(), "B found stale rules after a clean stop"
                assert iptables_save(h2).count(DROP_COMMENT) == 2, "B's drop was installed twice"
                b.kill()  # a crash: B's rules stay until a cleanup
                assert len(_instance_rules(h2, 7200)) == N_RULES and sock_b.exists()
                r = h2.run([INC, "nicd", "--cleanup", "--config", str(config_b)], capture_output=True, text=True,
                           timeout=30)
                assert r.returncode == 0 and f"removed {N_RULES} rule(s)" in r.stderr, r.stderr
                assert _instance_rules(h2, 7200) == [] and not sock_b.exists()
                assert _instance_rules(h2, 7100) == rules_a, "--cleanup removed a running instance's rules"
                r = h2.run([INC, "nicd", "--uninstall"], capture_output=True, text=True, timeout=30)
                assert r.returncode == 2 and "7100" in r.stderr, r.stderr
            finally:
                b.kill()
            count_raw_tagged(h2)
            with running_nicd(h1, tmp_path) as d1:
                got = transfer(h1, h2, small[:100_000].tobytes(), tmp_path)
                c1, ca = d1.counters(), a.counters()
            raw = raw_sent(h2, c1)
    assert_restored_or_raw(got, small[:100_000].tobytes(), recon(small[:100_000], -10).tobytes(), raw,
                           "through A after B's lifecycle")
    assert c1["egress_compressed"] > 0 and ca["ingress_restored"] == c1["egress_compressed"]


def test_rules_go_ahead_of_the_hosts_accept_rules(tmp_path, small):
    """Hosts whose chains already ACCEPT everything early (a firewall's "allow" lines) would let
    tagged packets skip the egress queue and compressed ones skip the ingress queue: nicd's
    rules go first. A count-only rule already at the top stays there and sees the wire."""
    data = small[:200_000].tobytes()
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        for h in (h1, h2):
            for table, chain in (("raw", "PREROUTING"), ("mangle", "PREROUTING"), ("mangle", "POSTROUTING")):
                h.run(["iptables", "-w", "5", "-t", table, "-A", chain, "-p", "tcp", "-m", "dscp", "--dscp", "11",
                       "-m", "comment", "--comment", f"nt-count-{table}-{chain}"], check=True)
                h.run(["iptables", "-w", "5", "-t", table, "-A", chain, "-m", "comment", "--comment",
                       f"nt-accept-{table}-{chain}", "-j", "ACCEPT"], check=True)
        count_raw_tagged(h2)
        with running_nicd(h1, tmp_path) as d1, running_nicd(h2, tmp_path) as d2:
            got = transfer(h1, h2, data, tmp_path)
            c1, c2 = d1.counters(), d2.counters()
            order = [re.search(r"--comment (\S+)", line).group(1) for line in raw_prerouting(h2)]
        on_wire = counted(h2, "nt-count-raw-PREROUTING", "raw")[0]
        raw = raw_sent(h2, c1)
    assert_restored_or_raw(got, data, recon(small[:200_000], -10).tobytes(), raw, "past the hosts' ACCEPT rules")
    assert c1["egress_compressed"] > 0 and c2["ingress_restored"] == c1["egress_compressed"]
    assert on_wire >= compressed_skbs(c1, c2), "the count-only rule was pushed behind the queue"
    # the compressed queue, the queue of segments that look compressed without the mark, the drop
    assert order == ["nt-rawtagged", "nt-count-raw-PREROUTING", "inceptionn-nicd-7100", "inceptionn-nicd-7100", DROP_COMMENT,
                     "nt-accept-raw-PREROUTING"]
