"""One data-parallel worker of ``inceptionn train``: ``python -m inceptionn.train.worker --config JSON``.

The launcher (``train/job.py``) starts one per testbed host. Every worker loads the same data set
with the same seed, takes its shard of the training set by rank, builds the same HDC replica
(same seed, so no weights are broadcast) and trains with the paper's SGD. Per iteration:

    compute  forward + backward on the local batch of 25, then (INC) the local SGD update
    exchange INC: ring allreduce of the gradient, every replica applies the same update;
             WA: gradients to the aggregator, which sums, updates and returns the weights;
             DDP: torch's DDP hook over gloo (train/torch_hooks.py), every replica applies the mean

The exchange is split, from the collective's own counters, into ``sum`` (adding gradients),
``codec`` (app-level compression, scaling and error-feedback bookkeeping) and ``communicate``
(the rest of the exchange's wall time: the network, waiting for peers). The four add up to the
iteration's wall time, which is measured separately and reported too.

Everything goes to stdout as JSON lines (the launcher parses them); stderr carries only what a
human needs when something fails. A diverging model (non-finite loss) is reported as an
``error`` event and the worker exits with status 2; the launcher stops the others.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

from inceptionn.errors import UserError

EXIT_USER_ERROR = 2


class Diverged(UserError):
    """A non-finite loss. A worker raises it and reports it as such; the launcher (job.py)
    raises it again for the run, with the run's config in ``cfg``, and tells it apart from
    other errors (a benchmark records it and goes on)."""

    def __init__(self, message: str, cfg=None):
        super().__init__(message)
        self.cfg = cfg


def emit(event: str, **fields) -> None:
    fields["event"] = event
    sys.stdout.write(json.dumps(fields, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def params_checksum(params) -> str:
    return hashlib.sha256(params.tobytes()).hexdigest()[:16]


def shard_indices(n_train: int, rank: int, world: int, seed: int):
    """Equal, disjoint shards of a seeded permutation (the remainder is left out, so every
    worker runs the same number of iterations per epoch)."""
    import numpy as np

    per = n_train // world
    perm = np.random.default_rng([seed, 7919]).permutation(n_train)
    return perm[rank * per:(rank + 1) * per]


def iterations_per_epoch(n_train: int, world: int, batch: int, max_iters: int | None) -> int:
    per = n_train // world
    n = -(-per // batch)
    return min(n, max_iters) if max_iters else n


def passthrough_codec():
    """compress='nic-scaled': the collective sends its values as they are (no quantising, no
    scaling, no error feedback) on sockets with the scaled mark; each soft NIC scales every packet
    by a power of two of its own (codec 2, docs/wire-format.md) and nobody predicts the decode,
    so the replicas are close but not bit-identical. The collective's "nic" path with a codec
    whose reconstruction is the identity: what an unmodified sender of raw gradients does."""
    from inceptionn.codecs.base import Float32StreamCodec

    class InTheNic(Float32StreamCodec):
        name = "scaled in the soft NIC"

        def reconstruct(self, x, out=None):
            if out is not None and out is not x:
                out[:] = x
                return out
            return x

    return InTheNic()


def make_codec(cfg: dict):
    """(mode for the collective, codec): ``nic`` needs the daemons' codec (the sender computes
    what its receiver will decode), ``app`` runs the named codec inside the collective;
    ``nic-scaled`` leaves the values to the soft NICs' per-packet scaled codec."""
    compress = cfg["compress"]
    if compress == "none":
        return None, None
    from inceptionn.codecs import applicable, get_codec

    if compress == "nic-scaled":
        return "nic", passthrough_codec()
    if compress == "nic":
        return "nic", get_codec("inceptionn", error_bound=cfg["error_bound"])
    return "app", get_codec(compress, **applicable(compress, error_bound=cfg["error_bound"],
                                                   **noise_seeds(compress, cfg["seed"], cfg["rank"])))


def noise_seeds(codec: str, seed: int, rank: int) -> dict:
    """The seeds of a codec's random rounding, from the run's seed and the rank: a run repeats bit
    for bit and each worker's noise is its own (a codec left to seed itself takes OS entropy, so
    runs of the same seed differed). A codec with a ``noise_seed`` keeps ``seed`` for what every
    worker shares (THC's rotation); one with only ``seed`` draws its noise from it (TernGrad)."""
    import numpy as np

    from inceptionn.codecs import codec_parameters

    own = int(np.random.SeedSequence([seed, 15485863, rank]).generate_state(1, np.uint64)[0])
    params = codec_parameters(codec)
    if "noise_seed" in params:
        return {"noise_seed": own}
    return {"seed": own} if "seed" in params else {}


def make_group(cfg: dict, mode, codec):
    """This rank's collective group; the ranks meet through a FileStore in a directory every
    testbed host sees (they share the machine's filesystem)."""
    from inceptionn.collective import FileStore, Group

    from inceptionn.shim.contract import TOS_SCALED, TOS_TAGGED

    store = FileStore(cfg["store"], timeout=cfg.get("rendezvous_timeout", 120.0))
    scaled = cfg["compress"] == "nic-scaled"  # the NICs' decode is not predicted: replicas differ a little
    return Group(cfg["rank"], cfg["world"], store, bind_addr=cfg["bind_addr"], tag=mode == "nic",
                 tos=TOS_SCALED if scaled else TOS_TAGGED, verify="never" if scaled else "first",
                 codec=codec, compress=mode, timeout=cfg.get("timeout", 300.0))


class Clock:
    """Per-iteration phase times (seconds), summed; the first iteration is kept apart
    (it opens the connections)."""

    PARTS = ("compute", "communicate", "sum", "codec")

    def __init__(self):
        self.total = dict.fromkeys(self.PARTS + ("iteration",), 0.0)
        self.first: dict | None = None
        self.count = 0

    def add(self, parts: dict) -> None:
        if self.first is None:
            self.first = parts
            return
        for k, v in parts.items():
            self.total[k] += v
        self.count += 1


def warmup_lr(lr: float, step: int, warmup: int) -> float:
    """The learning rate of iteration ``step`` (from 1): rising linearly to ``lr`` over the first
    ``warmup`` iterations, ``lr`` from then on (and throughout without a warm-up)."""
    return lr * min(1.0, step / warmup) if warmup else lr


def _stats_snapshot(group) -> tuple[float, float]:
    """(sum seconds, codec + scaling + error-feedback seconds) the group has spent so far."""
    if group.stats is None:   # DDP's hooks: all of it counts as communication
        return 0.0, 0.0
    t = group.stats.total
    return t.sum_seconds, t.codec_seconds + t.scale_seconds


def run(cfg: dict) -> int:
    import numpy as np

    from inceptionn.train.data import load_dataset
    from inceptionn.train.hdc import HDC, SGD

    rank, world, seed, batch = cfg["rank"], cfg["world"], cfg["seed"], cfg["batch"]
    data = load_dataset(cfg.get("data"), seed=seed)
    shard = shard_indices(len(data.x_train), rank, world, seed)
    x, y = data.x_train[shard], data.y_train[shard]
    iters = iterations_per_epoch(len(data.x_train), world, batch, cfg.get("max_iters"))
    if iters < 1:
        raise UserError(f"{len(data.x_train)} training examples are too few for {world} workers")
    model = HDC(data.n_features, data.n_classes, seed=seed)
    opt = SGD(lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"])
    mode, codec = make_codec(cfg) if cfg["algo"] != "ddp" else (None, None)   # ddp: the hook compresses
    # None: the collective's default, on where they help (the inceptionn codec); False: off
    lossy = mode is not None
    scaling = (None if cfg["scaling"] is None else bool(cfg["scaling"])) if lossy else False
    feedback = (None if cfg["error_feedback"] is None else bool(cfg["error_feedback"])) if lossy else False
    rng = np.random.default_rng([seed, 104729, rank])
    inv_world = np.float32(1.0 / world)
    # WA's mean gradient, written into one buffer (INC averages in place inside the allreduce): a
    # fresh temporary per iteration (sum * inv_world) made the update 3.8 ms instead of 1.9 (HDC on
    # digits, 2 hosts), a cost the DDP configs, whose hooks average in place, did not pay
    mean_grad = np.empty(model.n_params, dtype=np.float32)

    if cfg["algo"] == "ddp":
        from inceptionn.train.torch_hooks import HookGroup

        group = HookGroup(cfg["compress"], cfg["master"], rank, world, timeout=cfg.get("timeout", 300.0),
                          shapes=[t.shape for _, t in model.tensors(model.params)],
                          total_iters=iters * cfg["epochs"])
    else:
        group = make_group(cfg, mode, codec)
    emit("ready", rank=rank, world=world, dataset=data.name, n_train=len(data.x_train),
         n_test=len(data.x_test), shard=len(shard), iters_per_epoch=iters, n_params=model.n_params)

    t_update = [0.0]

    def update(summed):  # WA: runs on the aggregator with the sum of all workers' gradients
        t = time.perf_counter()
        opt.step(model.params, np.multiply(summed, inv_world, out=mean_grad))
        t_update[0] += time.perf_counter() - t
        return model.params

    clock = Clock()
    accuracy = []
    last_emit = 0.0
    t_train = 0.0
    loss_sum, loss_n = 0.0, 0
    step, warmup, lr = 0, cfg.get("warmup", 0), cfg["lr"]
    try:
        for epoch in range(cfg["epochs"]):
            if cfg.get("decay_at") and epoch + 1 == cfg["decay_at"]:
                lr *= 0.1                      # as examples/mpi4py_hdc.py --decay-at
            order = rng.permutation(len(x))
            t_epoch = time.perf_counter()
            for it in range(iters):
                idx = order[it * batch:(it + 1) * batch]
                step += 1
                opt.lr = warmup_lr(lr, step, warmup)
                t0 = time.perf_counter()
                loss, grad = model.loss_and_grad(x[idx], y[idx])
                if not np.isfinite(loss):
                    raise Diverged(f"training diverged (loss {loss} on rank {rank}, epoch {epoch + 1}, "
                                    f"iteration {it + 1}); try a lower learning rate")
                t1 = time.perf_counter()
                s0 = _stats_snapshot(group)
                if cfg["algo"] == "ddp":
                    mean = group.average(grad)
                    t2 = time.perf_counter()
                    s1 = s0
                    opt.step(model.params, mean)
                elif cfg["algo"] == "inc":
                    mean = group.allreduce(grad, out=grad, average=True, compress=mode, codec=codec,
                                           scaling=scaling, error_feedback=feedback, headroom=cfg["headroom"])
                    t2 = time.perf_counter()
                    s1 = _stats_snapshot(group)
                    opt.step(model.params, mean)
                else:
                    t_update[0] = 0.0
                    new = group.wa_step(grad, update, compress=mode, codec=codec, scaling=scaling,
                                        error_feedback=feedback, headroom=cfg["headroom"])
                    t2 = time.perf_counter()
                    s1 = _stats_snapshot(group)
                    if new is not model.params:
                        model.params[...] = new
                t3 = time.perf_counter()
                t_sum, t_codec = s1[0] - s0[0], s1[1] - s0[1]
                # the aggregator's update runs inside wa_step: it is computation, not communication
                t_upd = t_update[0] if cfg["algo"] == "wa" else 0.0
                clock.add({"compute": (t1 - t0) + (t3 - t2) + t_upd, "sum": t_sum, "codec": t_codec,
                           "communicate": max(0.0, (t2 - t1) - t_sum - t_codec - t_upd),
                           "iteration": t3 - t0})
                loss_sum += loss
                loss_n += 1
                if rank == 0 and (t3 - last_emit > 0.5 or it == iters - 1):
                    last_emit = t3
                    emit("iter", rank=rank, epoch=epoch + 1, iter=it + 1, iters=iters, loss=round(loss, 5))
            t_train += time.perf_counter() - t_epoch
            # rank 0 evaluates; the barrier keeps the others from charging that wait to the
            # next iteration's communication time
            if rank == 0:
                acc = model.accuracy(data.x_test, data.y_test)
                accuracy.append(acc)
                emit("epoch", rank=rank, epoch=epoch + 1, epochs=cfg["epochs"], accuracy=acc,
                     loss=loss_sum / max(1, loss_n), train_seconds=t_train)
            loss_sum, loss_n = 0.0, 0
            group.barrier()
        final = model.accuracy(data.x_test, data.y_test)   # every replica: they must agree
        stats = group.stats.total.as_dict() if group.stats else {}
    except Diverged as exc:
        # said before the sockets close: the peers' "connection closed" must not arrive first
        emit("error", rank=rank, message=str(exc), diverged=True)
        exc.reported = True
        raise
    finally:
        close = getattr(group, "close", None)
        if close:
            close()
    emit("done", rank=rank, dataset=data.name, iters_per_epoch=iters, cpu_seconds=time.process_time(),
         final_accuracy=final, accuracy=accuracy, checksum=params_checksum(model.params),
         iterations=clock.count + (clock.first is not None), measured_iterations=clock.count,
         times={k: v / clock.count for k, v in clock.total.items()} if clock.count else (clock.first or {}),
         first_iteration=clock.first, train_seconds=t_train, group_stats=_jsonable(stats))
    return 0


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (int, float, str, bool)) or obj is None:
        return obj
    try:
        return float(obj)
    except (TypeError, ValueError):
        return str(obj)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inceptionn.train.worker",
                                description="one data-parallel worker (started by inceptionn train)")
    p.add_argument("--config", required=True, help="the worker's settings as a JSON object")
    args = p.parse_args(argv)
    cfg = json.loads(args.config)
    try:
        return run(cfg)
    except UserError as exc:
        if not getattr(exc, "reported", False):
            emit("error", rank=cfg.get("rank"), message=str(exc), diverged=isinstance(exc, Diverged))
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, traceback to stderr
        import traceback

        traceback.print_exc()
        emit("error", rank=cfg.get("rank"), message=f"rank {cfg.get('rank')}: {type(exc).__name__}: {exc}",
             internal=True)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
