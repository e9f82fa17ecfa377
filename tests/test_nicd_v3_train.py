"""Wire format v3 (docs/wire-format.md, "Segment trains"), the pure transform through the cffi
module: a super-packet compressed into one train that the kernel's GSO cuts every gso_size bytes,
each segment decodable alone, any run of consecutive segments (what GRO merges) restoring into one
packet at the original seq. The cutting and merging here do what tcp_gso_segment and
tcp_gro_receive do to the bytes (seq + k * gso_size, IP id + k, FIN/PSH on the last only, CWR on
the first only; a merge keeps the first header and takes the last's FIN/PSH).
"""
from __future__ import annotations

import struct

import numpy as np
import pytest

from test_nicd import assert_words_equal, recon
from test_nicd_gso import super_packet

OFFSET = 0x80000000


def lib_ffi():
    from inceptionn.daemon._datapath import ffi, lib
    return ffi, lib


def parse(pkt: bytes):
    ffi, lib = lib_ffi()
    keep = ffi.from_buffer(pkt)
    p = ffi.new("struct nicd_pkt *")
    assert lib.nicd_parse(keep, len(pkt), p) == 0
    return p, keep


def finish(pkt: bytearray) -> bytes:
    """Lengths, IP and TCP checksums right, as the kernel writes them."""
    ffi, lib = lib_ffi()
    buf = ffi.from_buffer(pkt)
    lib.nicd_finish(buf, len(pkt), pkt[1])
    return bytes(pkt)


def compress_train(pkt: bytes, gso: int, stream_off=0, codec=1, max_segs=64):
    ffi, lib = lib_ffi()
    p, keep = parse(pkt)
    out, nsegs = ffi.new("uint8_t[]", 65536 + 64), ffi.new("int *")
    r = lib.nicd_compress_train(p, stream_off, codec, -10, 0x2C, 0x123, gso, out, len(out), nsegs, max_segs,
                                ffi.new("float[]", 16400), ffi.new("uint8_t[]", 2048 * 34), 2048 * 34, ffi.NULL)
    return r, (bytes(ffi.buffer(out, r)) if r > 2 else b""), nsegs[0]


def gso_cut(train: bytes, gso: int) -> list[bytes]:
    """The segments the kernel's software GSO makes of the train."""
    hl = 20 + (train[32] >> 4) * 4
    hdr, payload = train[:hl], train[hl:]
    seq0, id0 = struct.unpack("!I", hdr[24:28])[0], struct.unpack("!H", hdr[4:6])[0]
    pieces = [payload[i:i + gso] for i in range(0, len(payload), gso)]
    segs = []
    for k, piece in enumerate(pieces):
        h = bytearray(hdr)
        h[4:6] = struct.pack("!H", (id0 + k) & 0xFFFF)
        h[24:28] = struct.pack("!I", (seq0 + k * gso) & 0xFFFFFFFF)
        if k != len(pieces) - 1:
            h[33] &= ~0x09
        if k:
            h[33] &= ~0x80
        segs.append(finish(h + piece))
    return segs


def gro_merge(segs: list[bytes]) -> bytes:
    """What GRO hands up for a run of consecutive segments: the first header, all payloads, the
    last one's FIN/PSH."""
    hl = 20 + (segs[0][32] >> 4) * 4
    m = bytearray(segs[0][:hl]) + b"".join(s[hl:] for s in segs)
    m[33] |= segs[-1][33] & 0x09
    return finish(m)


def restore_train(pkt: bytes, verify=1, tos=0x28):
    ffi, lib = lib_ffi()
    p, keep = parse(pkt)
    out, restored, left = ffi.new("uint8_t[]", 65536), ffi.new("int *"), ffi.new("int *")
    r = lib.nicd_restore_train(p, verify, tos, out, len(out), ffi.new("float[]", 16400), restored, left)
    return r, (bytes(ffi.buffer(out, r)) if r > 0 else b""), restored[0], left[0]


def payload_of(stream_off: int, grads) -> tuple[bytes, int]:
    head = (4 - stream_off) & 3
    return bytes(range(1, head + 1)) + grads[:16200].tobytes() + b"\x07\x08", head


@pytest.mark.parametrize("gso", [1448, 8948])
@pytest.mark.parametrize("stream_off", [0, 1, 2, 3])
def test_train_segments_restore_alone_and_merged(grads, gso, stream_off):
    payload, head = payload_of(stream_off, grads)
    seq = 0xFFFFFFFF - 5000  # wraps inside the super-packet
    pkt = super_packet(payload, seq, 0x80 | 0x10 | 0x08 | 0x01)  # CWR ACK PSH FIN
    r, train, n = compress_train(pkt, gso, stream_off)
    assert r > 2, r
    assert 1 < n < len(payload) / gso / 2  # fewer than half the segments of the original
    assert struct.unpack("!I", train[24:28])[0] == (seq + OFFSET) & 0xFFFFFFFF  # the fail-closed mark
    assert train[1] == 0x2C and train[20:24] == pkt[20:24] and train[28:32] == pkt[28:32]  # ports, ack
    assert train[40:52] == pkt[40:52]  # the options, which GSO copies to every segment
    r0, whole, restored, left = restore_train(train)  # the train itself: its checksum is right
    assert r0 > 0 and restored == n and left == 0
    segs = gso_cut(train, gso)
    assert len(segs) == n and all(len(s) - 52 == gso for s in segs[:-1]) and len(segs[-1]) - 52 <= gso
    want = recon(np.frombuffer(payload[head:head + 4 * 16200], np.float32), -10).tobytes()
    ranges, at = [], 0
    for s in segs:  # each alone, as after a loss with GRO off
        b, out, k, left = restore_train(s)
        assert b > 0 and k == 1 and left == 0, b
        assert len(s) < b, "a segment smaller than its range"
        assert struct.unpack("!I", out[24:28])[0] == (seq + at) & 0xFFFFFFFF
        ranges.append(out[52:])
        at += b - 52
    restored_bytes = b"".join(ranges)
    assert at == len(payload) and restored_bytes[:head] == payload[:head] and restored_bytes[-2:] == b"\x07\x08"
    assert_words_equal(restored_bytes[head:-2], want, "segments restored alone")
    assert whole[52:] == restored_bytes and whole[33] == pkt[33] and whole[1] == 0x28
    for i, j in [(0, n), (1, n), (0, 2), (n // 2, n - 1)]:  # runs GRO may hand up
        b, out, k, left = restore_train(gro_merge(segs[i:j]), verify=0)
        assert b > 0 and k == j - i and left == 0
        assert out[52:] == b"".join(ranges[i:j])
        assert struct.unpack("!I", out[24:28])[0] == (seq + sum(len(x) for x in ranges[:i])) & 0xFFFFFFFF
        assert (out[33] & 0x09 != 0) == (j == n)  # FIN and PSH only with the last segment
        p, keep = parse(out)
        assert lib_ffi()[1].nicd_tcp_checksum(keep, len(out)) == 0  # right over the whole packet


def test_train_corrupted_or_joined_restores_only_a_checked_prefix(grads):
    payload, _ = payload_of(0, grads)
    pkt = super_packet(payload, 1000, 0x10 | 0x08)
    _, train, n = compress_train(pkt, 1448)
    segs = gso_cut(train, 1448)
    good = [restore_train(s)[1][52:] for s in segs]
    for bad in range(n):  # one payload byte of segment `bad` flipped in transit
        s = bytearray(segs[bad])
        s[52 + 100 % (len(s) - 52)] ^= 0x10
        merged = gro_merge(segs[:bad] + [finish(s)] + segs[bad + 1:])
        b, out, k, left = restore_train(merged, verify=0)
        if bad == 0:
            assert b < 0 and k == 0  # dropped: TCP retransmits it
            continue
        assert b > 0 and k == bad and left == len(merged) - 52 - sum(len(x) - 52 for x in segs[:bad])
        assert out[52:] == b"".join(good[:bad]) and out[33] & 0x09 == 0
    # another train right behind this one on the wire (a retransmission whose wire seq happens
    # to continue it): only the first train's ranges come out
    pkt2 = super_packet(payload, 1000 + 4 * 999, 0x10)
    _, train2, _ = compress_train(pkt2, 1448)
    seg2 = gso_cut(train2, 1448)[0]
    last = bytearray(seg2)
    wire_end = struct.unpack("!I", segs[-1][24:28])[0] + len(segs[-1]) - 52
    last[24:28] = struct.pack("!I", wire_end)
    b, out, k, left = restore_train(gro_merge(segs + [finish(last)]), verify=0)
    assert k == n and left == len(seg2) - 52 and out[52:] == b"".join(good)
    # the packet's checksum checked when the kernel has not
    s = bytearray(segs[0])
    s[30] ^= 1  # the window
    assert restore_train(bytes(s))[0] == -4  # NICD_E_CHECKSUM


def test_versions_refuse_each_other(grads):
    """A v2 receiver refuses a v3 segment (and the stack drops it for its seq); v3 refuses v2
    packets and segments whose original seq lies outside the train's 64 KB behind the wire seq."""
    ffi, lib = lib_ffi()
    payload, _ = payload_of(0, grads)
    pkt = super_packet(payload, 1000, 0x10)
    _, train, _ = compress_train(pkt, 1448)
    seg = gso_cut(train, 1448)[1]
    p, keep = parse(seg)
    assert lib.nicd_shim_version(p) == 3
    assert lib.nicd_restore(p, 0x28, ffi.new("uint8_t[]", 65536), 65536, ffi.new("float[]", 16400)) < 0
    small = super_packet(grads[:300].tobytes(), 1000, 0x10)
    sp, skeep = parse(small)
    out = ffi.new("uint8_t[]", 4096)
    r = lib.nicd_compress(sp, 0, -10, 0x2C, 0, out, len(out), ffi.new("float[]", 400), ffi.NULL)
    v2 = bytes(ffi.buffer(out, r))
    assert restore_train(v2, verify=0)[0] == -5  # NICD_E_HEADER
    moved = bytearray(seg)  # the same bytes 64 KB further on the wire: no train holds that
    moved[24:28] = struct.pack("!I", (struct.unpack("!I", seg[24:28])[0] - 0x10000) & 0xFFFFFFFF)
    assert restore_train(finish(moved))[0] == -5
    raw = bytearray(seg)  # the same bytes at their original seq, as a v2-era sender would put them
    raw[24:28] = struct.pack("!I", 1000)
    assert restore_train(finish(raw))[0] == -5


@pytest.mark.parametrize("gso", [88, 536, 1448, 8948, 65000])
def test_super_packets_of_every_size_train_or_stay_raw(grads, gso):
    """Sizes from one float to 64 KB, both codecs: a train is smaller than the original, its
    segments exactly gso bytes but the last, and it restores to the original length; what does
    not compress (too short, or a segment not smaller) is refused whole."""
    for nbytes in [1, 5, 64, 300, 1447, 1448, 1449, 3000, 20000, 65000]:
        data = grads[1000:1000 + (nbytes + 3) // 4].tobytes()[:nbytes]
        pkt = super_packet(data, 77, 0x10)
        for codec in (1, 2):
            r, train, n = compress_train(pkt, gso, codec=codec)
            if r <= 2:
                assert r in (1, 2), r  # NOT_SMALLER / TOO_SHORT: left raw
                continue
            assert len(train) < len(pkt) and 1 <= n <= 64
            segs = gso_cut(train, gso)
            assert len(segs) == n
            b, out, k, left = restore_train(train)
            assert b == len(pkt) and k == n and left == 0
