"""The training workload: data loading, HDC backprop, SGD, accuracy, captured gradients."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from inceptionn.errors import UserError
from inceptionn.train.data import load_dataset, read_idx_pair, write_idx
from inceptionn.train.gradients import capture_gradients, gradient_sample
from inceptionn.train.hdc import HDC, SGD, train_epoch

MNIST_T10K = Path("/work/shared/data/mnist-t10k")


@pytest.fixture(scope="module")
def digits():
    return load_dataset(seed=0)


# --- data ---------------------------------------------------------------------------------------

def test_digits_split_and_scaling(digits):
    assert digits.name == "digits"
    assert (digits.n_features, digits.n_classes) == (64, 10)
    assert len(digits.x_train) + len(digits.x_test) == 1797
    assert len(digits.x_test) == round(1797 * 0.2)
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert 0.0 <= digits.x_train.min() and digits.x_train.max() == 1.0
    # seeded: same seed, same split; other seed, other split
    again, other = load_dataset(seed=0), load_dataset(seed=1)
    assert np.array_equal(again.y_train, digits.y_train)
    assert not np.array_equal(other.y_train, digits.y_train)


def _write_mnist_like(folder: Path, n: int, prefix: str = "t10k", gz: bool = True, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    ext = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images-idx3-ubyte{ext}", images)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    images, labels = _write_mnist_like(tmp_path, 50, gz=gz)
    ext = ".gz" if gz else ""
    x, y = read_idx_pair(tmp_path / f"t10k-images-idx3-ubyte{ext}",
                         tmp_path / f"t10k-labels-idx1-ubyte{ext}")
    assert x.dtype == np.float32 and x.shape == (50, 784)
    assert np.array_equal(np.round(x * 255).astype(np.uint8), images.reshape(50, -1))
    assert np.array_equal(y, labels)


def test_load_idx_directory_file_and_npz(tmp_path):
    _write_mnist_like(tmp_path, 100)
    by_dir = load_dataset(tmp_path, seed=3)
    by_file = load_dataset(tmp_path / "t10k-images-idx3-ubyte.gz", seed=3)
    assert (len(by_dir.x_train), len(by_dir.x_test)) == (80, 20)
    assert np.array_equal(by_dir.x_test, by_file.x_test)
    assert (by_dir.n_features, by_dir.n_classes) == (784, 10)
    sized = load_dataset(tmp_path, n_train=60, n_test=30)
    assert (len(sized.x_train), len(sized.x_test)) == (60, 30)

    # both MNIST sets present: their own split, no shuffling
    _write_mnist_like(tmp_path, 40, prefix="train", seed=1)
    both = load_dataset(tmp_path)
    assert (len(both.x_train), len(both.x_test)) == (40, 100)

    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.full((30, 8, 8), 255, np.uint8), y=np.arange(30) % 3)
    d = load_dataset(npz)
    assert d.x_train.shape == (24, 64) and d.x_train.max() == 1.0 and d.n_classes == 3


def _error(path, *fragments):
    with pytest.raises(UserError) as info:
        load_dataset(path)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_load_errors(tmp_path):
    _error(tmp_path / "nope", "does not exist")
    _error(tmp_path, "no MNIST IDX files")

    images, labels = tmp_path / "t10k-images-idx3-ubyte", tmp_path / "t10k-labels-idx1-ubyte"
    write_idx(images, np.zeros((10, 4, 4), np.uint8))
    _error(images, "labels file", "not found")

    write_idx(labels, np.zeros(9, np.uint8))
    _error(images, "10 images", "9 labels")

    write_idx(labels, np.zeros((10, 1, 1), np.uint8))  # an images header where labels belong
    _error(images, "wrong IDX magic", "0x00000803", "expected 0x00000801")

    write_idx(labels, np.zeros(10, np.uint8))
    images.write_bytes(images.read_bytes()[:-5])
    _error(images, "truncated IDX data")
    images.write_bytes(images.read_bytes()[:7])
    _error(images, "truncated IDX header")

    gz = tmp_path / "g" / "t10k-images-idx3-ubyte.gz"
    gz.parent.mkdir()
    gz.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + b"\x00" * 100)[:-10])
    (tmp_path / "g" / "t10k-labels-idx1-ubyte").write_bytes(b"")
    _error(gz, "corrupt or truncated gzip")

    odd = tmp_path / "data.bin"
    odd.write_bytes(b"x")
    _error(odd, "expected an MNIST images file")

    bad_npz = tmp_path / "bad.npz"
    np.savez(bad_npz, images=np.zeros((4, 2)))
    _error(bad_npz, "missing array", "'x'", "'y'")


@pytest.mark.skipif(not MNIST_T10K.is_dir(), reason=f"{MNIST_T10K} not present on this machine")
def test_mnist_t10k_split():
    d = load_dataset(MNIST_T10K, seed=0)
    assert (len(d.x_train), len(d.x_test)) == (8000, 2000)
    assert (d.n_features, d.n_classes) == (784, 10)
    assert d.x_train.dtype == np.float32 and 0.0 <= d.x_train.min() and d.x_train.max() <= 1.0
    assert np.bincount(d.y_test, minlength=10).min() > 150  # stratified: every class present


# --- model and optimizer ------------------------------------------------------------------------

def test_layout_and_init():
    m = HDC(64, 10, seed=0)
    assert m.sizes == [64, 500, 500, 500, 500, 10]
    assert m.params.dtype == np.float32 and m.params.size == m.n_params
    assert m.n_params == sum(a * b + b for a, b in zip(m.sizes[:-1], m.sizes[1:]))
    # weights and biases are views of the one flat vector
    assert all(np.shares_memory(w, m.params) for w in m.weights)
    m.params[:] = 0
    assert not any(w.any() for w in m.weights)
    names = [name for name, _ in m.tensors(m.params)]
    assert names[:3] == ["fc1.weight", "fc1.bias", "fc2.weight"] and len(names) == 10

    default, he = HDC(64, 10, seed=1), HDC(64, 10, init="he", seed=1)
    bound = 1 / np.sqrt(64)
    assert np.abs(default.weights[0]).max() <= bound and np.abs(default.biases[0]).max() > 0
    assert np.abs(he.weights[1].std() - np.sqrt(2 / 500)) < 0.002 and not he.biases[1].any()
    assert np.array_equal(HDC(64, 10, seed=1).params, default.params)
    with pytest.raises(UserError, match="unknown init"):
        HDC(64, 10, init="xavier")


def test_backprop_matches_finite_differences():
    rng = np.random.default_rng(0)
    m = HDC(6, 4, width=7, init="he", seed=2, dtype=np.float64)
    m.params += rng.normal(0, 0.1, m.n_params)  # nonzero biases, so every path is exercised
    x, y = rng.random((5, 6)), rng.integers(0, 4, 5)
    _, grad = m.loss_and_grad(x, y)
    eps = 1e-6
    numeric = np.empty_like(grad)
    for i in range(m.n_params):
        keep = m.params[i]
        m.params[i] = keep + eps
        up, _ = m.loss_and_grad(x, y)
        m.params[i] = keep - eps
        down, _ = m.loss_and_grad(x, y)
        m.params[i] = keep
        numeric[i] = (up - down) / (2 * eps)
    assert np.abs(grad).max() > 1e-3
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


def test_float32_gradient_matches_float64():
    d = HDC(64, 10, seed=0)
    wide = HDC(64, 10, seed=0, dtype=np.float64)
    x = np.random.default_rng(0).random((25, 64), dtype=np.float32)
    y = np.arange(25) % 10
    loss32, g32 = d.loss_and_grad(x, y)
    loss64, g64 = wide.loss_and_grad(x, y)
    assert g32.dtype == np.float32 and g32.shape == d.params.shape
    assert abs(loss32 - loss64) < 1e-5
    np.testing.assert_allclose(g32, g64, atol=1e-6)


def test_sgd_matches_hand_computed_steps():
    p = np.array([1.0, -2.0, 0.5], np.float32)
    g1 = np.array([0.1, 0.2, -0.3], np.float32)
    g2 = np.array([-0.5, 0.0, 0.25], np.float32)
    g1_before = g1.copy()
    opt = SGD(lr=0.1, momentum=0.9, weight_decay=0.01)
    opt.step(p, g1)
    # step 1: buf = g1 + wd*p0
    p0 = np.array([1.0, -2.0, 0.5])
    buf = np.array([0.1, 0.2, -0.3]) + 0.01 * p0
    p1 = p0 - 0.1 * buf
    np.testing.assert_allclose(p, p1, rtol=1e-6)
    assert np.array_equal(g1, g1_before)  # the gradient is not modified
    opt.step(p, g2)
    buf = 0.9 * buf + (np.array([-0.5, 0.0, 0.25]) + 0.01 * p1)
    np.testing.assert_allclose(p, p1 - 0.1 * buf, rtol=1e-6)
    assert p.dtype == np.float32

    plain = np.array([1.0], np.float32)
    SGD(lr=0.5, momentum=0, weight_decay=0).step(plain, np.array([0.25], np.float32))
    assert plain[0] == 0.875


@pytest.mark.parametrize("init", ["default", "he"])
def test_hdc_learns_digits(digits, init):
    """Paper hyper-parameters (batch 25, lr 0.1, momentum 0.9, wd 5e-5), 10 epochs.

    That learning rate is aggressive for this net, so test accuracy jumps from epoch to epoch,
    and float32 BLAS differences between machines change the trajectory. Measured over seeds
    0-9: best of epochs 6-10 is 0.939-0.983, the 10th epoch alone 0.76-0.96 (seed 0: ~0.96).
    So the floor is on the best of the last five epochs, with a loose guard on the last."""
    m = HDC(digits.n_features, digits.n_classes, init=init, seed=0)
    opt, rng = SGD(), np.random.default_rng(0)
    accs, losses = [], []
    for _ in range(10):
        losses.append(train_epoch(m, opt, digits.x_train, digits.y_train, rng=rng))
        accs.append(m.accuracy(digits.x_test, digits.y_test))
    assert losses[-1] < losses[0] / 3
    assert max(accs[5:]) > 0.92, accs
    assert accs[-1] > 0.75, accs


# --- captured gradients -------------------------------------------------------------------------

def test_capture_gradients(digits):
    grads = capture_gradients(8)
    n_params = HDC(64, 10).n_params
    assert len(grads) == 8
    assert all(g.dtype == np.float32 and g.shape == (n_params,) for g in grads)
    assert all(g.flags.writeable for g in grads)
    assert all(np.isfinite(g).all() and g.any() for g in grads)
    assert not any(np.array_equal(grads[i], grads[i + 1]) for i in range(7))  # different steps
    # cached, but callers get their own copies
    grads[0][:] = 0
    again = capture_gradients(8)
    assert again[0].any() and np.array_equal(again[1], grads[1])

    sample = gradient_sample(8)
    assert sample.dtype == np.float32 and sample.size == 8 * n_params
    mag = np.abs(sample)
    below = {k: float(np.mean(mag < 2.0 ** k)) for k in (-10, -7, -5)}
    print("fraction of |g| below 2^-10, 2^-7, 2^-5:", below)
    # docs/spec.md section 1: typical gradient values sit below 2^-7, yet real ones are not all tiny
    assert below[-7] > 0.9
    assert 1e-3 < mag.max() < 10

    other = capture_gradients(2, data=digits, init="he", steps_between=5, seed=1)
    assert len(other) == 2 and all(g.any() for g in other)


def test_divergence_is_reported(digits):
    m = HDC(digits.n_features, digits.n_classes, width=16, seed=0)
    m.params *= 1e30  # logits overflow float32
    with pytest.raises(UserError, match="diverged"):
        train_epoch(m, SGD(), digits.x_train, digits.y_train, rng=np.random.default_rng(0))
