"""The paper's HDC model (5 fully connected layers, hidden width 500) and SGD, in pure numpy.

Parameters and gradients each live in ONE contiguous vector, so a data-parallel worker can hand
its whole gradient to a collective as a single buffer and apply the summed result in one step.
Layout of that vector, layer after layer: weight ``(fan_in, fan_out)`` row-major, then bias.
"""
from __future__ import annotations

import numpy as np

from inceptionn.errors import UserError

INITS = ("default", "he")


class HDC:
    """MLP ``[n_features, width x (depth-1), n_classes]`` with ReLU and softmax cross-entropy."""

    def __init__(self, n_features: int, n_classes: int, *, width: int = 500, depth: int = 5,
                 init: str = "default", seed: int = 0, dtype=np.float32):
        if init not in INITS:
            raise UserError(f"unknown init {init!r}; choose from {', '.join(INITS)}")
        if depth < 1 or width < 1:
            raise UserError(f"depth and width must be positive (got depth={depth}, width={width})")
        self.sizes = [n_features] + [width] * (depth - 1) + [n_classes]
        self.dtype = np.dtype(dtype)
        # (offset, weight shape, bias length) per layer, in the flat vector's order.
        self.layout = []
        offset = 0
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:]):
            self.layout.append((offset, (fan_in, fan_out), fan_out))
            offset += fan_in * fan_out + fan_out
        self.n_params = offset
        self.params = np.empty(offset, dtype=self.dtype)
        self.weights, self.biases = self._views(self.params)
        rng = np.random.default_rng(seed)
        for w, b in zip(self.weights, self.biases):
            fan_in = w.shape[0]
            if init == "default":  # torch.nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both
                bound = 1.0 / np.sqrt(fan_in)
                w[...] = rng.uniform(-bound, bound, w.shape)
                b[...] = rng.uniform(-bound, bound, b.shape)
            else:  # He normal: std sqrt(2/fan_in), keeps ReLU activations' scale through depth
                w[...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), w.shape)
                b[...] = 0.0

    def _views(self, flat: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per-layer weight and bias views into a flat vector with this model's layout."""
        weights, biases = [], []
        for offset, shape, n_bias in self.layout:
            n_w = shape[0] * shape[1]
            weights.append(flat[offset: offset + n_w].reshape(shape))
            biases.append(flat[offset + n_w: offset + n_w + n_bias])
        return weights, biases

    def tensors(self, flat: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """Named per-tensor views (``fc1.weight``, ``fc1.bias``, ...) of a flat vector, for
        codecs that work per tensor (TernGrad, 3LC)."""
        weights, biases = self._views(flat)
        out = []
        for i, (w, b) in enumerate(zip(weights, biases), start=1):
            out += [(f"fc{i}.weight", w), (f"fc{i}.bias", b)]
        return out

    def _forward(self, x: np.ndarray) -> list[np.ndarray]:
        """Activations: input, each hidden ReLU output, then the logits."""
        acts = [np.asarray(x, dtype=self.dtype)]
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            z = acts[-1] @ w
            z += b
            if i < last:
                np.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def loss_and_grad(self, xb: np.ndarray, yb: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean softmax cross-entropy over the batch and its gradient as a new flat vector.
        A diverged model gives a non-finite loss, quietly: callers check it (``check_finite``)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self._loss_and_grad(xb, yb)

    def _loss_and_grad(self, xb: np.ndarray, yb: np.ndarray) -> tuple[float, np.ndarray]:
        acts = self._forward(xb)
        logits = acts[-1]
        n = len(logits)
        shifted = logits - logits.max(axis=1, keepdims=True)  # stable softmax
        exp = np.exp(shifted)
        sum_exp = exp.sum(axis=1, keepdims=True)
        rows = np.arange(n)
        loss = float(np.mean(np.log(sum_exp[:, 0]) - shifted[rows, yb]))
        delta = exp / sum_exp  # d loss / d logits = (softmax - onehot) / n
        delta[rows, yb] -= 1
        delta /= n

        grad = np.empty(self.n_params, dtype=self.dtype)
        g_weights, g_biases = self._views(grad)
        for i in range(len(self.weights) - 1, -1, -1):
            np.matmul(acts[i].T, delta, out=g_weights[i])
            delta.sum(axis=0, out=g_biases[i])
            if i:
                delta = delta @ self.weights[i].T
                delta *= acts[i] > 0  # ReLU' (acts[i] is that layer's ReLU output)
        return loss, grad

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self._forward(x)[-1]

    def predict(self, x: np.ndarray, batch: int = 4096) -> np.ndarray:
        return np.concatenate([self.logits(x[i: i + batch]).argmax(axis=1)
                               for i in range(0, len(x), batch)])

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(self.predict(x) == y))


class SGD:
    """torch.optim.SGD semantics on flat vectors: g += wd*p; buf = m*buf + g; p -= lr*buf."""

    def __init__(self, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 5e-5):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buf: np.ndarray | None = None

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        """Update ``params`` in place; ``grad`` is left untouched (it may be a shared buffer)."""
        g = grad + params * params.dtype.type(self.weight_decay)
        if self.momentum:
            if self.buf is None:  # torch starts the buffer at the first gradient
                self.buf = g
            else:
                self.buf *= self.buf.dtype.type(self.momentum)
                self.buf += g
            g = self.buf
        params -= params.dtype.type(self.lr) * g


def train_epoch(model: HDC, opt: SGD, x: np.ndarray, y: np.ndarray, *, batch: int = 25,
                rng: np.random.Generator) -> float:
    """One shuffled pass (last partial batch kept, like a DataLoader); mean training loss."""
    order = rng.permutation(len(x))
    losses = []
    for start in range(0, len(x), batch):
        idx = order[start: start + batch]
        loss, grad = model.loss_and_grad(x[idx], y[idx])
        check_finite(loss)
        opt.step(model.params, grad)
        losses.append(loss)
    return float(np.mean(losses))


def check_finite(loss: float) -> None:
    """Stop at the first non-finite loss rather than train on NaNs (lr 0.1 with momentum 0.9
    is on the edge of stability for this net: it occasionally blows up, mostly on MNIST)."""
    if not np.isfinite(loss):
        raise UserError(f"training diverged (loss {loss}); try a lower learning rate")
