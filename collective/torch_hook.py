"""PyTorch DDP communication hook: DDP's gradient buckets reduced by the INCEPTIONN ring instead
of by the process group's allreduce, compressed by the INCEPTIONN codec inside the ring (the
default, ``compress="app"``: no daemon needed) or by the soft NICs (``compress="nic"``: sockets
tagged for them).

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from inceptionn.collective import Group
    from inceptionn.collective.torch_hook import RingHookState, ring_hook

    dist.init_process_group("gloo", ...)            # DDP's own setup (parameter broadcast) stays on gloo
    group = Group.from_torch(bind_addr=my_ip)        # rendezvous through the process group
    model = DDP(net)
    state = RingHookState(group)                     # options of Group.allreduce
    model.register_comm_hook(state, ring_hook)
    ... train ...
    state.close(); group.close()

``ring_hook(state, bucket)`` returns a ``torch.futures.Future`` holding the bucket's flat
gradient averaged over the ranks (sum / world, as DDP expects), reduced in place in
``bucket.buffer()``. With ``background=True`` (default) the ring runs on one worker thread per
state, buckets strictly in the order DDP hands them over (the same on every rank), so the
exchange of a bucket overlaps the backward pass of the layers before it; ``background=False``
reduces inside the hook. Error feedback is kept per bucket (key ``("ddp", index, numel)``), so it
survives DDP rebuilding its buckets after the first iteration.

The defaults are what reached uncompressed accuracy soonest (docs/training.md, "Which codec at
which link rate, and the defaults"): the codec in the application (the same codec and arithmetic
as ``"nic"``, so the same results, without the soft NICs' CPU) at headroom ``DEFAULT_HEADROOM``
(2 bits of each block's precision given up for a higher ratio; ``headroom=0`` is the most precise).

Only float32 CPU buckets are reduced (the ring works on numpy views); anything else completes the
future with a TypeError. Torch is imported only by this module.
"""
import queue
import threading

import torch
import torch.distributed as dist

from .group import Group, check_headroom

__all__ = ["DEFAULT_HEADROOM", "RingHookState", "ring_hook", "register_ring_hook"]

_STOP = object()

# The hook's headroom unless given: h = 2 reached the uncompressed accuracy sooner than h = 0 at
# 100 Mbit and 1 Gbit on digits (12 seeds) and MNIST (6), ending 0.16 point below it on both.
DEFAULT_HEADROOM = 2


class RingHookState:
    """What ``ring_hook`` needs: the Group and the options of ``Group.allreduce``."""

    def __init__(self, group: Group, *, compress="app", codec=None, scaling=None, error_feedback=None,
                 headroom=DEFAULT_HEADROOM, average: bool = True, background: bool = True) -> None:
        if not isinstance(group, Group):
            raise TypeError(f"group must be an inceptionn Group, got {type(group).__name__}")
        group._mode(compress)   # refuse bad values now, not inside backward()
        if headroom is not None:   # None: the Group's
            check_headroom(headroom)
        self.group = group
        self.options = dict(compress=compress, codec=codec, scaling=scaling, error_feedback=error_feedback,
                            headroom=headroom, average=average)
        self.background = background
        self.buckets = 0
        self._queue = None
        self._thread = None

    def reduce(self, bucket: dist.GradBucket) -> torch.Tensor:
        buf = bucket.buffer()
        if buf.dtype != torch.float32 or buf.device.type != "cpu":
            raise TypeError(f"ring_hook reduces float32 CPU gradients, got a {buf.dtype} bucket on {buf.device}")
        arr = buf.detach().numpy()
        if not arr.flags.c_contiguous:
            raise ValueError("DDP bucket buffer is not contiguous")
        self.group.allreduce(arr, out=arr, key=("ddp", bucket.index(), arr.size), **self.options)
        self.buckets += 1
        return buf

    def submit(self, bucket: dist.GradBucket) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        if not self.background:
            try:
                fut.set_result(self.reduce(bucket))
            except BaseException as e:  # noqa: BLE001 - delivered through the future
                fut.set_exception(e)
            return fut
        if self._thread is None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="inceptionn-ddp-hook", daemon=True)
            self._thread.start()
        self._queue.put((bucket, fut))
        return fut

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            bucket, fut = item
            try:
                fut.set_result(self.reduce(bucket))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

    def close(self) -> None:
        """Stop the worker thread (the Group stays open: close it yourself)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None


def ring_hook(state: RingHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``model.register_comm_hook(state, ring_hook)``. (Real, not string,
    annotations: DDP checks them.)"""
    return state.submit(bucket)


def register_ring_hook(model, group: Group, **options) -> RingHookState:
    """``RingHookState(group, **options)`` registered on a DDP ``model``; returns the state."""
    state = RingHookState(group, **options)
    model.register_comm_hook(state, ring_hook)
    return state
