"""THC, Tensor Homomorphic Compression (docs/spec.md section 6), through its C library, with the
numpy reference selectable as ``impl="numpy"`` (same bytes for the same seeds).

One round, per worker (the collective drives the agreement, see ``Codec.needs_agreement``)::

    comp = memory.compensate(key, grad)     # grad + e, e the error-feedback residual (memory.py)
    stat = codec.local_stat(comp)           # ||grad + e||
    codec.agree(max_over_workers(stat), r)  # l = max norm; rotation seed from (seed, r)
    blob = memory.encode(codec, grad, key)  # b-bit table indices, self-contained header; e updated
    # a peer adds blobs without decoding them:
    summed = codec.sum_encoded([blob_0, ..., blob_{N-1}])   # integer sums of T[z]
    mean = codec.decode_sum(summed, grad.size)              # mean of the workers' values

``decode(blob, n)`` of one worker's blob gives that worker's contribution; of a summed blob it
gives the mean over the blob's ``count`` contributions (``decode_sum`` says so explicitly).

THC is specified with error feedback (``e = x - RHT^-1(own quantized)``): the codec says so
(``wants_error_feedback``, ``error_feedback=False`` turns it off) and the shared
``ErrorFeedback`` runs it; the codec keeps no residual itself.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import thc_reference as ref
from . import thc_table_generator
from ._cffi_util import bytes_in, error_text, floats_out
from ._native import ffi, lib
from . import table
from .base import Codec, check_blob, check_choice, check_count, check_out, check_vector
from .memory import check_switch
from .thc_table_generated import TABLES

IMPLS = ("c", "numpy")
_DEFAULTS = table.defaults("thc")      # get_codec("thc")'s, from its C description
SUM_WIDTHS = (8, 16, 32)
_U64 = 1 << 64


def round_seed(seed: int, round_no: int) -> int:
    """The rotation seed of a round: splitmix64 word ``round_no`` of ``seed`` (every worker
    computes the same value from the shared seed and the round number)."""
    return int(ref.random_words(seed, round_no + 1)[round_no])


def lookup_table(bits: int, granularity: int, p: float, kind: str = "nonuniform") -> tuple[int, ...]:
    """The shipped optimal table T_{b,g,p} (computed on the spot, by the same offline solver,
    for a combination that is not shipped), or the identity for ``kind="uniform"``."""
    if kind == "uniform":
        if granularity != (1 << bits) - 1:
            raise ValueError(f"the uniform table needs granularity 2^bits - 1 = {(1 << bits) - 1}, "
                             f"got {granularity}")
        return thc_table_generator.uniform_table(bits)
    if kind != "nonuniform":
        raise ValueError(f"table must be 'nonuniform', 'uniform' or a sequence of levels, got {kind!r}")
    return TABLES.get((bits, granularity, p)) or thc_table_generator.optimal_table(bits, granularity, p)


def _int_param(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value}")
    return int(value)


class THCCodec(Codec):
    """THC with ``bits`` per index, granularity ``g``, clamp fraction ``p`` (paper: 4, 30, 1/32)."""

    name = "thc"                 # traits: its C description (thc_codec.c)

    def __init__(self, bits: int = _DEFAULTS.bits, granularity: int | None = None, p: float = 1 / 32,
                 table: str | Sequence[int] = "nonuniform", seed: int = 0,
                 error_feedback: bool = True, noise_seed: int | None = None,
                 impl: str = "c"):
        self.bits = _int_param("bits", bits, 1, lib.THC_MAX_BITS)
        levels = 1 << self.bits
        if granularity is None:  # the paper's 30 for 4 bits: twice the uniform grid
            granularity = levels - 1 if isinstance(table, str) and table == "uniform" else min(2 * (levels - 1), 255)
        self.granularity = _int_param("granularity", granularity, levels - 1, lib.THC_MAX_GRANULARITY)
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0.0 < p < 1.0:
            raise ValueError(f"p (the expected fraction of clamped coordinates) must be in (0, 1), got {p!r}")
        self.p = float(p)
        self.t_p = thc_table_generator.t_p(self.p)
        if isinstance(table, str):
            self.table_kind = table
            self.table = lookup_table(self.bits, self.granularity, self.p, table)
        else:
            try:
                levels_given = tuple(_int_param("table entry", t, 0, 255) for t in table)
            except TypeError:
                raise TypeError(f"table must be 'nonuniform', 'uniform' or a sequence of ints, got {table!r}") from None
            self.table_kind = "custom"
            self.table = tuple(int(t) for t in ref.check_table(levels_given, self.bits, self.granularity))
        self.seed = _int_param("seed", seed, 0, _U64 - 1)
        if noise_seed is not None:
            noise_seed = _int_param("noise_seed", noise_seed, 0, _U64 - 1)
        self._noise = np.random.default_rng(noise_seed)  # per worker: independent rounding noise
        self.wants_error_feedback = check_switch("error_feedback", error_feedback)
        check_choice("impl", impl, IMPLS)
        self.impl = impl
        self._table_c = ffi.new("uint8_t[]", bytes(self.table))
        self._agreed: tuple[float, int] | None = None  # (l, round number)
        self._auto_round = 0

    def __repr__(self) -> str:
        return (f"THCCodec(bits={self.bits}, granularity={self.granularity}, p={self.p}, "
                f"table={self.table_kind!r}, error_feedback={self.wants_error_feedback}, impl={self.impl!r})")

    # --- agreement ----------------------------------------------------------------------------
    def _norm(self, x: np.ndarray) -> float:
        if self.impl == "numpy":
            # the C loop's order (left to right in double; float32 squares are exact there), not
            # np.dot, whose BLAS kernel and so its rounding depend on the CPU
            x64 = x.astype(np.float64)
            s = float(np.cumsum(x64 * x64)[-1]) if x.size else 0.0
        else:
            s = float(lib.thc_sum_squares(ffi.cast("const float *", ffi.from_buffer(x)), x.size))
        if not np.isfinite(s):
            raise ValueError("THC input holds a non-finite value (its norm is not finite)")
        return float(np.sqrt(s))

    def local_stat(self, x: np.ndarray) -> float:
        """``||x||`` of the vector to encode (with error feedback: the compensated one); the max
        over workers is ``l``."""
        return self._norm(check_vector(x))

    def agree(self, shared: float, round_no: int) -> None:
        """``shared`` = max over workers of ``local_stat``; ``round_no`` seeds the rotation."""
        if isinstance(shared, bool) or not isinstance(shared, (int, float, np.floating, np.integer)):
            raise TypeError(f"the agreed norm must be a number, got {shared!r}")
        if not np.isfinite(shared) or shared < 0:
            raise ValueError(f"the agreed norm must be finite and >= 0, got {shared}")
        round_no = _int_param("round_no", round_no, 0, _U64 - 2)
        self._agreed = (float(shared), round_no)

    def round_parameters(self) -> tuple[float, int, int]:
        """This round's (agreed norm l, rotation seed, a fresh noise seed of this worker) for an
        engine that encodes in C (codecs_c/thc_codec.c, "in the ring"): the values ``encode`` would use,
        after ``agree``."""
        if self._agreed is None:
            raise RuntimeError("THC in a collective needs agree() first (the max norm and the round)")
        norm, round_no = self._agreed
        return norm, round_seed(self.seed, round_no), int(self._noise.integers(0, _U64, dtype=np.uint64))

    def c_state(self, world: int) -> dict:
        """Its C in the engine (thc_codec.c, struct re_thc): this round's parameters."""
        norm, rot_seed, noise_seed = self.round_parameters()
        return {"bits": self.bits, "granularity": self.granularity, "ranks": world, "table": list(self.table),
                "t_p": self.t_p, "norm": norm, "rot_seed": rot_seed, "noise_seed": noise_seed}

    def range_for(self, norm: float, n: int) -> np.float32:
        """``M = t_p * l / sqrt(d)`` as the float32 the header carries."""
        return np.float32(self.t_p * norm / np.sqrt(float(ref.padded_dim(n))))

    # --- encode / decode ----------------------------------------------------------------------
    def encode(self, x: np.ndarray) -> bytes:
        """Compress. Without an ``agree`` (a single worker) the codec agrees with itself:
        ``l = ||x||`` and the round number counts the encodes."""
        x = check_vector(x)
        if self._agreed is None:
            norm, round_no = self._norm(x), self._auto_round
            self._auto_round += 1
        else:
            norm, round_no = self._agreed
        return self.encode_with(x, self.range_for(norm, x.size), round_seed(self.seed, round_no),
                                int(self._noise.integers(0, _U64, dtype=np.uint64)))

    def encode_with(self, x: np.ndarray, range_: float, rot_seed: int, noise_seed: int) -> bytes:
        """The bare quantizer with explicit range M, rotation and noise seeds (no error feedback)."""
        x = check_vector(x)
        if self.impl == "numpy":
            return ref.encode(x, range_, rot_seed, noise_seed, self.bits, self.granularity, self.table)
        d = ref.padded_dim(x.size)
        out = np.empty(lib.thc_blob_size(x.size, self.bits, self.bits), dtype=np.uint8)
        work = np.empty(d, dtype=np.float32)
        r = lib.thc_encode(ffi.cast("const float *", ffi.from_buffer(x)), x.size, float(np.float32(range_)),
                           rot_seed, noise_seed, self.bits, self.granularity, self._table_c,
                           ffi.cast("float *", ffi.from_buffer(work)), ffi.cast("uint8_t *", ffi.from_buffer(out)),
                           out.size)
        if r == lib.THC_E_NONFINITE:
            raise ValueError("THC input holds a non-finite value, overflows float32 in the transform, "
                             "or its range M exceeds FLT_MAX / d")
        if r < 0:
            raise RuntimeError(f"thc encode failed: {error_text(lib.thc_strerror, r)}")
        return out.tobytes()

    def _fail(self, r: int, at: int, nbytes: int, n: int):
        raise ValueError(f"malformed THC stream: {error_text(lib.thc_strerror, r)} at byte {at} "
                         f"(stream of {nbytes} bytes, {n} values)")

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        view = check_blob(blob)
        out = check_out(out)
        if self.impl == "numpy":
            out[:] = ref.decode(bytes(view), out.size)
            return out
        work = np.empty(ref.padded_dim(out.size), dtype=np.float32)
        err_at = ffi.new("size_t *")
        r = lib.thc_decode(ffi.from_buffer(view), view.nbytes, out.size, ffi.cast("float *", ffi.from_buffer(work)),
                           floats_out(out), err_at)
        if r != lib.THC_OK:
            self._fail(r, err_at[0], view.nbytes, out.size)
        return out

    def decode_rotated(self, blob, n: int) -> np.ndarray:
        """The mean of the blob's contributions in the rotated domain (length d, no inverse RHT)."""
        view = check_blob(blob)
        n = check_count(n)
        self.check_count_fits(view.nbytes, n)
        if self.impl == "numpy":
            return ref.decode_rotated(bytes(view), n)
        work = np.empty(ref.padded_dim(n), dtype=np.float32)
        err_at = ffi.new("size_t *")
        r = lib.thc_decode_rotated(ffi.from_buffer(view), view.nbytes, n, ffi.cast("float *", ffi.from_buffer(work)), err_at)
        if r != lib.THC_OK:
            self._fail(r, err_at[0], view.nbytes, n)
        return work

    def check_count_fits(self, nbytes: int, n: int) -> None:
        d = ref.padded_dim(n)  # ValueError beyond 2^31
        lo, hi = ref.HEADER_BYTES + 2 + -(-d // 8), ref.HEADER_BYTES + 256 + 4 * d
        if not lo <= nbytes <= hi:
            raise ValueError(f"malformed THC stream: {n} values (padded to {d}) take {lo} to {hi} bytes, got {nbytes}")

    # --- the homomorphic part -----------------------------------------------------------------
    def info(self, blob) -> dict:
        """The header fields of a checked blob (kind, bits, granularity, width, dim, count, ...)."""
        view = check_blob(blob)
        if self.impl == "numpy":
            info = ref.parse(bytes(view))
            info.pop("payload")
            info["table"] = tuple(int(t) for t in info["table"])
            info["range"] = float(info["range"])
            return info
        c = ffi.new("struct thc_info *")
        r = lib.thc_inspect(bytes_in(view), view.nbytes, c)
        if r != lib.THC_OK:
            self._fail(r, 0, view.nbytes, -1)
        return dict(kind=c.kind, bits=c.bits, granularity=c.granularity, width=c.width, log2_dim=c.log2_dim,
                    dim=1 << c.log2_dim, count=c.count, range=float(c.range), seed=int(c.seed),
                    table=tuple(c.table[0:1 << c.bits]))

    def max_workers(self, width: int = 8) -> int:
        """Contributions a ``width``-bit sum holds: floor((2^width - 1) / g) (8 at g = 30)."""
        if width not in SUM_WIDTHS:
            raise ValueError(f"sum width must be one of {SUM_WIDTHS}, got {width!r}")
        return ((1 << width) - 1) // self.granularity

    def sum_encoded(self, blobs: Sequence, n: int | None = None, width: int | None = None) -> bytes:
        """Add index blobs and/or partial sums without decoding: a sum blob of integer sums of
        T[z] with ``width``-bit elements (8, 16 or 32; by default the smallest that holds all the
        contributions). Refuses with ValueError when count * g would overflow the width."""
        if isinstance(blobs, (bytes, bytearray, memoryview, np.ndarray)) or not isinstance(blobs, Sequence):
            raise TypeError("sum_encoded takes a sequence of blobs")
        if not blobs:
            raise ValueError("sum_encoded needs at least one blob")
        views = [check_blob(b) for b in blobs]
        infos = [self.info(v) for v in views]
        if n is None:
            n = infos[0]["dim"]
        n = check_count(n)
        total = sum(i["count"] for i in infos)
        g = infos[0]["granularity"]
        if width is None:
            width = next((w for w in SUM_WIDTHS if total * g <= (1 << w) - 1), None)
            if width is None:
                raise ValueError(f"THC sum overflow: {total} contributions x granularity {g} exceed 32 bits")
        if width not in SUM_WIDTHS:
            raise ValueError(f"sum width must be one of {SUM_WIDTHS}, got {width!r}")
        if total * g > (1 << width) - 1:
            raise ValueError(f"THC sum overflow: {total} contributions x granularity {g} = {total * g} "
                             f"exceed {width}-bit elements (at most {((1 << width) - 1) // g} contributions)")
        if self.impl == "numpy":
            return ref.sum_blobs([bytes(v) for v in views], n, width)
        bufs = [ffi.from_buffer(v) for v in views]
        ptrs = ffi.new("const uint8_t *[]", [ffi.cast("const uint8_t *", b) for b in bufs])
        lens = ffi.new("size_t[]", [v.nbytes for v in views])
        out = np.empty(lib.thc_blob_size(n, infos[0]["bits"], width), dtype=np.uint8)
        err_at = ffi.new("size_t *")
        r = lib.thc_sum(ptrs, lens, len(views), n, width, ffi.cast("uint8_t *", ffi.from_buffer(out)), out.size, err_at)
        if r < 0:
            raise ValueError(f"cannot sum THC blobs: {error_text(lib.thc_strerror, r)} (blob {err_at[0]})")
        return out.tobytes()

    def decode_sum(self, summed, n: int, count: int | None = None, reduce: str = "mean") -> np.ndarray:
        """Decode a sum blob: the **mean** of the ``count`` workers' decoded values (or, with
        ``reduce="sum"``, their sum: the mean times count, rounded to float32)."""
        info = self.info(summed)
        if info["kind"] != ref.KIND_SUM:
            raise ValueError("decode_sum expects a summed THC blob (kind 1), got an index blob")
        if count is not None and count != info["count"]:
            raise ValueError(f"the summed blob holds {info['count']} contributions, expected {count}")
        if reduce not in ("mean", "sum"):
            raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
        mean = self.decode(summed, n)
        return mean if reduce == "mean" else (mean * np.float32(info["count"])).astype(np.float32)

    def encoded_size(self, x: np.ndarray) -> int:
        """Bytes of one worker's blob for x (header, table and padding included; only the length
        counts)."""
        return self.max_encoded_size(check_vector(x).size)

    def max_encoded_size(self, n: int) -> int:
        return ref.blob_size(check_count(n), self.bits, self.bits)

    def reset(self) -> None:
        """Forget the agreement."""
        self._agreed = None
