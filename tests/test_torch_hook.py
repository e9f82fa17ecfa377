"""The DDP communication hook in a real multi-process PyTorch DDP job (gloo for DDP's own setup,
the INCEPTIONN ring over our sockets for the gradients).

Each rank is this file run as a script; it saves gradients, losses and parameters, and the test
compares them across ranks and with gloo's own allreduce.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pytest

from proc_helpers import wait_all

# checked without importing torch here: only the job's processes need it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")

WORLD = 3
STEPS = 25


def batch(rank: int, step: int, n: int = 32):
    import torch
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 20, generator=g)
    teacher = torch.Generator().manual_seed(99)
    w = torch.randn(20, 4, generator=teacher)
    return x, (x @ w).argmax(dim=1)


def make_model():
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def grads_of(model) -> np.ndarray:
    import torch
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def ddp_job(rank: int, world: int, init_file: str, outdir: str, store_port: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from inceptionn.collective import Group
    from inceptionn.collective.torch_hook import DEFAULT_HEADROOM, RingHookState, register_ring_hook, ring_hook

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = Group.from_torch(bind_addr="127.0.0.1", timeout=60)
    out = {"default_headroom": np.array(DEFAULT_HEADROOM)}
    x, y = batch(rank, 0)

    # reference: local gradients averaged by gloo
    net = make_model()
    F.cross_entropy(net(x), y).backward()
    local = grads_of(net)
    ref = torch.from_numpy(local.copy())
    dist.all_reduce(ref)
    out["ref"] = (ref / world).numpy()
    peak = torch.tensor([float(np.abs(local).max())])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    out["peak"] = peak.numpy()

    for compress in (None, "nic", "default"):
        ddp = DDP(make_model(), bucket_cap_mb=0.01)   # one bucket at first, several after the rebuild
        before = group.stats.total.bytes_sent["data"]
        state = (register_ring_hook(ddp, group) if compress == "default"
                 else register_ring_hook(ddp, group, compress=compress))
        F.cross_entropy(ddp(x), y).backward()
        out[f"grad_{compress}"] = grads_of(ddp.module)
        out[f"buckets_{compress}"] = np.array(state.buckets)
        out[f"data_bytes_{compress}"] = np.array(group.stats.total.bytes_sent["data"] - before)
        state.close()

    # training with the compressed ring (scaling and error feedback on by default)
    ddp = DDP(make_model(), bucket_cap_mb=0.01)
    state = RingHookState(group, compress="nic")
    ddp.register_comm_hook(state, ring_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = batch(rank, step + 1)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state.close()
    out["train_buckets"] = np.array(state.buckets)
    out["losses"] = np.array(losses)
    out["params"] = torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()]).numpy()
    out["conns"] = np.array([(c["kind"], c["direction"], c["tos"]) for c in group.connections()], dtype=object)
    out["gradient_bytes"] = np.array(group.stats.total.bytes_sent["gradient"])
    # the hook's headroom: the same backward pass in app mode sends fewer bytes at h = 3
    for h in (0, 3):
        ddp_h = DDP(make_model(), bucket_cap_mb=0.01)
        state = register_ring_hook(ddp_h, group, compress="app", headroom=h, background=False)
        before = group.stats.total.bytes_sent["data"]
        F.cross_entropy(ddp_h(x), y).backward()
        out[f"bytes_h{h}"] = np.array(group.stats.total.bytes_sent["data"] - before)
    try:
        RingHookState(group, headroom=25)
        out["bad_headroom"] = np.array("")
    except ValueError as e:
        out["bad_headroom"] = np.array(str(e))
    # a float64 model is refused through the future, with a clear message
    ddp64 = DDP(make_model().double())
    register_ring_hook(ddp64, group, compress="nic", background=False)
    try:
        F.cross_entropy(ddp64(x.double()), y).backward()
        out["float64"] = np.array("")
    except Exception as e:  # noqa: BLE001 - DDP wraps it
        out["float64"] = np.array(str(e))
    # rendezvous through a torch.distributed.TCPStore instead of the process group
    store = dist.TCPStore("127.0.0.1", store_port, world, rank == 0, timeout=timedelta(seconds=60))
    with Group(rank, world, store, bind_addr="127.0.0.1", prefix="second") as g2:
        v = np.arange(1000, dtype=np.float32) * (rank + 1)
        out["tcpstore"] = g2.allreduce(v, compress=None)
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), **out)
    group.close()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_with_the_ring_hook(tmp_path):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(WORLD), str(tmp_path / "init"), str(tmp_path), port],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(WORLD)]
    wait_all(procs, 420)   # three torch imports on a loaded 2-core box take a while
    res = [np.load(tmp_path / f"rank{r}.npz", allow_pickle=True) for r in range(WORLD)]
    ref = res[0]["ref"]
    for r in res:
        # the uncompressed ring: what gloo gives, up to summation order
        np.testing.assert_allclose(r["grad_None"], ref, rtol=1e-5, atol=1e-7)
        assert int(r["buckets_None"]) >= 1
        assert int(r["train_buckets"]) > STEPS + 1, "expected several DDP buckets after the rebuild"
        for key in ("grad_nic", "params", "grad_None"):
            assert np.array_equal(r[key], res[0][key]), f"{key}: ranks differ"
        for kind, direction, tos in r["conns"]:
            assert tos == (0x28 if (kind == "RING_TAGGED" and direction == "out") else 0)
        assert int(r["gradient_bytes"]) > 0
        assert "float32" in str(r["float64"]), str(r["float64"])
    # the compressed ring: within the codec's bound (N lossy hops of 2^-7 of the scaled sum,
    # 2^-s <= 2 N max|g|; averaged over N)
    peak = float(res[0]["peak"][0])
    err = np.abs(res[0]["grad_nic"] - ref).max()
    assert err <= WORLD * 2.0**-7 * 2 * WORLD * peak / WORLD, (err, peak)
    assert not np.array_equal(res[0]["grad_nic"], res[0]["grad_None"])
    # the hook's default: the INCEPTIONN codec in the application (no daemon needed) at its
    # headroom (each block's bound 2^h wider), fewer bytes than float32 on the untagged ring,
    # every rank the same result
    h = int(res[0]["default_headroom"])
    err = np.abs(res[0]["grad_default"] - ref).max()
    assert err <= 2.0**h * WORLD * 2.0**-7 * 2 * WORLD * peak / WORLD, (err, peak, h)
    for r in res:
        assert np.array_equal(r["grad_default"], res[0]["grad_default"]), "grad_default: ranks differ"
        assert 0 < int(r["data_bytes_default"]) < 0.6 * int(r["data_bytes_None"]), (
            int(r["data_bytes_default"]), int(r["data_bytes_None"]))
    want = np.arange(1000, dtype=np.float32) * sum(range(1, WORLD + 1))
    assert all(np.array_equal(r["tcpstore"], want) for r in res)
    losses = res[0]["losses"]
    assert losses[-5:].mean() < 0.6 * losses[:5].mean(), losses
    assert all(0 < int(r["bytes_h3"]) < int(r["bytes_h0"]) for r in res), [(r["bytes_h0"], r["bytes_h3"]) for r in res]
    assert "headroom must be an integer in 0..24" in str(res[0]["bad_headroom"])


if __name__ == "__main__":
    ddp_job(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
