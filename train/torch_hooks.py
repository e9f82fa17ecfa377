"""DDP's 16-bit gradient compression as a PyTorch user turns it on, for the benchmarks and the
demo to run beside ours: torch's own ``fp16_compress_hook`` / ``bf16_compress_hook``
(``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``, not a copy) on a flat gradient,
bucket by bucket as DistributedDataParallel hands them over: cast to 16 bits, divide by the
world size, allreduce over the process group, cast back in place. The result is the mean."""
from __future__ import annotations

HOOKS = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook",
         "none": "allreduce_hook"}   # DDP without a hook does what allreduce_hook does
DDP_BUCKET_BYTES = 25 * 2**20   # DistributedDataParallel's bucket_cap_mb default


class Bucket:
    """What a DDP comm hook reads of a ``dist.GradBucket``: its flat buffer."""

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer


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

    def __init__(self, name: str, master: str, rank: int, world: int, timeout: float = 300.0):
        import datetime

        import torch.distributed as dist

        self.name, self.dist = name, dist
        dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))

    def average(self, grad):
        import torch

        hook_allreduce(self.name, torch.from_numpy(grad))()
        return grad

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()
