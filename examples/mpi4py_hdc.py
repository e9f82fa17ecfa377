"""Data-parallel training of an MLP classifier with plain mpi4py: numpy, mpi4py and scikit-learn's
embedded digits, nothing else. Every rank trains a replica on its shard of the training set and,
every step, sums the float32 gradient over the ranks with one ``comm.Allreduce(MPI.IN_PLACE,
grad)``; all replicas then apply the same averaged update.

It knows nothing of inceptionn. The model and optimizer are the HDC of the INCEPTIONN paper as
``inceptionn train`` runs it (train/hdc.py: 5 fully connected layers of width 500, ReLU, softmax
cross-entropy; SGD lr 0.1, momentum 0.9, weight decay 5e-5; batch 25 per rank; the same seeded
initialisation, split and shards), written out here so that the script stands alone. At lr 0.1
the test accuracy swings by points from epoch to epoch; ``--decay-at`` lowers the rate for the
last epochs, so that the final accuracy says where training ended up.

    mpirun -np 4 python examples/mpi4py_hdc.py --epochs 10 --seed 0
    inceptionn mpirun --compress-allreduce --testbed tb -np 4 -- python examples/mpi4py_hdc.py

Rank 0 prints one JSON line per epoch and a last one with the final test accuracy and how many
distinct parameter vectors the replicas hold (1: they stayed in sync).
"""
import argparse
import hashlib
import json
import sys

import numpy as np
from mpi4py import MPI


def load_digits_split(seed: int):
    """scikit-learn's digits (1,797 8x8 images, shipped with the package), pixels in [0, 1],
    split 80/20 stratified and seeded (as train/data.py)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    n_test = round(len(x) * 0.2)
    tr, te = train_test_split(np.arange(len(x)), train_size=len(x) - n_test, test_size=n_test,
                              random_state=seed, stratify=y)
    return x[tr], y[tr], x[te], y[te]


class MLP:
    """Weights and biases live in one flat float32 vector, so is the gradient: one Allreduce."""

    def __init__(self, sizes, seed: int):
        self.shapes = list(zip(sizes[:-1], sizes[1:]))
        self.n = sum(i * o + o for i, o in self.shapes)
        self.params = np.empty(self.n, np.float32)
        self.w, self.b = self.views(self.params)
        rng = np.random.default_rng(seed)
        for w, b in zip(self.w, self.b):      # torch.nn.Linear's default: U(-1/sqrt(fan_in), ..)
            bound = 1.0 / np.sqrt(w.shape[0])
            w[...] = rng.uniform(-bound, bound, w.shape)
            b[...] = rng.uniform(-bound, bound, b.shape)

    def views(self, flat):
        ws, bs, off = [], [], 0
        for i, o in self.shapes:
            ws.append(flat[off:off + i * o].reshape(i, o))
            bs.append(flat[off + i * o:off + i * o + o])
            off += i * o + o
        return ws, bs

    def forward(self, x):
        acts = [x]
        for k, (w, b) in enumerate(zip(self.w, self.b)):
            z = acts[-1] @ w + b
            if k < len(self.w) - 1:
                np.maximum(z, 0, out=z)
            acts.append(z)
        return acts

    def loss_and_grad(self, x, y):
        """Mean softmax cross-entropy and its gradient (a new flat float32 vector)."""
        acts = self.forward(x)
        shifted = acts[-1] - acts[-1].max(axis=1, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(np.mean(np.log(total[:, 0]) - shifted[rows, y]))
        delta = exp / total
        delta[rows, y] -= 1
        delta /= len(y)
        grad = np.empty(self.n, np.float32)
        gw, gb = self.views(grad)
        for k in range(len(self.w) - 1, -1, -1):
            np.matmul(acts[k].T, delta, out=gw[k])
            delta.sum(axis=0, out=gb[k])
            if k:
                delta = (delta @ self.w[k].T) * (acts[k] > 0)
        return loss, grad

    def accuracy(self, x, y) -> float:
        return float(np.mean(self.forward(x)[-1].argmax(axis=1) == y))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--depth", type=int, default=5, help="fully connected layers")
    p.add_argument("--batch", type=int, default=25, help="examples per rank per step")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-5)
    p.add_argument("--decay-at", type=int, metavar="EPOCH",
                   help="from this epoch on (counted from 1), the learning rate times 0.1")
    args = p.parse_args()

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    x_tr, y_tr, x_te, y_te = load_digits_split(args.seed)
    per = len(x_tr) // world                            # equal shards: every rank runs as many steps
    shard = np.random.default_rng([args.seed, 7919]).permutation(len(x_tr))[rank * per:(rank + 1) * per]
    x, y = x_tr[shard], y_tr[shard]
    model = MLP([x.shape[1]] + [args.width] * (args.depth - 1) + [10], args.seed)
    rng = np.random.default_rng([args.seed, 104729, rank])
    lr, mom, wd = np.float32(args.lr), np.float32(args.momentum), np.float32(args.weight_decay)
    inv_world = np.float32(1.0 / world)
    velocity = None
    steps = -(-per // args.batch)
    if rank == 0:
        print(json.dumps({"event": "start", "world": world, "params": model.n, "steps_per_epoch": steps,
                          "train": len(x_tr), "test": len(x_te)}), flush=True)
    for epoch in range(args.epochs):
        if args.decay_at and epoch + 1 == args.decay_at:
            lr *= np.float32(0.1)
        order = rng.permutation(per)
        losses = []
        for s in range(steps):
            idx = order[s * args.batch:(s + 1) * args.batch]
            loss, grad = model.loss_and_grad(x[idx], y[idx])
            comm.Allreduce(MPI.IN_PLACE, grad)          # the sum over ranks, float32
            g = grad * inv_world + model.params * wd    # SGD as torch.optim.SGD
            velocity = g if velocity is None else velocity * mom + g
            model.params -= lr * velocity
            losses.append(loss)
        if not np.isfinite(np.mean(losses)):
            if rank == 0:
                print(json.dumps({"event": "error", "message": "training diverged"}), flush=True)
            comm.Abort(2)
        if rank == 0:
            print(json.dumps({"event": "epoch", "epoch": epoch + 1, "loss": float(np.mean(losses)),
                              "accuracy": model.accuracy(x_te, y_te)}), flush=True)
    digest = hashlib.sha256(model.params.tobytes()).hexdigest()[:16]
    digests = comm.gather(digest, root=0)
    if rank == 0:
        print(json.dumps({"event": "done", "seed": args.seed, "epochs": args.epochs,
                          "final_accuracy": model.accuracy(x_te, y_te), "replicas": len(set(digests)),
                          "steps": steps * args.epochs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
