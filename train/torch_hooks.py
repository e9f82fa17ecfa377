"""DDP's gradient compression as a PyTorch user turns it on, for the benchmarks and the demo to
run beside ours: torch's own ``fp16_compress_hook`` / ``bf16_compress_hook``
(``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``, not a copy) on a flat gradient,
bucket by bucket as DistributedDataParallel hands them over: cast to 16 bits, divide by the
world size, allreduce over the process group, cast back in place. The result is the mean.
``powersgd-r1`` / ``powersgd-r4``: torch's ``powerSGD_hook`` (``ddp_comm_hooks.powerSGD_hook``)
at rank 1 / 4 with error feedback and warm start, per-layer tensors of the bucket compressed to
P and Q factors; plain allreduce for its first ``start_powerSGD_iter`` iterations, as torch
documents."""
from __future__ import annotations

HOOKS = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook",
         "powersgd-r1": "powerSGD_hook", "powersgd-r4": "powerSGD_hook",
         "none": "allreduce_hook"}   # DDP without a hook does what allreduce_hook does
POWERSGD_RANK = {"powersgd-r1": 1, "powersgd-r4": 4}
DDP_BUCKET_BYTES = 25 * 2**20   # DistributedDataParallel's bucket_cap_mb default


def powersgd_start_iter(total_iters: int) -> int:
    """PowerSGD's warm-up as torch's PowerSGDState docs advise: vanilla allreduce for the first
    10% of the training steps; at least 2, the least torch allows with error feedback."""
    return max(2, total_iters // 10)


class Bucket:
    """What a DDP comm hook reads of a ``dist.GradBucket`` (which Python cannot construct): its
    flat buffer, and for PowerSGD its index, whether it is the iteration's last, and its
    per-parameter gradients as views of the buffer (DDP's layout with gradient_as_bucket_view)."""

    def __init__(self, buffer, index: int = 0, last: bool = True, shapes=()):
        self._buffer, self._index, self._last, self._shapes = buffer, index, last, list(shapes)

    def buffer(self):
        return self._buffer

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def gradients(self):
        out, off = [], 0
        for shape in self._shapes:
            n = 1
            for d in shape:
                n *= d
            out.append(self._buffer[off:off + n].view(*shape))
            off += n
        if off != self._buffer.numel():
            raise ValueError(f"bucket of {self._buffer.numel()} values, parameters of {off}")
        return out


def hook_allreduce(name: str, t, group=None):
    """A function that averages the float32 tensor ``t`` in place over ``group`` (default: the
    world) with torch's ``HOOKS[name]``: every bucket of DDP's default size handed to the hook in
    turn, all in flight at once, then every result waited for."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = getattr(default_hooks, HOOKS[name])
    group = group or dist.group.WORLD
    per = DDP_BUCKET_BYTES // t.element_size()
    buckets = [Bucket(t[i:i + per]) for i in range(0, t.numel(), per)]
    return lambda: [f.wait() for f in [hook(group, b) for b in buckets]]


class HookGroup:
    """A training worker's exchange the way DistributedDataParallel runs it over gloo with the
    hook ``HOOKS[name]``: ``average(grad)`` leaves the mean over the world in ``grad``. The ranks
    meet at ``master`` (host:port of rank 0)."""

    stats = None   # no counters of ours: the whole exchange is communication

    def __init__(self, name: str, master: str, rank: int, world: int, timeout: float = 300.0,
                 shapes=(), total_iters: int = 0):
        """``shapes``: the parameters' shapes in the flat gradient's order, and ``total_iters``
        the run's iterations (both for PowerSGD)."""
        import datetime

        import torch.distributed as dist

        self.name, self.dist, self.shapes = name, dist, list(shapes)
        dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        self.powersgd = None
        if name in POWERSGD_RANK:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            self._psgd_hook = psgd.powerSGD_hook
            self.powersgd = psgd.PowerSGDState(
                process_group=None, matrix_approximation_rank=POWERSGD_RANK[name],
                start_powerSGD_iter=powersgd_start_iter(total_iters), min_compression_rate=2,
                use_error_feedback=True, warm_start=True, random_seed=0)

    def average(self, grad):
        import torch

        t = torch.from_numpy(grad)
        if self.powersgd is None:
            hook_allreduce(self.name, t)()
            return grad
        # The model (train/hdc.py) is far below DDP's bucket size: one bucket, the last, as
        # DDP hands it over. DDP's buckets list parameters in reverse order; the hook
        # compresses each tensor on its own, so the order changes no value.
        out = self._psgd_hook(self.powersgd, Bucket(t, 0, True, self.shapes)).wait()
        if out.data_ptr() != t.data_ptr():
            t.copy_(out)
        return grad

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()
