"""Data sets for the training workload: scikit-learn's digits (default) or MNIST from IDX / .npz.

Everything comes back as float32 pixels in [0, 1] and int64 labels. The product never depends on
a particular folder: users point ``load_dataset`` at their own files.
"""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inceptionn.errors import UserError

IDX_IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions (N, rows, cols)
IDX_LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension (N,)
IDX_SETS = ("train", "t10k")   # MNIST's file-name prefixes


@dataclass(eq=False)  # identity hash: a Dataset can key an lru_cache without hashing arrays
class Dataset:
    name: str
    x_train: np.ndarray  # (N, n_features) float32 in [0, 1]
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    n_features: int
    n_classes: int


def load_dataset(path: str | os.PathLike | None = None, *, seed: int = 0,
                 n_train: int | None = None, n_test: int | None = None) -> Dataset:
    """Load digits (``path=None``), an MNIST IDX directory or images file, or an ``.npz``.

    A source with a single set of examples is split, seeded and stratified, into ``n_train`` /
    ``n_test`` examples; by default 80/20 (8,000 / 2,000 for the 10,000-image MNIST test set).
    A directory holding both MNIST ``train-*`` and ``t10k-*`` files keeps MNIST's own split
    unless split sizes are given (then t10k alone is split).
    """
    if path is None:
        from sklearn.datasets import load_digits
        digits = load_digits()
        x = (digits.data / 16.0).astype(np.float32)  # 4-bit pixels, 0..16
        return _split("digits", x, digits.target.astype(np.int64), seed, n_train, n_test)

    path = Path(path)
    if not path.exists():
        raise UserError(f"data path {path} does not exist")
    if path.is_dir():
        found = {prefix: _find_idx_pair(path, prefix) for prefix in IDX_SETS}
        found = {prefix: pair for prefix, pair in found.items() if pair is not None}
        if not found:
            raise UserError(f"no MNIST IDX files in {path} (expected t10k-images-idx3-ubyte[.gz] "
                            "and t10k-labels-idx1-ubyte[.gz], or train-*)")
        if len(found) == 2 and n_train is None and n_test is None:
            x_tr, y_tr = read_idx_pair(*found["train"])
            x_te, y_te = read_idx_pair(*found["t10k"])
            return _dataset(f"mnist:{path}", x_tr, y_tr, x_te, y_te)
        images, labels = found.get("t10k") or found["train"]
        x, y = read_idx_pair(images, labels)
        return _split(f"mnist:{images}", x, y, seed, n_train, n_test)
    if path.suffix == ".npz":
        x, y = _read_npz(path)
        return _split(f"npz:{path}", x, y, seed, n_train, n_test)
    labels = _labels_beside(path)
    x, y = read_idx_pair(path, labels)
    return _split(f"mnist:{path}", x, y, seed, n_train, n_test)


def read_idx(path: str | os.PathLike, magic: int) -> np.ndarray:
    """Parse one IDX file (gzip or plain) whose header must carry ``magic``; uint8 array."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise UserError(f"{path}: too short to be an IDX file ({len(data)} bytes)")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise UserError(f"{path}: wrong IDX magic number 0x{found:08x}, expected 0x{magic:08x} "
                        f"({'images' if magic == IDX_IMAGES_MAGIC else 'labels'})")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserError(f"{path}: truncated IDX header ({len(data)} of {header} bytes)")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) < expected:
        raise UserError(f"{path}: truncated IDX data: header says {dims} "
                        f"({expected} bytes) but the file has {len(data)} bytes")
    if len(data) > expected:
        raise UserError(f"{path}: {len(data) - expected} unexpected bytes after the IDX data {dims}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_pair(images: str | os.PathLike, labels: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """MNIST images (N, rows*cols) float32 in [0, 1] and labels (N,) int64, counts checked."""
    x = read_idx(images, IDX_IMAGES_MAGIC)
    y = read_idx(labels, IDX_LABELS_MAGIC)
    if len(x) != len(y):
        raise UserError(f"{images} has {len(x)} images but {labels} has {len(y)} labels")
    return (x.reshape(len(x), -1) / np.float32(255)).astype(np.float32), y.astype(np.int64)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write a uint8 array as IDX (gzip if the name ends in .gz); used by tests and tools."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = (0x0800 | array.ndim).to_bytes(4, "big")
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise UserError(f"IDX file {path} not found")
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":  # gzip magic: decide by content, not by the file name
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: corrupt or truncated gzip data ({exc})") from None


def _find_idx_pair(folder: Path, prefix: str) -> tuple[Path, Path] | None:
    """MNIST names the files ``t10k-images-idx3-ubyte`` (some mirrors: ``t10k-images.idx3-ubyte``)."""
    for sep in ("-", "."):
        for gz in (".gz", ""):
            images = folder / f"{prefix}-images{sep}idx3-ubyte{gz}"
            if images.is_file():
                return images, _labels_beside(images)
    return None


def _labels_beside(images: Path) -> Path:
    name = images.name
    if "images" not in name or "idx3" not in name:
        raise UserError(f"{images}: expected an MNIST images file named like "
                        "t10k-images-idx3-ubyte[.gz], a directory, or an .npz with arrays x and y")
    stem = name.replace("images", "labels").replace("idx3", "idx1")
    stem = stem[:-3] if stem.endswith(".gz") else stem
    for candidate in (images.with_name(stem), images.with_name(stem + ".gz")):
        if candidate.is_file():
            return candidate
    raise UserError(f"labels file {images.with_name(stem)}[.gz] not found beside {images}")


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = {"x", "y"} - set(npz.files)
            if missing:
                raise UserError(f"{path}: missing array(s) {sorted(missing)}; "
                                f"expected x (N,H,W or N,D) and y (N,), found {npz.files}")
            x, y = npz["x"], npz["y"]
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable .npz file ({exc})") from None
    if x.ndim not in (2, 3) or y.ndim != 1 or len(x) != len(y):
        raise UserError(f"{path}: x has shape {x.shape} and y {y.shape}; "
                        "expected x (N,H,W) or (N,D) and y (N,)")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise UserError(f"{path}: labels y must be non-negative integers")
    x = x.reshape(len(x), -1).astype(np.float32)
    if x.size and x.max() > 1.0:  # 8-bit pixels
        x /= np.float32(255)
    return x, y.astype(np.int64)


def _split(name: str, x: np.ndarray, y: np.ndarray, seed: int,
           n_train: int | None, n_test: int | None) -> Dataset:
    n = len(x)
    if n_test is None:
        n_test = n - n_train if n_train is not None else round(n * 0.2)
    if n_train is None:
        n_train = n - n_test
    if n_train < 1 or n_test < 1 or n_train + n_test > n:
        raise UserError(f"cannot split {n} examples into {n_train} train / {n_test} test")
    from sklearn.model_selection import train_test_split
    try:  # stratified keeps every class's share in both halves
        tr, te = train_test_split(np.arange(n), train_size=n_train, test_size=n_test,
                                  random_state=seed, stratify=y)
    except ValueError:  # a class too rare to stratify: plain seeded split
        tr, te = train_test_split(np.arange(n), train_size=n_train, test_size=n_test,
                                  random_state=seed)
    return _dataset(name, x[tr], y[tr], x[te], y[te])


def _dataset(name, x_train, y_train, x_test, y_test) -> Dataset:
    n_classes = int(max(y_train.max(), y_test.max())) + 1
    return Dataset(name, np.ascontiguousarray(x_train, np.float32), y_train.astype(np.int64),
                   np.ascontiguousarray(x_test, np.float32), y_test.astype(np.int64),
                   n_features=x_train.shape[1], n_classes=n_classes)
