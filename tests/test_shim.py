"""The tagging shim (shim/inceptionn_tag.c, ``inceptionn run``): unmodified C and Python programs
with plain socket code (tests/shim_progs/sockprobe.{c,py}) get their TCP sockets tagged as the
policy says, checked twice: getsockopt() in the program, and the DSCP of every packet the
namespace sends, counted by iptables/ip6tables rules. Also: the policy parser (shim/tag_policy.c)
gives the same verdicts in the preload library and through its Python binding, bad policies fail
loudly at load, and without a policy the library adds no system call.

The socket tests need root (a network namespace and netfilter rules inside it).
"""
from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_helpers import CLI, assert_one_line_error, run_cli
from netns_helpers import SESSION_TAG
from inceptionn.cli import main
from inceptionn.kernel_tc import netns as ns
from inceptionn.shim.policy import PolicyError, parse_policy
from inceptionn.shim.run import preload_library
from inceptionn.shim.contract import TOS_SCALED
from inceptionn.shim.tagging import GRADIENT_TOS, tag_socket

PROGS = Path(__file__).resolve().parent / "shim_progs"
NETNS = f"inc-{SESSION_TAG}-shim"
V4, V6 = "198.18.0.1", "2001:2::1"     # benchmarking ranges (RFC 2544, RFC 5180), only on our lo
SHIM_TOS = TOS_SCALED  # the mark the shim puts on by default (raw gradients: the NIC scales them)
DSCP = SHIM_TOS >> 2

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iptables-restore"),
                                reason="needs root and iptables (a network namespace with rules)")


@pytest.fixture(scope="session")
def lib() -> str:
    return preload_library()


@pytest.fixture(scope="session")
def c_probe(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("shim") / "sockprobe"
    subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", str(PROGS / "sockprobe.c"), "-o", str(out), "-ldl"],
                   check=True)
    return str(out)


@pytest.fixture(params=["c", "python"])
def probe(request, c_probe) -> list[str]:
    """The same socket code as a C program and as a Python program."""
    return [c_probe] if request.param == "c" else [sys.executable, str(PROGS / "sockprobe.py")]


@pytest.fixture(scope="module")
def shim_ns():
    """One namespace with loopback up and the test addresses on it; removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if ns.exists(NETNS):
        ns.delete(NETNS)
    ns.create(NETNS)
    try:
        for cmd in (["link", "set", "lo", "up"], ["addr", "add", f"{V4}/32", "dev", "lo"],
                    ["-6", "addr", "add", f"{V6}/128", "dev", "lo", "nodad"]):
            subprocess.run(["ip", "-n", NETNS, *cmd], check=True)
        yield NETNS
    finally:
        ns.delete(NETNS)
        assert not ns.exists(NETNS)


_ports = iter(range(24000, 30000, 100))


@pytest.fixture
def base_port() -> int:
    """A fresh block of 100 ports per test: counters never see an earlier test's packets."""
    return next(_ports)


# --- counting packets by DSCP ----------------------------------------------------------------------

def install_counters(netns: str, tcp_ports=(), udp_ports=(), v6=False) -> None:
    """Count-only rules in mangle OUTPUT (loopback traffic passes it both ways), per port and
    direction: tagged, untagged, and untagged with payload (IP length >= 100)."""
    lines = ["*mangle", "-F OUTPUT"]
    for p in tcp_ports:
        for d, flag in (("c2s", "--dport"), ("s2c", "--sport")):
            m = f"-A OUTPUT -p tcp {flag} {p}"
            lines += [f"{m} -m dscp --dscp {DSCP} -m comment --comment {p}-{d}-tag",
                      f"{m} -m dscp ! --dscp {DSCP} -m comment --comment {p}-{d}-plain",
                      f"{m} -m dscp ! --dscp {DSCP} -m length --length 100:65535 -m comment --comment {p}-{d}-plaindata"]
    for p in udp_ports:
        lines += [f"-A OUTPUT -p udp --dport {p} -m dscp --dscp {DSCP} -m comment --comment {p}-udp-tag",
                  f"-A OUTPUT -p udp --dport {p} -m dscp ! --dscp {DSCP} -m comment --comment {p}-udp-plain"]
    lines.append("COMMIT\n")
    tool = "ip6tables-restore" if v6 else "iptables-restore"
    subprocess.run(["ip", "netns", "exec", netns, tool, "-w", "5", "--noflush"], input="\n".join(lines),
                   text=True, check=True)


def read_counters(netns: str, v6=False) -> dict[str, int]:
    tool = "ip6tables-save" if v6 else "iptables-save"
    out = subprocess.run(["ip", "netns", "exec", netns, tool, "-c", "-t", "mangle"], capture_output=True,
                         text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"\[(\d+):\d+\] .*--comment \"?([\w-]+)\"?", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


def assert_packets(counts: dict, port: int, direction: str, how: str) -> None:
    """how: "all" every packet tagged (from the SYN on), "data" every packet with payload
    tagged (the handshake may not be), "none" no packet tagged."""
    tag, plain = counts[f"{port}-{direction}-tag"], counts[f"{port}-{direction}-plain"]
    data = counts[f"{port}-{direction}-plaindata"]
    what = f"port {port} {direction}: {tag} tagged, {plain} untagged ({data} with payload)"
    if how == "all":
        assert tag > 0 and plain == 0, what
    elif how == "data":
        assert tag > 0 and data == 0, what
    else:
        assert tag == 0 and plain > 0, what


# --- running the probes ---------------------------------------------------------------------------

def run_probe(netns, probe, args, *, policy=None, lib=None, log=None, via_cli=False):
    """Run a probe in the namespace: through `inceptionn run` (via_cli), or with the variables
    set directly. Returns (JSON records, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INCEPTIONN_TAG")}
    env.pop("LD_PRELOAD", None)
    if via_cli:
        argv = [CLI, "run", "--tag", policy, *(["--log", log] if log else []), "--", *probe, *args]
    else:
        argv = [*probe, *args]
        if lib:
            env["LD_PRELOAD"] = lib
        if policy is not None:
            env["INCEPTIONN_TAG"] = policy
        if log:
            env["INCEPTIONN_TAG_LOG"] = log
    r = ns.run(netns, argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def by_port(records) -> dict[int, dict]:
    return {r["port"]: r for r in records if r["kind"] == "tcp"}


def ds(tos: int) -> int:
    """The DSCP part of a ToS byte (the kernel owns the two ECN bits of TCP sockets)."""
    return tos & 0xFC


# --- tagging per policy, C and Python --------------------------------------------------------------

@needs_root
def test_port_policy_tags_both_ends_in_range_only(shim_ns, probe, base_port):
    inside, outside = base_port + 1, base_port + 51
    install_counters(shim_ns, [inside, outside])
    recs, _ = run_probe(shim_ns, probe, [f"{V4}:{inside}", f"{V4}:{outside}"],
                        policy=f"port={base_port}-{base_port + 49}", via_cli=True)
    got = by_port(recs)
    assert [ds(got[inside][k]) for k in ("client_tos", "server_tos", "listener_tos")] == [SHIM_TOS] * 3
    assert [got[outside][k] for k in ("client_tos", "server_tos", "listener_tos")] == [0, 0, 0]
    counts = read_counters(shim_ns)
    assert_packets(counts, inside, "c2s", "all")     # the SYN too: tagged before connect()
    assert_packets(counts, inside, "s2c", "all")     # the SYN-ACK too: tagged before listen()
    assert_packets(counts, outside, "c2s", "none")
    assert_packets(counts, outside, "s2c", "none")


@needs_root
def test_rport_tags_the_connecting_side_lport_the_listening_side(shim_ns, probe, lib, base_port):
    r_port, l_port = base_port + 1, base_port + 2
    install_counters(shim_ns, [r_port, l_port])
    recs, _ = run_probe(shim_ns, probe, [f"{V4}:{r_port}", f"{V4}:{l_port}"],
                        policy=f"rport={r_port},lport={l_port}", lib=lib)
    got = by_port(recs)
    assert (ds(got[r_port]["client_tos"]), got[r_port]["server_tos"]) == (SHIM_TOS, 0)
    assert (got[l_port]["client_tos"], ds(got[l_port]["server_tos"])) == (0, SHIM_TOS)
    counts = read_counters(shim_ns)
    assert_packets(counts, r_port, "c2s", "all")
    assert_packets(counts, r_port, "s2c", "none")
    assert_packets(counts, l_port, "c2s", "none")
    assert_packets(counts, l_port, "s2c", "all")


@needs_root
def test_net_policy_ipv4_ipv6_and_mapped(shim_ns, probe, lib, base_port):
    p4, p4_out, p6, p6_out, mapped = (base_port + i for i in range(1, 6))
    install_counters(shim_ns, [p4, p4_out, mapped])
    install_counters(shim_ns, [p6, p6_out], v6=True)
    recs, _ = run_probe(shim_ns, probe,
                        [f"{V4}:{p4}", f"127.0.0.1:{p4_out}", f"[{V6}]:{p6}", f"[::1]:{p6_out}",
                         f"[::ffff:{V4}]:{mapped}"],
                        policy="net=198.18.0.0/24,net=2001:2::/64", lib=lib)
    got = by_port(recs)
    for port in (p4, p6, mapped):   # peer in the network: both ends (the accepted one after accept())
        assert (ds(got[port]["client_tos"]), ds(got[port]["server_tos"])) == (SHIM_TOS, SHIM_TOS), got[port]
    for port in (p4_out, p6_out):
        assert (got[port]["client_tos"], got[port]["server_tos"]) == (0, 0), got[port]
    c4, c6 = read_counters(shim_ns), read_counters(shim_ns, v6=True)
    for counts, port in ((c4, p4), (c6, p6), (c4, mapped)):
        assert_packets(counts, port, "c2s", "all")
        # tagged on accept(): the SYN-ACK (sent by the kernel before) is not, every data packet is
        assert_packets(counts, port, "s2c", "data")
    for counts, port in ((c4, p4_out), (c6, p6_out)):
        assert_packets(counts, port, "c2s", "none")
        assert_packets(counts, port, "s2c", "none")


@needs_root
def test_all_tags_tcp_and_never_udp_or_unix(shim_ns, probe, lib, base_port):
    tcp, udp = base_port + 1, base_port + 2
    install_counters(shim_ns, [tcp], [udp])
    recs, _ = run_probe(shim_ns, probe, ["--udp", f"{V4}:{udp}", "--unix", f"{V4}:{tcp}"], policy="all", lib=lib)
    got = by_port(recs)
    assert ds(got[tcp]["client_tos"]) == ds(got[tcp]["server_tos"]) == SHIM_TOS
    assert [r["tos"] for r in recs if r["kind"] == "udp"] == [0]
    assert [r["ok"] for r in recs if r["kind"] == "unix"] == [True]
    counts = read_counters(shim_ns)
    assert_packets(counts, tcp, "c2s", "all")
    assert_packets(counts, tcp, "s2c", "all")
    assert counts[f"{udp}-udp-tag"] == 0 and counts[f"{udp}-udp-plain"] == 20


@needs_root
@pytest.mark.parametrize("policy_opts,flag,want,packets", [
    ("", "--settos-after", SHIM_TOS, "all"),                   # keep: the program's IP_TOS is ignored
    ("", "--settos-before", SHIM_TOS, "all"),                  # keep: the policy wins over an earlier one
    (",override=allow", "--settos-after", 0x10, "none-data"),  # allow: the program's value wins
    (",override=allow", "--settos-before", 0x10, "none"),  # allow: a ToS set before is left alone
], ids=["keep-after", "keep-before", "allow-after", "allow-before"])
def test_override_keep_and_allow(shim_ns, probe, lib, base_port, policy_opts, flag, want, packets):
    port = base_port + 1
    install_counters(shim_ns, [port])
    recs, _ = run_probe(shim_ns, probe, [flag, "0x10", f"{V4}:{port}"], policy=f"rport={port}{policy_opts}", lib=lib)
    assert ds(by_port(recs)[port]["client_tos"]) == want
    counts = read_counters(shim_ns)
    if packets == "none-data":   # tagged SYN, then the program's 0x10 on the data
        assert counts[f"{port}-c2s-tag"] > 0 and counts[f"{port}-c2s-plaindata"] > 0
    else:
        assert_packets(counts, port, "c2s", packets)


@needs_root
def test_tos_option(shim_ns, probe, lib, base_port):
    port = base_port + 1
    recs, _ = run_probe(shim_ns, probe, [f"{V4}:{port}"], policy=f"port={port},tos=0x38", lib=lib)
    assert ds(by_port(recs)[port]["client_tos"]) == 0x38


@needs_root
def test_explicit_call(shim_ns, probe, lib, base_port):
    port, bare = base_port + 1, base_port + 2
    install_counters(shim_ns, [port, bare])
    recs, _ = run_probe(shim_ns, probe, ["--explicit", f"{V4}:{port}"], policy="none", lib=lib)
    assert recs[0] == {"kind": "explicit", "found": True}
    assert (ds(by_port(recs)[port]["client_tos"]), by_port(recs)[port]["server_tos"]) == (SHIM_TOS, 0)
    # without the library the program still runs, and nothing is tagged
    recs, _ = run_probe(shim_ns, probe, ["--explicit", f"{V4}:{bare}"])
    assert recs[0] == {"kind": "explicit", "found": False}
    assert by_port(recs)[bare]["client_tos"] == 0
    counts = read_counters(shim_ns)
    assert_packets(counts, port, "c2s", "all")
    assert_packets(counts, port, "s2c", "none")
    assert_packets(counts, bare, "c2s", "none")


@needs_root
def test_no_policy_tags_nothing(shim_ns, probe, lib, base_port):
    port = base_port + 1
    install_counters(shim_ns, [port])
    recs, _ = run_probe(shim_ns, probe, [f"{V4}:{port}"], lib=lib)   # LD_PRELOAD, no INCEPTIONN_TAG
    assert by_port(recs)[port]["client_tos"] == 0
    counts = read_counters(shim_ns)
    assert_packets(counts, port, "c2s", "none")
    assert_packets(counts, port, "s2c", "none")


@needs_root
@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace")
def test_no_policy_adds_no_system_call(shim_ns, c_probe, lib, tmp_path, base_port):
    """"Costs nothing on untagged paths": without a policy the library makes no system call of
    its own; the probe's socket calls are the same, one for one, with and without it."""
    def trace(preload):
        out = tmp_path / f"trace{int(preload)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INCEPTIONN_TAG", "LD_PRELOAD"))}
        if preload:
            env["LD_PRELOAD"] = lib
        ns.run(shim_ns, ["strace", "-f", "-qq", "-o", str(out), "-e",
                         "trace=getsockopt,setsockopt,connect,listen,accept,accept4,socket,openat",
                         c_probe, "--udp", f"{V4}:{base_port + 1}", "--unix", f"{V4}:{base_port + 2}"],
               env=env, check=True, capture_output=True)
        calls = [re.sub(r"^\d+\s+", "", line) for line in out.read_text().splitlines()]
        # the unix socket's name holds the pid and the loader opens the library; nothing else differs
        calls = [re.sub(r"sockprobe-\d+", "sockprobe-PID", c) for c in calls if "_tagpreload" not in c]
        return [c for c in calls if not c.startswith("openat")]
    plain, preloaded = trace(False), trace(True)
    assert len(plain) > 10
    assert preloaded == plain


# --- logging ---------------------------------------------------------------------------------------

@needs_root
def test_log_lists_what_was_tagged(shim_ns, c_probe, lib, base_port, tmp_path):
    inside, outside = base_port + 1, base_port + 51
    policy = f"port={base_port}-{base_port + 49}"
    _, err = run_probe(shim_ns, [c_probe], [f"{V4}:{inside}", f"{V4}:{outside}"], policy=policy, lib=lib, log="1")
    lines = err.splitlines()
    assert len(lines) == 3 and all(re.match(r"inceptionn-tag\[\d+\]: tagged fd \d+ tos 0x24 \(", ln) for ln in lines), err
    assert [ln.split("(")[1].split()[0] for ln in lines] == ["listen", "connect", "accept"]
    assert all(f":{inside}" in ln or f"port {inside}" in ln for ln in lines)
    _, err = run_probe(shim_ns, [c_probe], [f"{V4}:{inside}", f"{V4}:{outside}"], policy=policy, lib=lib, log="2")
    assert f"policy {policy},tos=0x24,override=keep" in err
    assert err.count("untagged fd") == 3 and err.count(": tagged fd") == 3
    logfile = tmp_path / "tag.log"
    _, err = run_probe(shim_ns, [c_probe], [f"{V4}:{inside}"], policy=policy, lib=lib, log=str(logfile))
    assert err == "" and logfile.read_text().count("tagged fd") == 3


# --- bad policies ----------------------------------------------------------------------------------

BAD_POLICIES = [
    ("", "empty policy"),
    ("bogus", "unknown term 'bogus'"),
    ("port=0", "bad port range 'port=0'"),
    ("rport=5000-4000", "bad port range"),
    ("lport=70000", "bad port range"),
    ("net=198.18.0.1/24", "host bits set (did you mean 198.18.0.0/24?)"),
    ("net=198.18.0.0/33", "prefix length must be 0-32"),
    ("net=2001:2::zz/48", "not an IPv4 or IPv6 address"),
    ("tos=0x29,all", "bad tos 'tos=0x29'"),
    ("override=never,all", "bad override"),
    ("tos=0x28", "no selector"),
    ("all,port=5000", "'all' cannot be combined"),
    ("none,port=5000", "'none' cannot be combined"),
    ("port=5000,,all", "empty term"),
    ("all,tos=0x28,tos=0x38", "'tos' given twice"),
    ("all,tos=0x2c", "bad tos 'tos=0x2c': DSCP 11 is the soft NIC's own mark for compressed data"),
    ("port=5000,tos=48", "bad tos 'tos=48': DSCP 12 is the soft NIC's own mark for its handshake"),
    ("port=5000\nall", "non-printable"),
]
WIRE_MARKS = BAD_POLICIES[-3:-1]
GOOD_POLICIES = [
    ("all", "all,tos=0x24,override=keep"),
    ("none", "none,tos=0x24,override=keep"),
    (" port=23000-23099 ", "port=23000-23099,tos=0x24,override=keep"),
    ("rport=5000,lport=6000-6001,net=198.18.0.0/24", "rport=5000,lport=6000-6001,net=198.18.0.0/24,tos=0x24,override=keep"),
    ("net=2001:0002:0:0::/48,tos=56,override=allow", "net=2001:2::/48,tos=0x38,override=allow"),
    ("net=::ffff:198.18.0.0/120", "net=::ffff:198.18.0.0/120,tos=0x24,override=keep"),
    ("net=198.18.0.7", "net=198.18.0.7/32,tos=0x24,override=keep"),
]


@functools.lru_cache(maxsize=None)
def _dlopen(lib_path: str) -> ctypes.CDLL:
    return ctypes.CDLL(lib_path)


def c_parse(lib_path: str, text: str) -> tuple[int, str]:
    """The preload library's exported parser, called in this process (dlopen'ed RTLD_LOCAL: it
    interposes nothing here, and with INCEPTIONN_TAG unset it is inert)."""
    lib = _dlopen(lib_path)
    buf = ctypes.create_string_buffer(8192)
    rc = lib.inceptionn_tag_parse_policy(text.encode(), buf, len(buf))
    return rc, buf.value.decode()


def py_parse(text: str) -> tuple[int, str]:
    """The same C parser through the cffi binding the CLI uses (inceptionn.shim._policy)."""
    try:
        return 0, parse_policy(text).canonical
    except PolicyError as exc:
        return -1, str(exc)


@pytest.mark.parametrize("text,reason", BAD_POLICIES, ids=[b[0] or "empty" for b in BAD_POLICIES])
def test_bad_policy_rejected_by_library_and_cli(lib, text, reason):
    assert py_parse(text)[0] == -1 and reason in py_parse(text)[1]
    assert c_parse(lib, text) == py_parse(text)


@pytest.mark.parametrize("text,canonical", GOOD_POLICIES)
def test_good_policy_same_canonical_form(lib, text, canonical):
    assert py_parse(text) == (0, canonical)
    assert c_parse(lib, text) == (0, canonical)
    assert c_parse(lib, canonical) == (0, canonical)   # the canonical form parses to itself


_values = st.one_of(st.integers(0, 70000).map(str), st.from_regex(r"[0-9]{1,5}-[0-9]{1,5}", fullmatch=True),
                    st.sampled_from(["198.18.0.0/24", "198.18.0.1/24", "2001:2::/48", "::ffff:1.2.3.0/120", "1.2.3.4",
                                     "0x28", "0x29", "40", "keep", "allow", "fe80::1%lo", "1.2.3.4/33", "::/0"]),
                    st.text(alphabet="0123456789abcdefx.:/- ", max_size=12))
_terms = st.one_of(st.sampled_from(["all", "none", "", " ", "all=1"]),
                   st.tuples(st.sampled_from(["port", "lport", "rport", "net", "tos", "override", "prot"]), _values)
                   .map(lambda kv: f"{kv[0]}={kv[1]}"))


@settings(max_examples=300, deadline=None)
@given(st.lists(_terms, min_size=1, max_size=5).map(",".join))
def test_library_and_binding_agree(lib, text):
    """Two builds of one parser (the preload library, the cffi extension): a stale or differently
    built library would show here."""
    assert c_parse(lib, text) == py_parse(text)


def test_policy_terms_for_the_mpirun_checks():
    """What inceptionn mpirun reads from a parsed policy: selector kinds, port ranges, networks."""
    p = parse_policy("rport=5000,lport=6000-6001,net=198.18.0.0/24,net=::ffff:198.18.0.0/120,tos=0x38")
    assert [str(t) for t in p.terms] == ["rport=5000", "lport=6000-6001", "net=198.18.0.0/24",
                                          "net=::ffff:198.18.0.0/120"]
    assert p.port_ranges() == [("rport", 5000, 5000), ("lport", 6000, 6001)]
    assert [str(n) for n in p.nets()] == ["198.18.0.0/24", "::ffff:c612:0/120"]
    assert (p.tos, p.keep, p.selects_all, p.is_none) == (0x38, True, False, False)
    assert parse_policy("all").selects_all and parse_policy("none").is_none


@pytest.mark.parametrize("text,position", [("all\x00", 3), ("port=5000,\u00e9", 10), ("all,\udcff", 4)])
def test_binding_names_the_character_position(text, position):
    """Text the C parser gets as bytes: a NUL is a character (not an end), and the position of
    the first non-ASCII character is the one the user sees."""
    with pytest.raises(PolicyError, match=f"non-printable or non-ASCII character at position {position}$"):
        parse_policy(text)


def test_library_exports_only_its_interface(lib):
    """The parser linked into the library (tag_policy.c) stays hidden: its names can never bind
    to, or be taken by, a program's own symbols of the same name (nm: binutils, beside gcc)."""
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    assert sorted(line.split()[-1] for line in out.splitlines()) == [
        "accept", "accept4", "connect", "inceptionn_tag_parse_policy", "inceptionn_tag_socket", "listen", "setsockopt"]


@pytest.mark.parametrize("text,reason", BAD_POLICIES[:6] + WIRE_MARKS + BAD_POLICIES[-1:], ids=lambda v: repr(v)[:20])
def test_library_refuses_bad_policy_before_main(lib, text, reason):
    env = dict(os.environ, LD_PRELOAD=lib, INCEPTIONN_TAG=text)
    r = subprocess.run(["sh", "-c", "echo main ran"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("inceptionn: error: bad INCEPTIONN_TAG policy '"), r.stderr
    assert reason in lines[0]


@pytest.mark.parametrize("value", ["3", "yes", "relative/path", "1:", "2:relative"])
def test_library_refuses_bad_log_setting(lib, value):
    env = dict(os.environ, LD_PRELOAD=lib, INCEPTIONN_TAG="all", INCEPTIONN_TAG_LOG=value)
    r = subprocess.run(["true"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.startswith("inceptionn: error: bad INCEPTIONN_TAG_LOG") and r.stderr.count("\n") == 1


def test_library_refuses_a_symlinked_log_file(lib, tmp_path):
    """O_NOFOLLOW: a symbolic link where the log goes is refused at load, and the file it points
    to is not written (before: the policy line was appended to it)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "tag.log"
    link.symlink_to(victim)
    env = dict(os.environ, LD_PRELOAD=lib, INCEPTIONN_TAG="all", INCEPTIONN_TAG_LOG=f"2:{link}")
    r = subprocess.run(["sh", "-c", "echo main ran"], env=env, capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (2, ""), r
    assert r.stderr == f"inceptionn: error: bad INCEPTIONN_TAG_LOG '2:{link}': the log file is a symbolic link (refused)\n"
    assert victim.read_text() == "precious\n"
    real = tmp_path / "real.log"  # a plain file still works
    env["INCEPTIONN_TAG_LOG"] = f"2:{real}"
    r = subprocess.run(["sh", "-c", "echo main ran"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "policy all,tos=0x24,override=keep" in real.read_text()


SYSTEM_LIB = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")


@needs_root
@pytest.mark.skipif(not (shutil.which("unshare") and SYSTEM_LIB.exists()), reason="needs unshare and libz")
@pytest.mark.parametrize("setuid", [False, True], ids=["plain", "setuid"])
def test_setuid_program_ignores_policy_and_log_path(shim_ns, c_probe, lib, base_port, tmp_path, setuid):
    """AT_SECURE: in a set-user-ID program (here the probe, owned by nobody, run by root) the
    environment is the invoker's, so INCEPTIONN_TAG and INCEPTIONN_TAG_LOG are ignored. glibc
    preloads into such a program only a set-user-ID library from a system directory, named
    without a slash: a private mount namespace bind-mounts a set-user-ID copy of the library
    over libz (which the probe does not use). The plain run is the control: the same preload
    does apply the policy there. The explicit call shows the library is loaded in both."""
    port = base_port + 1
    shim = tmp_path / "shim.so"
    shutil.copy(lib, shim)
    shim.chmod(0o4755)
    probe = tmp_path / "probe"
    shutil.copy(c_probe, probe)
    if setuid:
        os.chown(probe, 65534, 65534)
        probe.chmod(0o4755)
    logfile = tmp_path / "tag.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INCEPTIONN_TAG", "LD_PRELOAD"))}
    env.update(INCEPTIONN_TAG="all,tos=0x38", INCEPTIONN_TAG_LOG=f"2:{logfile}")
    script = 'mount --bind "$1" "$2" && exec env LD_PRELOAD="${2##*/}" "$3" --explicit "$4"'
    r = ns.run(shim_ns, ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                         str(shim), str(SYSTEM_LIB), str(probe), f"{V4}:{port}"],
               env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert recs[0] == {"kind": "explicit", "found": True}
    rec = by_port(recs)[port]
    if setuid:  # explicit call: the default mark; the policy's listen/accept tagging: none; no log
        assert (ds(rec["client_tos"]), rec["server_tos"]) == (SHIM_TOS, 0)
        assert not logfile.exists()
    else:
        assert (ds(rec["client_tos"]), ds(rec["server_tos"])) == (0x38, 0x38)
        assert "policy all,tos=0x38,override=keep" in logfile.read_text()


def cli_error(capsys, *argv: str) -> str:
    """The CLI's main() in this process, on arguments that fail before anything is exec'ed."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, (rc, err)
    assert err.startswith("inceptionn: error: "), err
    return err.strip()


@pytest.mark.parametrize("args,needle", [
    (["--tag", "bogus", "--", "true"], "bad tag policy 'bogus': unknown term 'bogus'"),
    (["--tag", "net=198.18.0.1/24", "--", "true"], "host bits set (did you mean 198.18.0.0/24?)"),
    (["--tag", "tos=0x29,all", "--", "true"], "bad tos 'tos=0x29'"),
    (["--tag", "all"], "no program given"),
    (["--tag", "all", "--", "no-such-program-x"], "not found on PATH"),
    (["--tag", "all", "--", "/no/such/file"], "no such executable file"),
    (["--tag", "all", "--log", "9", "--", "true"], "bad tag log '9'"),
    (["--tag", "all", "--print-env", "--", "true"], "--print-env prints the variables and runs nothing"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_cli_errors(args, needle, capsys, monkeypatch):
    assert needle in cli_error(capsys, "run", *args)


def test_cli_errors_through_the_console_script(monkeypatch):
    monkeypatch.delenv("INCEPTIONN_TAG", raising=False)
    assert_one_line_error(run_cli("run", "--", "true"), "run needs --tag POLICY")
    assert_one_line_error(run_cli("run", "--tag", "port=0", "--", "true"), "bad tag policy 'port=0'")
    # in a child: were the mark accepted, main() would exec the program in place of pytest
    assert_one_line_error(run_cli("run", "--tag", "all,tos=0x30", "--", "sh", "-c", "echo ran"),
                          "bad tos 'tos=0x30': DSCP 12 is the soft NIC's own mark for its handshake")


def test_cli_passes_exit_status_and_environment(lib):
    r = run_cli("run", "--tag", "port=5000", "--", "sh", "-c", 'echo "$LD_PRELOAD|$INCEPTIONN_TAG"; exit 7')
    assert r.returncode == 7
    assert r.stdout.strip() == f"{lib}|port=5000,tos=0x24,override=keep"
    r = run_cli("run", "--tag", "port=5000", "--log", "2", "--print-env")
    assert r.returncode == 0
    assert r.stdout.splitlines() == [f"export LD_PRELOAD={lib}", "export INCEPTIONN_TAG=port=5000,tos=0x24,override=keep",
                                     "export INCEPTIONN_TAG_LOG=2"]


def test_python_tag_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        tag_socket(s)
        assert s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == GRADIENT_TOS
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        tag_socket(s, 0x30)
        assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS) == 0x30
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(ValueError):
        tag_socket(s)
