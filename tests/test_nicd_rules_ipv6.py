"""IPv6 (issue 23, part 1): nicd's netfilter rules exist in ip6tables too, made from the same table
as the IPv4 ones (daemon/rules.py), and the testbeds speak IPv6 on 2001:2::/48 (RFC 5180).

Everything is checked against the kernel: the rules as ``ip6tables -S`` reads them back, the cBPF
programs by the counters of real rules that crafted IPv6 packets cross, the fail-closed drop by
real TCP connections whose bytes do or do not arrive. No daemon runs while IPv6 TCP crosses a
queue rule (the IPv6 data path is the C side's part of the issue).

Needs root (namespaces, iptables, ip6tables).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess

import pytest

from inceptionn.daemon import rules
from inceptionn.daemon.config import NicdConfig
from inceptionn.kernel_tc import testbed as tbm
from inceptionn.shim import contract
from test_nicd import INC, PY, running_nicd

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip6tables"), reason="needs root and ip6tables (namespaces, netfilter)")

CFG = NicdConfig(interfaces=["eth0"])
TAG = rules.instance_comment(CFG)
DROP = rules.FAILCLOSED_COMMENT


def ours(host, tool: str = "ip6tables") -> list[str]:
    """Our rules in ``host`` as `-S` prints them, "table: -A ..." per line."""
    found = []
    for table in rules.TABLES:
        out = host.run([tool, "-w", "5", "-t", table, "-S"], capture_output=True, text=True, check=True).stdout
        found += [f"{table}: {line}" for line in out.splitlines() if "inceptionn" in line]
    return found


def queue_targets(lines: list[str]) -> list[tuple[str, str, str]]:
    """(table, chain, NFQUEUE target) of each queue rule: what must be equal in both families."""
    out = []
    for line in lines:
        table, _, rule = line.partition(": ")
        if TAG in rule:
            out.append((table, rule.split()[1], rule[rule.index("-j NFQUEUE"):]))
    return out


def nicd(host, *args, env=None) -> subprocess.CompletedProcess:
    return host.run([INC, "nicd", *args], capture_output=True, text=True, timeout=60, env=env)


def test_daemon_installs_both_families_and_removes_them(tmp_path, tb_name):
    """Start: every IPv4 rule has its ip6tables twin (same chains, queues, bypass, comment) with the
    IPv6 length threshold and programs, and the v6 drop. Stop removes the v6 queue rules, a crash
    leaves them to --cleanup, the drop stays until --uninstall. The mpirun status probe sees both."""
    with tbm.Testbed(hosts=1, name=tb_name, ipv6=True) as tb:
        (h,) = tb.hosts
        for run in ("stop", "crash"):
            with running_nicd(h, tmp_path, tag=run) as d:
                v4, v6 = ours(h, "iptables"), ours(h)
                assert len([x for x in v6 if TAG in x]) == len(rules.rule_specs(CFG, 6)) == 10, v6
                assert queue_targets(v6) == queue_targets(v4), (v4, v6)
                assert sum(DROP in x for x in v6) == 1 and sum(DROP in x for x in v4) == 1
                text6 = "\n".join(v6)
                assert text6.count(rules.MAY_BE_COMPRESSED6) == 2 and rules.MAY_BE_COMPRESSED not in text6
                assert text6.count(rules.LOOKS_COMPRESSED6) == 1
                assert text6.count("--length 120:65535") == 2 and "--length 100:" not in text6
                assert "installed 20 netfilter rules (IPv4 and IPv6) on eth0" in d.log_text()
                probe = rules.probe_status(h.run(["sh", "-c", rules.probe_script()], capture_output=True,
                                                 text=True).stdout)
                assert {r.family for r in probe.queue_rules} == {4, 6} and len(probe.queue_rules) == 2 * len(rules.rule_specs(CFG))
                assert probe.unread == [] and probe.interfaces == ["eth0"]
                if run == "crash":
                    d.kill()
            if run == "stop":
                assert "removed 10 rule(s) (IPv4), 10 (IPv6)" in d.log_text(), d.log_text()
        # the crashed daemon left its rules in both families
        assert len([x for x in ours(h) if TAG in x]) == len(rules.rule_specs(CFG))
        r = nicd(h, "--cleanup", "--socket", str(tmp_path / "x.sock"))
        assert r.returncode == 0 and "removed 10 rule(s) (IPv4), 10 (IPv6)" in r.stderr, r.stderr
        assert len(ours(h)) == 1 and DROP in ours(h)[0]
        r = nicd(h, "--uninstall", "--socket", str(tmp_path / "x.sock"))
        assert r.returncode == 0 and "removed 1 rule(s) (IPv4), 1 (IPv6)" in r.stderr, r.stderr
        assert ours(h) == [] and ours(h, "iptables") == []


def test_without_ip6tables_ipv4_only_in_one_line(tmp_path, tb_name):
    """A host without ip6tables: the daemon runs with its IPv4 rules and says in one line that IPv6
    is not covered; stop and --uninstall work on IPv4 alone."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("iptables", "ip"):
        (bindir / tool).symlink_to(shutil.which(tool))
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    assert shutil.which("ip6tables", path=env["PATH"]) is None
    with tbm.Testbed(hosts=1, name=tb_name, ipv6=True) as tb:
        (h,) = tb.hosts
        d = h.popen([INC, "nicd", "-i", h.ifname, "--socket", str(tmp_path / "n.sock")], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            for line in d.stdout:
                lines.append(line)
                if "nicd: ready" in line:
                    break
            assert [x for x in lines if "IPv6" in x] == [
                x for x in lines if "IPv6 is not covered: ip6tables is not installed" in x], lines
            assert sum("IPv6 is not covered" in x for x in lines) == 1, lines
            assert len([x for x in ours(h, "iptables") if TAG in x]) == len(rules.rule_specs(CFG)) and ours(h) == []
            d.send_signal(signal.SIGTERM)
            rest = d.stdout.read()
            assert d.wait(timeout=30) == 0, rest
        finally:
            if d.poll() is None:
                d.kill()
                d.wait()
        assert "removed 10 rule(s) (IPv4);" in rest, rest
        r = nicd(h, "--uninstall", "--socket", str(tmp_path / "n.sock"), env=env)
        assert r.returncode == 0 and r.stderr.strip().endswith("removed 1 rule(s) (IPv4)"), r.stderr
        assert ours(h, "iptables") == []


# --- crafted IPv6 packets ------------------------------------------------------------------------

def tcp(sport: int, flags: int = 0x10, payload: bytes = b"", options: bytes = b"") -> bytes:
    """A TCP segment (checksum left 0: the rules under test run before TCP looks at it)."""
    assert len(options) % 4 == 0
    return struct.pack("!HHIIBBHHH", sport, 9, 1000, 1, (5 + len(options) // 4) << 4, flags, 512, 0, 0) \
        + options + payload


def ipv6(src: str, dst: str, body: bytes, next_header: int = 6, tclass: int = 0) -> bytes:
    head = struct.pack("!IHBB", (6 << 28) | (tclass << 20), len(body), next_header, 64)
    return head + socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst) + body


def dest_options(next_header: int = 6) -> bytes:
    """An 8-byte destination options extension header holding only padding (PadN)."""
    return bytes([next_header, 0, 1, 4, 0, 0, 0, 0])


SHIM = bytes([0x49, 0x21]) + bytes(9) + b"compressed words"   # version 2, codec 1, then the header

# IPv6 packets use header-included raw sockets: IPPROTO_RAW implies IPV6_HDRINCL on Linux.
SEND = ("import socket,sys; s=socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW); "
        "[s.sendto(bytes.fromhex(p), (sys.argv[1], 0)) for p in sys.argv[2:]]")


def send(host, dst: str, *packets: bytes) -> None:
    host.run([PY, "-c", SEND, dst, *(p.hex() for p in packets)], check=True, timeout=30)


def counts(host, table: str = "raw") -> dict[str, int]:
    """Packets seen by each rule whose comment starts with nt6- (ip6tables)."""
    out = host.run(["ip6tables-save", "-c", "-t", table], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+):\d+\].*--comment (\S+)", line)
        if m and (m[2].startswith("nt6-") or m[2] == DROP):
            found[m[2]] = int(m[1])
    return found


def test_cbpf_programs_on_real_ipv6_packets(tb_name):
    """MAY_BE_COMPRESSED6 and LOOKS_COMPRESSED6 as the kernel runs them (xt_bpf, raw PREROUTING of
    the receiver) on crafted IPv6 packets, one at a time."""
    with tbm.Testbed(hosts=2, name=tb_name, ipv6=True) as tb:
        h1, h2 = tb.hosts
        for name, prog in (("may", rules.MAY_BE_COMPRESSED6), ("looks", rules.LOOKS_COMPRESSED6)):
            h2.run(["ip6tables", "-w", "5", "-t", "raw", "-A", "PREROUTING", "-i", h2.ifname, "-s", h1.ip6,
                    "-p", "tcp", "-m", "bpf", "--bytecode", prog, "-m", "comment", "--comment", f"nt6-{name}"],
                   check=True)
        nop8 = bytes([1] * 8)  # 8 bytes of TCP options: the payload starts at 40 + 28
        cases = [  # (what, packet, MAY_BE_COMPRESSED6, LOOKS_COMPRESSED6)
            ("pure ACK", ipv6(h1.ip6, h2.ip6, tcp(1001)), 0, 0),
            ("shim payload", ipv6(h1.ip6, h2.ip6, tcp(1002, payload=SHIM)), 1, 1),
            ("shim payload after TCP options", ipv6(h1.ip6, h2.ip6, tcp(1003, payload=SHIM, options=nop8)), 1, 1),
            ("options read as payload", ipv6(h1.ip6, h2.ip6, tcp(1004, options=SHIM[:2] + bytes(10))), 0, 0),
            ("other payload", ipv6(h1.ip6, h2.ip6, tcp(1005, payload=b"GET / HTTP/1.1\r\n")), 1, 0),
            ("SYN with shim payload", ipv6(h1.ip6, h2.ip6, tcp(1006, flags=0x02, payload=SHIM)), 0, 0),
            ("shim start, shorter than a shim header", ipv6(h1.ip6, h2.ip6, tcp(1007, payload=SHIM[:10])), 1, 0),
            ("version 1 payload", ipv6(h1.ip6, h2.ip6, tcp(1008, payload=b"\x49\x11" + SHIM[2:])), 1, 0),
            ("shim payload behind an extension header",
             ipv6(h1.ip6, h2.ip6, dest_options() + tcp(1009, payload=SHIM), next_header=60), 1, 0),
            ("pure ACK behind an extension header",
             ipv6(h1.ip6, h2.ip6, dest_options() + tcp(1010), next_header=60), 1, 0),
        ]
        for what, packet, may, looks in cases:
            before = counts(h2)
            send(h1, h2.ip6, packet)
            after = counts(h2)
            got = (after["nt6-may"] - before["nt6-may"], after["nt6-looks"] - before["nt6-looks"])
            assert got == (may, looks), f"{what}: kernel said (MAY, LOOKS) = {got}, want {(may, looks)}"


SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the previous connection's TIME_WAIT
s.bind((sys.argv[1], 5301)); s.listen(1)
print("listening", flush=True)
c, _ = s.accept(); c.settimeout(float(sys.argv[2]))
n = 0
try:
    while n < 4000 and (b := c.recv(65536)):
        n += len(b)
except socket.timeout:
    pass
print(n, flush=True)
"""

CLIENT = """
import socket, sys, time
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, int(sys.argv[2]))
s.connect((sys.argv[1], 5301)); s.sendall(b"g" * 4000)
time.sleep(float(sys.argv[3]))
"""


def tcp_bytes(h_send, h_recv, tclass: int, wait: float) -> int:
    """Bytes a real IPv6 TCP connection from h_send, its traffic class ``tclass``, delivers to an
    application in h_recv within ``wait`` seconds (4000 sent)."""
    srv = h_recv.popen([PY, "-c", SERVER, h_recv.ip6, str(wait)], stdout=subprocess.PIPE, text=True)
    try:
        assert srv.stdout.readline().strip() == "listening"
        cli = h_send.run([PY, "-c", CLIENT, h_recv.ip6, str(tclass), str(wait + 0.5)], capture_output=True,
                         text=True, timeout=wait + 30)
        assert cli.returncode == 0, cli.stderr
        out, _ = srv.communicate(timeout=wait + 30)
        return int(out.split()[-1])
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def test_failclosed_drop_holds_compressed_ipv6(tmp_path, tb_name):
    """With the daemon stopped, its IPv6 drop keeps compressed-marked TCP payloads from the
    application (a real connection: the handshake passes, no byte arrives), also behind an
    extension header, and lets ordinary IPv6 TCP through."""
    with tbm.Testbed(hosts=2, name=tb_name, ipv6=True) as tb:
        h1, h2 = tb.hosts
        with running_nicd(h2, tmp_path):
            pass  # start and stop: what stays is the drop
        assert len(ours(h2)) == 1 and DROP in ours(h2)[0]
        # the crafted packets below (source ports 2001-2003): as they arrive, as they reach INPUT
        for table, chain, name in (("raw", "PREROUTING", "nt6-arrived"), ("mangle", "INPUT", "nt6-delivered")):
            h2.run(["ip6tables", "-w", "5", "-t", table, "-I", chain, "1", "-s", h1.ip6, "-p", "tcp",
                    "--sport", "2001:2003", "-m", "comment", "--comment", name], check=True)
        assert tcp_bytes(h1, h2, 0, 3.0) == 4000, "ordinary IPv6 TCP did not get through"
        assert counts(h2)[DROP] == 0
        assert tcp_bytes(h1, h2, contract.TOS_COMPRESSED, 2.0) == 0, "compressed-marked bytes reached the application"
        assert counts(h2)[DROP] > 0
        # crafted: compressed mark, a payload, one behind an extension header; not the pure ACK.
        # (The connection above goes on retransmitting into the drop: count by port.)
        dropped = counts(h2)[DROP]
        send(h1, h2.ip6,
             ipv6(h1.ip6, h2.ip6, tcp(2001, payload=SHIM), tclass=contract.TOS_COMPRESSED),
             ipv6(h1.ip6, h2.ip6, dest_options() + tcp(2002, payload=b"x" * 100), next_header=60,
                  tclass=contract.TOS_COMPRESSED),
             ipv6(h1.ip6, h2.ip6, tcp(2003), tclass=contract.TOS_COMPRESSED))
        assert counts(h2)["nt6-arrived"] == 3 and counts(h2)[DROP] >= dropped + 2
        assert counts(h2, "mangle")["nt6-delivered"] == 1  # the pure ACK went on
        r = nicd(h2, "--uninstall", "--socket", str(tmp_path / "x.sock"))
        assert r.returncode == 0 and "removed 1 rule(s) (IPv4), 1 (IPv6)" in r.stderr, r.stderr
        assert ours(h2) == []


def ping6(src, dst: str) -> subprocess.CompletedProcess:
    return src.run(["ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", dst], capture_output=True, text=True,
                   timeout=30)


def test_ping6_through_flat_and_routed_testbeds(tb_name):
    """Addresses usable right after `up` (no DAD wait), read back by attach, routed through r1."""
    with tbm.Testbed(hosts=3, name=tb_name, ipv6=True) as tb:
        assert [h.ip6 for h in tb.hosts] == ["2001:2::1", "2001:2::2", "2001:2::3"]
        r = ping6(tb.hosts[0], tb.hosts[2].ip6)
        assert r.returncode == 0 and " 0% packet loss" in r.stdout, r.stdout + r.stderr
        assert [h.ip6 for h in tbm.Testbed.attach(tb_name).hosts] == [h.ip6 for h in tb.hosts]
        assert tb.hosts[0].to_dict()["address6"] == "2001:2::1"
    with tbm.RoutedTestbed(hosts=2, name=tb_name, ipv6=True) as tb:
        h1, h2 = tb.hosts
        assert (h1.ip6, h2.ip6, tb.router.ip6) == ("2001:2:0:1::2", "2001:2:0:2::2", "2001:2:0:1::1")
        for dst in (h2.ip6, tb.router.ip6):
            r = ping6(h1, dst)
            assert r.returncode == 0 and " 0% packet loss" in r.stdout, r.stdout + r.stderr
        hops = h1.run(["ping", "-6", "-c", "1", "-W", "2", h2.ip6], capture_output=True, text=True).stdout
        assert "ttl=63" in hops, hops  # one router on the way
        assert h1.run(["ping", "-c", "1", "-W", "2", h2.ip], capture_output=True).returncode == 0
    with tbm.Testbed(hosts=1, name=tb_name) as tb:  # IPv6 stays off unless asked for
        assert tb.hosts[0].ip6 is None
        out = tb.hosts[0].run(["ip", "-6", "addr", "show", "scope", "global"], capture_output=True, text=True)
        assert out.stdout.strip() == "", out.stdout


def test_disable_ipv6_still_gets_both_families(tmp_path, tb_name):
    """disable_ipv6=1 is no reason to leave IPv6 out: one sysctl write turns it back on, and then
    compressed-marked IPv6 payloads must already meet the drop."""
    with tbm.Testbed(hosts=1, name=tb_name) as tb:
        (h,) = tb.hosts
        h.run(["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"], check=True)
        with running_nicd(h, tmp_path) as d:
            assert len([x for x in ours(h) if TAG in x]) == len(rules.rule_specs(CFG))
            assert "IPv6 is not covered" not in d.log_text()
        assert "removed 10 rule(s) (IPv4), 10 (IPv6)" in d.log_text(), d.log_text()
        assert len(ours(h)) == 1 and DROP in ours(h)[0]
