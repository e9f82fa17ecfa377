"""Real gradients from real training steps, for codec benchmarks.

The HDC model trains with the paper's SGD settings; every ``steps_between`` steps the gradient
that step applied (the raw loss gradient, before weight decay and momentum: what a data-parallel
worker puts on the wire) is kept. Results are cached per process because benchmarks ask again.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from .data import Dataset, load_dataset
from .hdc import HDC, SGD, check_finite

CAPTURE_EPOCHS = 2  # spread the captures over about the first two epochs


def capture_gradients(n: int = 8, *, data: Dataset | str | os.PathLike | None = None,
                      seed: int = 0, batch: int = 25, steps_between: int | None = None,
                      init: str = "default", width: int = 500) -> list[np.ndarray]:
    """``n`` flat float32 gradients of the HDC model captured during training on ``data``
    (digits by default; a Dataset or a path for ``load_dataset``). ``steps_between`` defaults
    to spreading the captures over about two epochs. Returns fresh, writable copies."""
    if isinstance(data, (str, os.PathLike)):
        data = os.fspath(data)  # hashable cache key; loaded inside the cached function
    return [g.copy() for g in _captured(n, data, seed, batch, steps_between, init, width)]


def gradient_sample(n: int = 8, **kwargs) -> np.ndarray:
    """The captured gradients concatenated into one float32 vector."""
    return np.concatenate(capture_gradients(n, **kwargs))


@functools.lru_cache(maxsize=16)
def _captured(n, data, seed, batch, steps_between, init, width) -> tuple[np.ndarray, ...]:
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    if not isinstance(data, Dataset):
        data = load_dataset(data, seed=seed)
    x, y = data.x_train, data.y_train
    if len(x) < batch:
        raise ValueError(f"{len(x)} training examples cannot fill a batch of {batch}")
    if steps_between is None:
        steps_per_epoch = -(-len(x) // batch)
        steps_between = max(1, CAPTURE_EPOCHS * steps_per_epoch // n)
    model = HDC(data.n_features, data.n_classes, width=width, init=init, seed=seed)
    opt = SGD()  # the paper's lr 0.1, momentum 0.9, weight decay 5e-5
    rng = np.random.default_rng(seed)
    captured = []
    step = 0
    while len(captured) < n:
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch + 1, batch):  # full batches only: same scale each
            idx = order[start: start + batch]
            loss, grad = model.loss_and_grad(x[idx], y[idx])
            check_finite(loss)
            step += 1
            if step % steps_between == 0:
                grad.flags.writeable = False  # shared through the cache; callers get copies
                captured.append(grad)
                if len(captured) == n:
                    break
            opt.step(model.params, grad)
    return tuple(captured)
