"""The ring's per-chunk transforms in Python (``Wire``, for WA) and the simulator over them
(``simulate_ring``, bench scale).

The ring itself, its schedule, transports and wire, is described once in docs/collectives.md
("The ring", "The ring engine", "Wire format v2") and implemented once, in C: the ring engine
(collective/ring_engine.c), which ``Group.allreduce`` calls through collective/engine.py for
every mode and codec and the MPI library calls directly. WA (wa.py) and the simulator use
``Wire``, which computes the engine's bits chunk for chunk (decode, add, re-encode per hop), so the
simulator gives the bits of a real ring (tested), except for THC, which both sum without decoding
(the same algorithm, other rounding noise).

Error feedback: ``sink.record(a, b, sent, decoded)`` is called for every chunk a WA worker puts on
the wire (``decoded`` = what the receiver gets, ``Wire.send``'s second value).
"""
from __future__ import annotations

import numpy as np

from ..codecs.blockscale import BLOCK_VALUES, HEADROOM, BlockScale

MODES = ("raw", "nic", "app")


def block_bounds(n: int, world: int) -> list[tuple[int, int]]:
    return [(b * n // world, (b + 1) * n // world) for b in range(world)]


def chunk_list(a: int, b: int, chunk: int) -> list[tuple[int, int]]:
    return [(i, min(i + chunk, b)) for i in range(a, b, chunk)]


def scaling_bound(codec) -> int:
    """The error bound the per-block scaling runs INCEPTIONN's reconstruction at: the codec's."""
    k = getattr(codec, "error_bound", None)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"codec {codec.name!r} asks for scaling but has no integer error_bound: the "
                         "per-block scaling runs INCEPTIONN's reconstruction at that bound")
    return int(k)


class Wire:
    """The per-chunk transforms of one call, shared by the socket ring, WA and the simulator
    (bench/scale.py), so that all three produce the same bits.

    ``scaled`` (codecs whose traits ask for scaling): every chunk goes as wire format v2
    (docs/collectives.md): per block of ``blockscale.BLOCK_VALUES`` values, one exponent float and
    the block's values times 2^s through the codec's reconstruction (codecs_c/blockscale_codec.h);
    in ``nic`` mode those floats go on the tagged socket, in ``app`` mode the codec's stream of them
    goes in a frame. Otherwise (v1) a chunk goes as before: the reconstruction (``nic``), the
    codec's stream (``app``) or the floats themselves (``raw``).

    A payload is a float32 array (raw, nic) or bytes (app). ``send`` gives the payload of a
    phase-1 chunk and what its receiver decodes; ``receive`` decodes one into ``out`` (raising
    ValueError for one the sender cannot have produced); ``own`` turns the owner's reduced chunk
    into what every rank keeps, in place, and returns the payload that travels in phase 2, which
    every rank forwards unchanged.
    """

    def __init__(self, mode: str, codec=None, *, scaled: bool = False, need_decoded: bool = True,
                 block: int = BLOCK_VALUES, headroom: int = HEADROOM):
        assert mode in MODES
        self.mode, self.codec = mode, codec
        self.scaled = bool(scaled) and mode != "raw"
        self.need_decoded = need_decoded        # False: send() may skip what the receiver decodes
        self.bs = None
        if self.scaled:
            self.bs = BlockScale(scaling_bound(codec), block, headroom)   # other sizes only to measure them
        # the wire is the values themselves: received straight into the destination
        self.direct = mode == "raw" or (mode == "nic" and not self.scaled)

    def wire_floats(self, m: int) -> int:
        """float32 values on the wire for a chunk of ``m`` (raw and nic modes)."""
        return self.bs.wire_values(m) if self.scaled else m

    def send(self, chunk: np.ndarray):
        """Phase 1: (payload, what the receiver decodes or None when not needed)."""
        if self.mode == "raw":
            return chunk, None
        if self.scaled:
            dec = np.empty_like(chunk) if self.need_decoded else None
            wire = self.bs.encode(chunk, dec)
            return (wire if self.mode == "nic" else self.codec.encode(wire)), dec
        if self.mode == "nic":
            q = self.codec.reconstruct(chunk)   # a fixed point: arrives as q, compressed or not
            return q, q
        if self.need_decoded:
            return self.codec.encode_decoded(chunk)
        return self.codec.encode(chunk), None

    def receive(self, payload, out: np.ndarray) -> None:
        if self.direct:
            if payload is not out:
                out[:] = payload
        elif self.mode == "nic":
            self.bs.decode_into(payload, out)
        elif self.scaled:
            wire = self.codec.decode(payload, self.bs.wire_values(out.size))
            self.bs.decode_into(wire, out)
        else:
            self.codec.decode_into(payload, out)

    def own(self, dst: np.ndarray):
        """Phase 2 at the owner: ``dst`` becomes what every rank decodes; returns the payload."""
        if self.mode == "raw":
            return dst
        if self.scaled:
            wire = self.bs.encode(dst, dst)
            return wire if self.mode == "nic" else self.codec.encode(wire)
        if self.mode == "nic":
            self.codec.reconstruct(dst, dst)
            return dst
        blob, q = self.codec.encode_decoded(dst)
        dst[:] = q
        return blob


class WireError(RuntimeError):
    """A received chunk that its sender cannot have produced for this call (wrong length, an
    exponent out of range, a value the format cannot hold): the call stops, nothing is returned."""


def receive(wire: Wire, payload, out: np.ndarray) -> None:
    """``wire.receive`` for what came from a peer: a malformed payload raises WireError."""
    try:
        wire.receive(payload, out)
    except ValueError as e:
        raise WireError(f"a received chunk does not belong to this call: {e}") from None


def simulate_ring(n: int, world: int, values, *, chunk_values: int, mode: str, codec=None,
                  scaled: bool = False, block: int = BLOCK_VALUES, headroom: int = HEADROOM, count=None,
                  progress=None, sum_encoded: bool | None = None) -> np.ndarray:
    """What the ring engine on ``world`` ranks leaves on every rank, computed in one process
    (bench/scale.py): the same blocks, chunks and Wire transforms in the same order, without
    sockets, so the bits are those of the real ring (tests/test_collective.py holds them
    together). ``values(r, a, b)`` returns rank r's float32 values [a, b) (not modified).

    Block b's partial sum starts at rank b and visits ranks b+1 .. b-1 (phase 1: each sends it
    with ``Wire.send``, the next decodes it with ``Wire.receive`` and adds its own values); the
    last one owns it (``Wire.own``), and phase 2 gives every rank what the owner's payload
    decodes to, which is what the owner keeps. ``count(payload, m, times)``, if given, sees every
    payload: phase 1's once each, the owner's with times = world - 1 (it crosses that many links).
    ``progress(done, world)`` is called after each ring block.

    THC in app mode (``sum_encoded`` None or True) is summed without decoding, as the engine does
    (docs/collectives.md, "The ring engine"): every rank's values encoded once, the streams added
    in the encoded domain, the owner's sum decoded; the same algorithm and wire sizes as the
    engine, not its bits (other rounding noise). ``sum_encoded=False`` runs THC like the other
    codecs (decode, add, re-encode per hop), the ring before the engine ran THC."""
    assert mode in MODES and world >= 2
    if mode == "app" and codec.c_summed and sum_encoded is not False:   # THC: its C sums encoded
        return _simulate_summed(n, world, values, chunk_values, codec, count, progress)
    wire = Wire(mode, codec, scaled=scaled, need_decoded=False, block=block, headroom=headroom)
    out = np.empty(n, dtype=np.float32)
    for b, (lo, hi) in enumerate(block_bounds(n, world)):
        for a, e in chunk_list(lo, hi, chunk_values):
            acc = np.array(values(b, a, e), dtype=np.float32)
            part = np.empty(e - a, dtype=np.float32)
            for j in range(1, world):
                payload, _ = wire.send(acc)
                if count is not None:
                    count(payload, e - a, 1)
                if mode != "raw":
                    receive(wire, payload, part)
                else:
                    part[:] = payload
                acc = np.add(values((b + j) % world, a, e), part)
            payload = wire.own(acc) if mode != "raw" else acc
            if count is not None:
                count(payload, e - a, world - 1)
            out[a:e] = acc
        if progress is not None:
            progress(b + 1, world)
    return out


def _simulate_summed(n, world, values, chunk_values, codec, count, progress) -> np.ndarray:
    """simulate_ring for a codec that sums encoded streams (THC)."""
    out = np.empty(n, dtype=np.float32)
    for b, (lo, hi) in enumerate(block_bounds(n, world)):
        for a, e in chunk_list(lo, hi, chunk_values):
            acc = codec.encode(np.array(values(b, a, e), dtype=np.float32))
            for j in range(1, world):
                if count is not None:
                    count(acc, e - a, 1)
                acc = codec.sum_encoded([acc, codec.encode(np.array(values((b + j) % world, a, e), dtype=np.float32))],
                                        e - a)
            if count is not None:
                count(acc, e - a, world - 1)
            out[a:e] = codec.decode_sum(acc, e - a, reduce="sum")
        if progress is not None:
            progress(b + 1, world)
    return out
