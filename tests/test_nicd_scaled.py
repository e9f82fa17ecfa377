"""Codec 2 of the soft NIC (issue 21): INCEPTIONN with a per-packet power-of-two scale, for
programs that send raw float32 gradients (docs/wire-format.md, "Scaled codec").

The transform (no root): each packet's floats times 2^x, x chosen so the largest finite magnitude
lands in [0.5, 1), then the paper's codec; the receiver multiplies by 2^-x. What must arrive is
``scaled_recon`` below, bit for bit: numpy's float32 products round as the C code's do.
End to end (root, real netfilter in namespaces): a program tagged by ``inceptionn run --tag
port=N`` (the shim's default mark, 0x24) through two default daemons; the paper's mark (0x28) on
the same daemons still gets the paper's codec; a peer that knows codec 1 only never negotiates.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from test_nicd import (INC, PEER, PY, Transfer, add_counting_rule, assert_went_compressed, compressed_skbs, restored_skbs, make_testbed, recon, rule_counts,
                       running_nicd)
from test_nicd_gso import super_packet

from inceptionn.daemon._datapath import ffi, lib
from inceptionn.shim.contract import TOS_SCALED, TOS_TAGGED

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")

K = -10
HDR = lib.NICD_HDR_LEN  # the shim header
AT = lib.NICD_SCALE_AT  # its byte holding the exponent
VER = lib.NICD_VERSION << 4
FLOATS_PER_PACKET = 360


def scale_exponent(x: np.ndarray) -> int:
    """x with max|finite x| * 2^x in [0.5, 1), clamped to [-126, 126]; 0 if none is non-zero."""
    bits = x.view(np.uint32) & 0x7FFFFFFF
    finite = bits[bits < 0x7F800000]
    m = int(finite.max()) if finite.size else 0
    return 0 if m == 0 else max(126 - (m >> 23), -126)


def times_pow2(x: np.ndarray, e: int) -> np.ndarray:
    """x * 2^e on finite values (float32 rounding), infinities and NaNs untouched."""
    y = x.copy()
    fin = (y.view(np.uint32) & 0x7F800000) != 0x7F800000
    y[fin] = y[fin] * np.float32(2.0 ** e)
    return y


def scaled_recon(x: np.ndarray, k: int = K) -> tuple[np.ndarray, int]:
    """What codec 2 delivers for one packet's floats, and its exponent."""
    x = np.ascontiguousarray(x, np.float32)
    e = scale_exponent(x)
    return times_pow2(recon(times_pow2(x, e), k), -e), e


def nmse(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.sum((g - w) ** 2) / np.sum(w ** 2))


def raw_gradients(n: int) -> np.ndarray:
    """n real HDC gradient values as a data-parallel worker puts them on the wire: unscaled."""
    from inceptionn.train.gradients import gradient_sample
    g = gradient_sample(8)
    assert g.size >= n
    return np.ascontiguousarray(g[:n], np.float32)


def parsed(pkt: bytes):
    keep = ffi.from_buffer(pkt)
    p = ffi.new("struct nicd_pkt *")
    assert lib.nicd_parse(keep, len(pkt), p) == 0
    return p, keep


def compress(payload: bytes, codec: int, stream_off: int = 0) -> bytes:
    p, keep = parsed(super_packet(payload, 1, 0x18))
    out, scratch = ffi.new("uint8_t[]", 70000), ffi.new("float[]", 16400)
    r = lib.nicd_compress_codec(p, stream_off, codec, K, 0x2C, 0, out, len(out), scratch, ffi.NULL)
    assert r > 2, lib.nicd_strerror(r)
    return bytes(ffi.buffer(out, r))


def restore(pkt: bytes) -> tuple[int, bytes]:
    """(result, restored payload)."""
    p, keep = parsed(pkt)
    back, scratch = ffi.new("uint8_t[]", 70000), ffi.new("float[]", 16400)
    r = lib.nicd_restore(p, 0x24, back, len(back), scratch)
    return r, (bytes(ffi.buffer(back, r))[p.payload_off:] if r > 0 else b"")


# --- the transform ---------------------------------------------------------------------------

def test_exponent_brings_the_largest_finite_magnitude_into_half_to_one():
    rng = np.random.default_rng(0)
    for scale in (1e-30, 1e-6, 3e-3, 0.7, 1.0, 5.0, 1e20):
        x = (rng.standard_normal(1000) * scale).astype(np.float32)
        e = lib.nicd_scale_exponent(ffi.from_buffer("float[]", x), x.size)
        assert e == scale_exponent(x)
        assert 0.5 <= np.abs(x).max() * 2.0 ** e < 1.0, (scale, e)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    assert lib.nicd_scale_exponent(ffi.from_buffer("float[]", special), 5) == 0  # nothing to scale
    tiny = np.array([1e-45, -3e-44], np.float32)  # denormals only: the clamp, 2^126
    assert lib.nicd_scale_exponent(ffi.from_buffer("float[]", tiny), 2) == 126
    huge = np.array([3e38, 1.0], np.float32)      # 2^-127 would be needed: clamped to 2^-126
    assert lib.nicd_scale_exponent(ffi.from_buffer("float[]", huge), 2) == -126


@pytest.mark.parametrize("stream_off", [0, 1, 2, 3])
def test_packet_restores_to_the_scaled_reconstruction(stream_off):
    """Real raw gradients, one packet each, at every float alignment: the header says codec 2
    and the exponent, and the restored floats are scaled_recon's bit for bit."""
    g = raw_gradients(50 * FLOATS_PER_PACKET)
    head = (4 - stream_off) & 3
    exps = set()
    for i in range(0, g.size, FLOATS_PER_PACKET):
        x = g[i:i + FLOATS_PER_PACKET]
        payload = bytes(range(head)) + x.tobytes() + b"\x09"
        c = compress(payload, lib.NICD_CODEC_SCALED, stream_off)
        want, e = scaled_recon(x)
        shim = c[52:52 + HDR]  # IP 20 + TCP 32 (timestamps)
        assert shim[1] == VER | 2 and np.int8(shim[AT]) == e, (shim.hex(), e)
        exps.add(e)
        r, back = restore(c)
        assert r > 0, lib.nicd_strerror(r)
        assert back[:head] == payload[:head] and back[-1:] == b"\x09"
        assert back[head:-1] == want.tobytes()
    assert len(exps) > 3, exps  # the exponent follows each packet's values


def test_paper_codec_unchanged():
    """Codec 1 (what the paper's mark gets) writes the exponent byte zero and decodes to the codec's own
    roundtrip; on raw gradients it zeroes nearly everything, which codec 2 does not."""
    g = raw_gradients(40 * FLOATS_PER_PACKET)
    got = {1: [], 2: []}
    for i in range(0, g.size, FLOATS_PER_PACKET):
        x = g[i:i + FLOATS_PER_PACKET]
        for codec in (1, 2):
            c = compress(x.tobytes(), codec)
            assert c[52 + 1] == VER | codec and (codec == 2 or c[52 + AT] == 0)
            r, back = restore(c)
            assert r > 0
            got[codec].append(np.frombuffer(back, np.float32))
    paper, scaled = np.concatenate(got[1]), np.concatenate(got[2])
    assert paper.tobytes() == recon(g, K).tobytes()
    assert nmse(paper, g) > 0.2 and nmse(scaled, g) < 0.01, (nmse(paper, g), nmse(scaled, g))


def test_infinities_nans_and_denormals():
    """Infinities and NaNs (a signalling NaN's payload included) travel bit for bit and do not
    set the exponent; finite values are scaled_recon's, bit for bit. Values near 2^-120: their
    reconstruction scaled back falls partly below 2^-126 and is rounded to the nearest denormal.
    A packet of denormals only: x is clamped at 126, so they stay below 2^k and arrive as 0, as
    with the paper's codec."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(FLOATS_PER_PACKET) * 1e-4).astype(np.float32)
    b = x.view(np.uint32)
    b[[3, 50]] = [0x7F800000, 0xFF800000]  # +inf, -inf
    b[[7, 8]] = [0x7F800123, 0xFFC00042]   # a signalling NaN and a quiet one, with payloads
    b[9:40] = np.arange(1, 32, dtype=np.uint32)  # denormals among normal values: below 2^k, so 0
    near = (rng.standard_normal(FLOATS_PER_PACKET) * 2.0 ** -124).astype(np.float32)
    den = np.arange(1, FLOATS_PER_PACKET + 1, dtype=np.uint32).view(np.float32)
    for payload, want_e in ((x, None), (near, None), (den, 126)):
        c = compress(payload.tobytes(), lib.NICD_CODEC_SCALED)
        r, back = restore(c)
        assert r > 0
        want, e = scaled_recon(payload)
        assert np.int8(c[52 + AT]) == e and (want_e is None or e == want_e)
        assert back == want.tobytes()
        got = np.frombuffer(back, np.uint32)
        if payload is x:
            special = [3, 50, 7, 8]
            assert (got[special] == b[special]).all() and 0.5 <= np.nanmax(np.abs(
                np.where(np.isfinite(x), x, 0))) * 2.0 ** e < 1
        if payload is near:
            assert (((got & 0x7F800000) == 0) & ((got & 0x7FFFFFFF) != 0)).sum() > 10  # some are denormal
            assert nmse(want, near) < 0.01
        if payload is den:
            assert not got.any()


def test_super_packet_shares_one_exponent():
    """gso: one exponent for the whole super-packet, in every packet cut from it."""
    g = raw_gradients(16000)
    p, keep = parsed(super_packet(g.tobytes(), 1, 0x18))
    out, seg_len, nsegs = ffi.new("uint8_t[]", 65536 + 64 * 128), ffi.new("size_t[]", 64), ffi.new("int *")
    scratch, stream = ffi.new("float[]", 16400), ffi.new("uint8_t[]", 2048 * 34)
    r = lib.nicd_compress_gso_codec(p, 0, lib.NICD_CODEC_SCALED, K, 0x2C, 0, 1500, out, len(out), seg_len, nsegs, 64,
                                    scratch, stream, len(stream), ffi.NULL)
    assert r > 2
    buf, at, restored = bytes(ffi.buffer(out, r)), 0, b""
    want, e = scaled_recon(g)
    for i in range(nsegs[0]):
        seg = buf[at:at + seg_len[i]]
        at += seg_len[i]
        assert seg[52 + 1] == VER | 2 and np.int8(seg[52 + AT]) == e
        rr, back = restore(seg)
        assert rr > 0
        restored += back
    assert nsegs[0] > 1 and restored == want.tobytes()


# --- end to end ------------------------------------------------------------------------------

def send_tagged_by_run(h_send, h_recv, data: bytes, tmp_path, policy: str, port: int) -> bytes:
    """nicd_peer's sender under `inceptionn run --tag POLICY` (it sets ToS 0 itself, which the
    shim's override=keep ignores): the program tags nothing of its own."""
    t = Transfer.__new__(Transfer)  # only its receiver: the sender runs under the shim
    t.port, t.timeout = port, 120
    t.src, t.out = Path(tmp_path) / f"send{port}.bin", Path(tmp_path) / f"recv{port}.bin"
    t.src.write_bytes(data)
    t.send = None
    t.recv = h_recv.popen([PY, PEER, "recv", "--bind", h_recv.ip, "--port", port, "--out", t.out, "--timeout", 120],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert t.recv.stdout.readline().strip() == "listening", t.recv.stderr.read()
        t.send = h_send.popen([INC, "run", "--tag", policy, "--", PY, PEER, "send", "--host", h_recv.ip,
                               "--port", port, "--data", t.src, "--tos", "0", "--timeout", 120],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return t.finish()
    finally:
        t.close()


@needs_root
def test_raw_gradients_from_an_unmodified_program_keep_their_accuracy(tmp_path):
    """4 M raw real gradient values, sent by a program tagged with `inceptionn run --tag port=N`
    (the shim's default mark, 0x24), through two default daemons: NMSE at most 0.06. The same
    values with the paper's mark (tos=0x28) on the same daemons get the paper's codec: bit for
    bit its roundtrip (most values arrive as 0). The receiving application sees its sender's mark."""
    g = raw_gradients(4 << 20)
    with make_testbed() as tb:
        h1, h2 = tb.hosts
        add_counting_rule(h2, "compressed", "-p", "tcp", "-m", "dscp", "--dscp", "11")
        for mark in (TOS_SCALED, TOS_TAGGED, 0x2C):
            h2.run(["iptables", "-w", "5", "-A", "INPUT", "-p", "tcp", "-m", "dscp", "--dscp", str(mark >> 2),
                    "-m", "comment", "--comment", f"nt-app-{mark:#x}"], check=True)
        with running_nicd(h1, tmp_path) as d1, running_nicd(h2, tmp_path) as d2:
            got = {}
            for mark, policy, port in ((TOS_SCALED, "port=5301", 5301), (TOS_TAGGED, "port=5302,tos=0x28", 5302)):
                before = d1.counters()
                got[mark] = send_tagged_by_run(h1, h2, g.tobytes(), tmp_path, policy, port)
                after = d1.counters()
                d = {k: after[k] - before[k] for k in after}
                orig, wire, raw = d["egress_orig_bytes"], d["egress_wire_bytes"], d["egress_raw_bytes"]
                ratio = (orig + raw) / (wire + raw)
                err = nmse(np.frombuffer(got[mark], np.float32), g)
                print(f"mark {mark:#04x}: NMSE {err:.4f} at {ratio:.1f}x ({orig / g.nbytes:.1%} compressed)")
                assert len(got[mark]) == g.nbytes
                assert_went_compressed(d, g.nbytes, f"mark {mark:#04x}")
                if mark == TOS_SCALED:
                    assert err <= 0.06, err
                    if d["egress_raw_view_pending"] == 0:  # (else much may have left raw, 1x)
                        assert ratio > 2, ratio
                c2 = d2.counters()
            c1 = d1.counters()
        app = {m: rule_counts(h2, f"app-{m:#x}", table="filter")[0] for m in (TOS_SCALED, TOS_TAGGED)}
        app_compressed = rule_counts(h2, "app-0x2c", table="filter")[0]
        on_wire = rule_counts(h2, "compressed")[0]
    assert got[TOS_TAGGED] == recon(g, K).tobytes()  # the paper's codec, bit for bit
    assert nmse(np.frombuffer(got[TOS_TAGGED], np.float32), g) > 0.1  # what codec 2 is for
    assert c1["flows_negotiated"] == 2 and c2["ingress_restored"] == c1["egress_compressed"]
    assert compressed_skbs(c1, c2) <= on_wire
    # every restored packet reached the stack with its sender's mark, none still compressed (those the
    # receive offload merged reached it inside the packet before them)
    assert app[TOS_SCALED] > 0 and app[TOS_TAGGED] > 0, (app, c2)
    assert sum(app.values()) >= restored_skbs(c2) - c2["ingress_merged"], (app, c2)
    assert app_compressed == 0
    for key in ("drop_crc", "drop_header", "drop_checksum", "drop_decode", "drop_malformed", "drop_too_big"):
        assert c2[key] == 0, (key, c2)


@needs_root
def test_a_peer_that_knows_codec_1_only_stays_raw(tmp_path):
    """The server's soft NIC answers with codec byte 1 (a soft NIC from before codec 2; here a
    spoofed copy of the real SYN-ACK echoing the real nonce, the real one held back): the
    client counts a mismatch and sends raw, so no codec-2 packet ever reaches it."""
    from test_nicd_negotiation import assert_raw, hello_counts, spoofed_handshake
    data = raw_gradients(50_000).tobytes()
    got, c1 = spoofed_handshake(tmp_path, data, "codec1", 1, tos=TOS_SCALED)
    assert got == data
    assert_raw(c1)
    assert c1["hello_received"] == 1 and c1["hello_mismatch"] == 1, hello_counts(c1)


@needs_root
def test_training_on_raw_gradients_through_the_scaled_mode(tb_name, no_leaks):
    """The collective with scaling and error feedback off, sending its raw values on 0x24 sockets
    through the soft NICs (--compress nic-scaled): the HDC learns (training loss falls, test
    accuracy far above chance after 6 epochs). The same run in the paper's mode (the collective
    quantising raw values to the codec, as the paper's NIC would) stays at chance: loss ~2.30.
    The full measurement (20 epochs, 3 seeds, against uncompressed) is in docs/wire-format.md."""
    from inceptionn.train.job import TrainConfig, TrainingTestbed
    runs, losses = {}, {}
    with TrainingTestbed(hosts=4, rate=None, mtu=9000, name=tb_name) as bed:
        for compress in ("nic-scaled", "nic"):
            cfg = TrainConfig(algo="inc", compress=compress, scaling=False, error_feedback=False, epochs=6)
            events = []
            runs[compress] = bed.run(cfg, lambda c, e: events.append(e))
            losses[compress] = [e["loss"] for e in events if e.get("event") == "epoch"]
    scaled, paper = runs["nic-scaled"], runs["nic"]
    print({k: (r.final_accuracy, losses[k]) for k, r in runs.items()})
    nic = scaled.bytes["nicd"]
    assert nic["egress_compressed"] > 0 and nic["ratio"] > 2 and not nic["drops"], nic
    assert scaled.final_accuracy >= 0.6 and losses["nic-scaled"][-1] < 1.5, (scaled.accuracy, losses)
    assert paper.replicas_identical
    assert paper.final_accuracy < 0.4 and min(losses["nic"]) > 2.2, (paper.accuracy, losses)
