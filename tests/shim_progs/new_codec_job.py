"""One rank of tests/test_codec_table.py's job: a codec the test added (f16, tests/codecs/f16_codec.c)
through the MPI library (MPI_Allreduce, INCEPTIONN_MPI_CODEC=f16), collective.Group and the DDP
hook, with the codecs' and the engine's cffi modules the test built with it. Saves OUTDIR/rankR.npz.

Usage: new_codec_job.py OUTDIR MODULES_JSON N   (MODULES_JSON: {module name: built file})
"""
import importlib.util
import json
import os
import sys


def load_built_modules(modules: dict) -> None:
    """The test's builds of inceptionn.codecs._native and inceptionn.collective._engine, in place
    of the installed ones (before anything imports them)."""
    for name, path in modules.items():
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module


def main() -> None:
    outdir, modules, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    load_built_modules(modules)
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from mpi4py import MPI
    from torch.nn.parallel import DistributedDataParallel as DDP

    from inceptionn.codecs import available_codecs, get_codec
    from inceptionn.codecs.base import Codec, check_vector
    from inceptionn.collective import Group
    from inceptionn.collective.torch_hook import register_ring_hook

    class NumpyF16(Codec):
        """The same codec in numpy, run through the engine's Python callbacks: the reference."""
        name = "f16-numpy"
        per_value = thread_safe = True

        def encode(self, x):
            return check_vector(x).astype(np.float16).tobytes()

        def decode_into(self, blob, out):
            out[:] = np.frombuffer(blob, np.float16, out.size)
            return out

        def max_encoded_size(self, n):
            return 2 * n

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng([7, rank])
    x = (rng.standard_normal(n) * 0.01).astype(np.float32)
    out = {"input": x, "codecs": np.array(available_codecs()), "traits": np.array(json.dumps(get_codec("f16").traits()))}
    mpi = x.copy()
    comm.Allreduce(MPI.IN_PLACE, mpi)                      # the library, INCEPTIONN_MPI_CODEC=f16
    out["mpi"] = mpi
    with Group.from_mpi(comm, compress="app") as g:
        out["group"] = g.allreduce(x.copy(), codec="f16", error_feedback=False)
        out["numpy"] = g.allreduce(x.copy(), codec=NumpyF16(), error_feedback=False)

    # the DDP hook, codec f16 in the process
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{outdir}/init", rank=rank, world_size=world)
    group = Group.from_torch(bind_addr="127.0.0.1", timeout=60)
    inputs = torch.from_numpy(np.random.default_rng([8, rank]).standard_normal((64, 20)).astype(np.float32))
    labels = torch.from_numpy(np.random.default_rng([9, rank]).integers(0, 4, 64))
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    net = model()
    F.cross_entropy(net(inputs), labels).backward()
    out["local"] = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).numpy().copy()
    grads = {}
    for codec in ("f16", None):
        ddp = DDP(model())
        state = register_ring_hook(ddp, group, compress="app" if codec else None, codec=codec,
                                   error_feedback=False if codec else None)
        F.cross_entropy(ddp(inputs), labels).backward()
        grads[codec] = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()]).numpy().copy()
        state.close()
    out["ddp"], out["ddp_exact"] = grads["f16"], grads[None]
    group.close()
    dist.destroy_process_group()
    np.savez(os.path.join(outdir, f"rank{rank}.npz"), **out)


if __name__ == "__main__":
    main()
