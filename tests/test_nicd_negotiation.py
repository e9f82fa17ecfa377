"""Negotiation that cannot be faked (issue 11 section 3): a flow is compressed only after a soft NIC
answered our hello option with our nonce, ack == ISN + 1 and the same settings. Everything that
merely looks like a hello (a kernel reflecting our DSCP, an AF12 server socket, a spoofed SYN-ACK,
a peer with other settings) leaves the flow raw, and its bytes arrive exactly.

Real netfilter queues, real TCP, hosts in network namespaces (see tests/test_nicd.py); the hello
option itself is also checked on the packet transforms directly.
"""
from __future__ import annotations

import struct
import subprocess
import time

import pytest
from test_nicd import (PEER, PY, Transfer, add_counting_rule, assert_restored_or_raw, make_testbed, nicd_transfer,
                       recon, rule_counts, running_nicd, transfer)

from inceptionn.daemon._datapath import ffi, lib

needs_root = pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root for namespaces and netfilter")
OPT = 253
HELLO_COUNTERS = ("hello_sent", "hello_received", "hello_no_room", "hello_without_option", "hello_mismatch",
                  "hello_unmatched", "hello_evicted", "flows_negotiated")


def hello_counts(c: dict) -> dict:
    return {k: c[k] for k in HELLO_COUNTERS}


def assert_raw(c_sender: dict, c_receiver: dict | None = None):
    assert c_sender["flows_negotiated"] == 0, hello_counts(c_sender)
    assert c_sender["egress_compressed"] == 0 and c_sender["egress_raw_not_negotiated"] > 0
    if c_receiver is not None:
        assert c_receiver["flows_negotiated"] == 0 and c_receiver["ingress_restored"] == 0


def count_option(host, name, *match):
    """Count packets carrying TCP option 253 at raw PREROUTING (on the wire, before any queue)."""
    add_counting_rule(host, name, "-p", "tcp", "--tcp-option", str(OPT), *match)


def write_config(tmp_path, name, **values) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in values.items()))
    return str(path)


# --- the option on the packet transforms --------------------------------------------------------

def syn_packet(options: bytes, payload: bytes = b"", flags=0x02) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", 40000, 5001, 1000, 0, (20 + len(options)) // 4 << 4, flags, 64240, 0, 0)
    tcp += options
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0x28, 20 + len(tcp) + len(payload), 0, 0x4000, 64, 6, 0,
                     bytes([198, 18, 0, 1]), bytes([198, 18, 0, 2]))
    words = sum(struct.unpack("!10H", ip))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    pkt = bytearray(ip + tcp + payload)
    pkt[10:12] = struct.pack("!H", ~words & 0xFFFF)
    pkt[36:38] = struct.pack("=H", lib.nicd_tcp_checksum(bytes(pkt), len(pkt)))  # stored as the C code does
    return bytes(pkt)


LINUX_SYN = struct.pack("!BBH BB BBII B BBB", 2, 4, 1460, 4, 2, 8, 10, 1, 0, 1, 3, 3, 7)


def parsed(buf: bytes):
    p = ffi.new("struct nicd_pkt *")
    keep = ffi.from_buffer(buf)
    assert lib.nicd_parse(keep, len(buf), p) == 0
    return p, keep


def hello_opt(nonce=b"ABCDEF"):
    o = ffi.new("struct nicd_hello_opt *")
    o.version, o.role, o.codec, o.error_bound, o.tos_compressed, o.orig_tos = 1, 1, 1, -10, 0x2C, 0x28
    o.nonce = list(nonce)
    return o


def test_option_added_found_and_removed_byte_exact():
    syn = syn_packet(LINUX_SYN)
    p, _keep = parsed(syn)
    out = ffi.new("uint8_t[]", 256)
    n = lib.nicd_add_option(p, hello_opt(), 0x30, out, 256)
    assert n == len(syn) + 16
    marked = bytes(ffi.buffer(out, n))
    assert marked[1] == 0x30 and marked[20 + 12] >> 4 == 14  # ToS, data offset 56 bytes
    q, _k2 = parsed(marked)
    o = ffi.new("struct nicd_hello_opt *")
    off = lib.nicd_find_option(q, o)
    assert off == 20 and bytes(o.nonce) == b"ABCDEF" and o.error_bound == -10 and o.orig_tos == 0x28
    back = ffi.new("uint8_t[]", 256)
    m = lib.nicd_strip_option(q, off, 0x28, back, 256)
    assert bytes(ffi.buffer(back, m)) == syn  # the stack sees exactly what the sender's stack sent
    # a corrupted hello is not laundered by the fresh checksum
    bad = bytearray(marked)
    bad[-1] ^= 1
    q2, _k3 = parsed(bytes(bad))
    assert lib.nicd_strip_option(q2, off, 0x28, back, 256) == -4  # NICD_E_CHECKSUM


@pytest.mark.parametrize("case", ["full_header", "syn_with_data"])
def test_no_room_for_the_option(case):
    if case == "full_header":  # 40 bytes of options already (e.g. MD5 + timestamps + ...)
        syn = syn_packet(LINUX_SYN + bytes([1] * 20))
    else:  # a Fast Open SYN: growing it could exceed the path MTU
        syn = syn_packet(LINUX_SYN, b"x" * 100)
    p, _keep = parsed(syn)
    assert p.thl == 60 or p.payload_len == 100
    out = ffi.new("uint8_t[]", 512)
    assert lib.nicd_add_option(p, hello_opt(), 0x30, out, 512) == -8  # NICD_E_SPACE


def test_malformed_option_lists_are_not_ours():
    o = ffi.new("struct nicd_hello_opt *")
    for opts in (bytes([OPT, 40]) + bytes(2),            # length past the header
                 bytes([OPT, 1, 1, 1]),                  # length below 2
                 bytes([0, 0, 0, 0]) + bytes([OPT, 16, 0x49, 0x4E]) + bytes(12)):  # after EOL
        p, _keep = parsed(syn_packet(opts))
        assert lib.nicd_find_option(p, o) <= 0, opts.hex()
    wrong_exid = bytes([OPT, 16, 0x49, 0x4F]) + bytes(12)
    p, _keep = parsed(syn_packet(wrong_exid))
    assert lib.nicd_find_option(p, o) == 0


# --- end to end ------------------------------------------------------------------------------

@needs_root
def test_normal_case_compresses_and_the_option_never_reaches_a_stack(tmp_path, small):
    x = small[:200_000]
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        count_option(h2, "opt-syn", "--tcp-flags", "SYN,ACK", "SYN", "-m", "dscp", "--dscp", "12")
        count_option(h1, "opt-synack", "--tcp-flags", "SYN,ACK", "SYN,ACK", "-m", "dscp", "--dscp", "12")
        for h in (h1, h2):  # after the queues: what the stacks get
            h.run(["iptables", "-w", "5", "-A", "INPUT", "-p", "tcp", "--tcp-option", str(OPT), "-m", "comment",
                   "--comment", "nt-opt-stack"], check=True)
        got, c1, c2, raw = nicd_transfer(h1, h2, x.tobytes(), tmp_path)
        wire_syn, wire_synack = rule_counts(h2, "opt-syn")[0], rule_counts(h1, "opt-synack")[0]
        in_stack = [rule_counts(h, "opt-stack", table="filter")[0] for h in (h1, h2)]
    assert_restored_or_raw(got, x.tobytes(), recon(x, -10).tobytes(), raw)
    assert wire_syn == 1 and wire_synack == 1, "the hello and its answer carry the option on the wire"
    assert in_stack == [0, 0], "a stack saw the hello option"
    assert c1["hello_sent"] == 1 and c1["hello_received"] == 1 and c1["flows_negotiated"] == 1
    assert c2["hello_received"] == 1 and c2["hello_sent"] == 1 and c2["flows_negotiated"] == 1
    assert c1["egress_compressed"] > 0 and c2["ingress_restored"] == c1["egress_compressed"]
    for c in (c1, c2):
        for key in ("hello_mismatch", "hello_unmatched", "hello_without_option", "hello_no_room"):
            assert c[key] == 0, (key, hello_counts(c))


@needs_root
def test_server_kernel_reflecting_the_hello_mark_stays_raw(tmp_path, small):
    """No nicd on the server, net.ipv4.tcp_reflect_tos=1 there: its SYN-ACK comes back marked
    DSCP 12 (the hello mark), but without our option."""
    data = small[:200_000].tobytes()
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        h2.run(["sysctl", "-q", "-w", "net.ipv4.tcp_reflect_tos=1"], check=True)
        add_counting_rule(h1, "reflected", "-p", "tcp", "--tcp-flags", "SYN,ACK", "SYN,ACK",
                          "-m", "dscp", "--dscp", "12")
        with running_nicd(h1, tmp_path) as d1:
            got = transfer(h1, h2, data, tmp_path)
            c1 = d1.counters()
        reflected = rule_counts(h1, "reflected")[0]
    assert reflected >= 1, "the server did not reflect the hello mark: nothing tested"
    assert got == data
    assert_raw(c1)
    assert c1["hello_without_option"] >= 1 and c1["hello_unmatched"] == 0


def run_pair(h_send, h_recv, data: bytes, tmp_path, recv_args=(), send_args=(), port=5900) -> bytes:
    """One tagged transfer with extra nicd_peer flags on either side; returns what arrived."""
    out, src = tmp_path / f"pair{port}.bin", tmp_path / f"pair{port}-src.bin"
    src.write_bytes(data)
    rx = h_recv.popen([PY, PEER, "recv", "--bind", h_recv.ip, "--port", port, "--out", out, *recv_args],
                      stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "listening"
        r = h_send.run([PY, PEER, "send", "--host", h_recv.ip, "--port", port, "--data", src, *send_args],
                       capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        assert rx.wait(timeout=60) == 0
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    return out.read_bytes()


@needs_root
def test_server_socket_marking_af12_stays_raw(tmp_path, small):
    """No nicd on the server; its listening socket uses ToS 0x30 (AF12 = the hello mark)."""
    data = small[:200_000].tobytes()
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path) as d1:
            got = run_pair(h1, h2, data, tmp_path, recv_args=["--tos", "0x30"])
            c1 = d1.counters()
    assert got == data
    assert_raw(c1)
    assert c1["hello_without_option"] >= 1


@needs_root
def test_syn_without_option_room_stays_raw(tmp_path, small):
    """TCP MD5 signatures on both ends: the SYN's options leave no 16 bytes for the hello, so it
    leaves unmarked and the flow stays raw, although both ends run nicd."""
    data = small[:200_000].tobytes()
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path) as d1, running_nicd(h2, tmp_path) as d2:
            got = run_pair(h1, h2, data, tmp_path, recv_args=["--md5-peer", h1.ip], send_args=["--md5-peer", h2.ip])
            c1, c2 = d1.counters(), d2.counters()
    assert got == data
    assert_raw(c1, c2)
    assert c1["hello_no_room"] == 1 and c1["hello_sent"] == 0 and c2["hello_received"] == 0, hello_counts(c1)


@needs_root
@pytest.mark.parametrize("setting", ["tos_compressed", "error_bound"])
def test_peers_with_other_settings_stay_raw(tmp_path, small, setting):
    """Both run nicd, but the server marks compressed packets 0x34 (its ingress would not queue
    the client's 0x2C) or uses another error bound: both count the mismatch, nothing compresses."""
    data = small[:200_000].tobytes()
    other = {"tos_compressed": "0x34", "error_bound": "-8"}[setting]
    cfg = write_config(tmp_path, "other", **{setting: other})
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path) as d1, running_nicd(h2, tmp_path, "--config", cfg) as d2:
            got = transfer(h1, h2, data, tmp_path)
            c1, c2 = d1.counters(), d2.counters()
    assert got == data
    assert_raw(c1, c2)
    assert c1["hello_received"] == 1 and c1["hello_mismatch"] == 1, hello_counts(c1)
    assert c2["hello_received"] == 1 and c2["hello_mismatch"] == 1, hello_counts(c2)


def spoofed_handshake(tmp_path, data: bytes, kinds: str, n: int, tos: int = 0x28) -> tuple[bytes, dict]:
    """nicd on the client only. The client's real SYN-ACK is dropped on arrival; a spoofer on the
    server sees the handshake and sends the client ``n`` copies of it (nicd_peer.py spoof-synack
    --kinds). Returns what arrived and the client daemon's counters."""
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        h1.run(["iptables", "-w", "5", "-t", "raw", "-I", "PREROUTING", "-i", h1.ifname, "-p", "tcp",
                "--tcp-flags", "SYN,ACK", "SYN,ACK", "-m", "dscp", "!", "--dscp", "12", "-m", "comment",
                "--comment", "nt-drop-real-synack", "-j", "DROP"], check=True)
        with running_nicd(h1, tmp_path) as d1:
            t = None
            spoofer = h2.popen([PY, PEER, "spoof-synack", "--iface", h2.ifname, "--kinds", kinds],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert spoofer.stdout.readline().strip() == "sniffing", spoofer.stderr.read()
                time.sleep(0.3)
                t = Transfer(h1, h2, data, tmp_path, tos=tos)
                out, err = spoofer.communicate(timeout=60)
                assert spoofer.returncode == 0 and f"spoofed {n}" in out, err
                got = t.finish()
            finally:
                if t is not None:
                    t.close()
                if spoofer.poll() is None:
                    spoofer.kill()
            c1 = d1.counters()
        dropped = rule_counts(h1, "drop-real-synack", table="raw")[0]
    assert dropped >= 1, "the real SYN-ACK was not held back: nothing tested"
    return got, c1


@needs_root
def test_spoofed_synacks_do_not_negotiate(tmp_path, small):
    """No nicd on the server. The client's real SYN-ACK is dropped on arrival; an attacker who
    sees the handshake sends the client copies of it marked DSCP 12: one with our option echoing
    the real nonce but ack = ISN + 1001, one with a wrong nonce, one with the mark only. The
    stack completes the handshake on the second; the flow must stay raw."""
    data = small[:200_000].tobytes()
    got, c1 = spoofed_handshake(tmp_path, data, "badack,badnonce,plain", 3)
    assert got == data
    assert_raw(c1)
    assert c1["hello_unmatched"] == 2 and c1["hello_without_option"] == 1, hello_counts(c1)
