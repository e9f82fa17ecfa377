"""The codec interface every compressor implements (GRACE's "Compressor"): one file per codec.

A codec turns a 1-D float32 array into bytes and back. It never converts silently: wrong dtype,
shape or a malformed stream raise a clear error.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Codec(ABC):
    """A gradient compressor. Subclasses set ``name`` and implement encode/decode_into.

    A codec describes itself with traits (class attributes, ``traits()`` lists them), so that
    callers (the collective, the benchmarks, the training worker) never branch on its name:

    - ``per_value``: every value is encoded on its own (``reconstruct`` is value by value), so
      a vector may be cut anywhere: into pipeline chunks, or into packets by the soft NIC, which
      runs such a codec. Others see a whole tensor (a ring block, a gradient) per encode.
    - ``wants_scaling``: the codec keeps absolute precision (INCEPTIONN's, with an integer
      ``error_bound``), so the collective sends its values scaled by a power of two per block of
      256, chosen at every hop (wire format v2, blockscale.py).
    - ``wants_error_feedback``: what the codec drops should be carried into the next round
      (``ErrorFeedback``); the collective turns it on by default.
    - ``needs_agreement``: every worker must encode with shared parameters (``local_stat`` /
      ``agree``, below).
    - ``thread_safe``: ``encode``/``decode_into`` may run from several threads at once (no
      mutable state); otherwise callers serialise them.

    A codec of the C table (codec_table.h) takes them from its C description, with what its C
    runs: ``c_app`` (in the process, the ring engine's codec transport, the MPI library's app
    mode), ``c_nic`` (the soft NIC runs it), ``c_summed`` (sums streams without decoding).
    """

    name: str = ""
    per_value: bool = False
    wants_scaling: bool = False
    wants_error_feedback: bool = False
    needs_agreement: bool = False
    thread_safe: bool = False

    c_app: bool = False
    c_nic: bool = False
    c_summed: bool = False

    TRAITS = ("per_value", "wants_scaling", "wants_error_feedback", "needs_agreement", "thread_safe")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.name:
            return
        from . import table         # the C table (it imports this module)
        if table.description(cls.name) is not None:
            for trait, value in table.traits(cls.name).items():
                setattr(cls, trait, value)

    def c_state(self, world: int) -> dict | None:
        """The fields of this codec's C state (its description's state_type) for one call of the
        ring engine over ``world`` ranks, or None: the engine calls its Python methods instead
        (no C ring codec, or this instance has none, e.g. ``impl="numpy"``)."""
        return None

    def c_done(self, state) -> None:
        """After an engine call that ran the codec's C: take back what the call moved on in the
        state (a random stream's position)."""

    def traits(self) -> dict[str, bool]:
        """This codec's traits by name (an instance may differ from its class, e.g. TernGrad
        with ``share_scaler``)."""
        return {t: bool(getattr(self, t)) for t in self.TRAITS}

    @abstractmethod
    def encode(self, x: np.ndarray) -> bytes:
        """Compress a 1-D float32 array into a self-contained byte string."""

    @abstractmethod
    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        """Decompress ``blob`` into the caller's float32 array ``out`` (its length is n)."""

    def decode(self, blob, n: int) -> np.ndarray:
        """Decompress ``blob`` holding ``n`` values into a new float32 array."""
        n = check_count(n)
        self.check_count_fits(check_blob(blob).nbytes, n)  # before allocating n floats
        out = np.empty(n, dtype=np.float32)
        return self.decode_into(blob, out)

    # --- sizes: the same two questions for every codec ------------------------------------------
    def encoded_size(self, x: np.ndarray) -> int:
        """Bytes ``encode(x)`` would produce. This default encodes; codecs that can tell without
        encoding (or whose encode has state, such as a random stream) override it."""
        return len(self.encode(check_vector(x)))

    def max_encoded_size(self, n: int) -> int:
        """Bytes that always suffice for ``n`` values (exact for codecs of a fixed size)."""
        raise NotImplementedError(f"{type(self).__name__} does not bound its stream size")

    def check_count_fits(self, nbytes: int, n: int) -> None:
        """Raise ValueError when no valid stream of ``nbytes`` can hold ``n`` values, so a
        hostile count never turns into a huge allocation. Codecs with a size rule override it."""

    # --- Agreement among workers (collective side) -------------------------------------------
    # Some codecs need every worker to encode with the same parameters: TernGrad shares the max
    # scaler, THC the max norm and the rotation seed. The collective calls ``local_stat`` on each
    # worker, max-reduces the results over all workers (untagged control channel), and passes the
    # result to ``agree`` together with a round number every worker knows, before any
    # encode/decode of that round. Codecs that need nothing keep these defaults.
    def local_stat(self, x: np.ndarray) -> float:
        """This worker's statistic for the max-agreement of the round (only if needs_agreement)."""
        return 0.0

    def agree(self, shared: float, round_no: int) -> None:
        """Take the max over workers of ``local_stat`` and the round number (seeds shared RNGs)."""

    def encode_decoded(self, x: np.ndarray) -> tuple[bytes, np.ndarray]:
        """``encode(x)`` and what a receiver decodes from it (error feedback needs both; codecs
        that know the second while encoding override this)."""
        x = check_vector(x)
        blob = self.encode(x)
        return blob, self.decode(blob, x.size)

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """What a receiver decodes for ``x``: the basis of error feedback."""
        return self.encode_decoded(x)[1]

    def reconstruct(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``roundtrip(x)`` with +0.0 for every zero (into ``out`` if given; it may be ``x``).
        For a deterministic per-value codec this is idempotent, which is what lets the ring put
        values on a tagged socket that arrive the same compressed or not (docs/collectives.md).
        Codecs with a faster path override it."""
        y = self.roundtrip(x)
        y += np.float32(0.0)          # -0.0 + 0.0 = +0.0; every other value unchanged
        if out is None:
            return y
        out[:] = y
        return out


class Float32StreamCodec(Codec):
    """A per-value codec applied by the soft NIC, not in the process: what the process sends is
    the float32 values themselves. A subclass gives ``reconstruct``: what the NIC delivers."""

    per_value = True
    thread_safe = True

    def encode(self, x: np.ndarray) -> bytes:
        return np.ascontiguousarray(x, np.float32).tobytes()

    def decode_into(self, blob, out: np.ndarray) -> np.ndarray:
        out[:] = np.frombuffer(blob, np.float32, out.size)
        return out


def check_vector(x) -> np.ndarray:
    """Accept a 1-D float32 ndarray (any strides); refuse everything else with a clear error."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"expected a numpy float32 array, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"expected dtype float32, got {x.dtype} (convert explicitly with .astype(np.float32))")
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D array, got shape {x.shape} (flatten it with .ravel())")
    return np.ascontiguousarray(x)


def check_out(out) -> np.ndarray:
    """The caller's decode buffer must be a writable, contiguous 1-D float32 array."""
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.ndim != 1:
        desc = f"{out.dtype} array of shape {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise TypeError(f"decode buffer must be a 1-D float32 numpy array, got {desc}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("decode buffer must be C-contiguous and writable")
    return out


def check_blob(blob) -> memoryview:
    """Any bytes-like object; returned as a flat byte view without copying."""
    try:
        view = memoryview(blob)
    except TypeError:
        raise TypeError(f"expected a bytes-like stream, got {type(blob).__name__}") from None
    if not view.c_contiguous:
        raise ValueError("stream buffer must be contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_count(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"value count must be an integer, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"value count must be >= 0, got {n}")
    return int(n)


def check_choice(what: str, value, choices):
    """Refuse a ``value`` that is not one of ``choices`` (a codec's impl, packing, ...)."""
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value
