"""The codec table (codecs_c/codec_table.h) holds codecs_c/__init__.py's promise: a new C codec is
one C file and one line in codecs_c/codec_list.h. The test adds a float16 codec
(tests/codecs/f16_codec.c) to a copy of the list, builds the codecs' and the engine's cffi modules
and the MPI library with it, as setup.py lists their C (codecs_c/build_ffi.py,
collective/build_ffi.py), and runs it, untouched otherwise, in a 3-rank job (real OpenMPI, real
PyTorch DDP with gloo, on loopback): through the MPI library's MPI_Allreduce (app mode),
collective.Group and the DDP hook. The library's and Group's sums are the same bits as the
same codec written in numpy and run through the engine's Python callbacks; the DDP gradients
are within float16's rounding of the exact ones.

Also: the table's traits and defaults are what the Python codecs have, and nothing outside
the table names a codec's C."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from c_sources import ROOT, codec_build

TESTS = Path(__file__).resolve().parent
WORLD = 3
N = 200_003            # above the library's threshold (65536), not a multiple of anything


def engine_build():
    import importlib.util
    spec = importlib.util.spec_from_file_location("engine_build", ROOT / "collective" / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_with_codec(tmp: Path, codec_c: Path, entry: str) -> dict:
    """The three builds with one more codec: its C file and one line added to a copy of the list."""
    from cffi import FFI
    codecs, engine = codec_build(), engine_build()
    listing = tmp / "codec_list.h"
    listing.write_text((ROOT / "codecs_c" / "codec_list.h").read_text() + entry + "\n")
    flags = [*codecs.CFLAGS, f'-DCODEC_LIST="{listing}"']
    sources = [str(ROOT / s) for s in codecs.SOURCES] + [str(codec_c)]
    built = {}
    for module, cdef, header, extra in (
            ("inceptionn.codecs._native", codecs.CDEF, "", []),
            ("inceptionn.collective._engine", codecs.CDEF + open(ROOT / "collective" / "ring_engine.cdef").read(),
             '#include "ring_engine.h"\n', [str(ROOT / "collective" / "ring_engine.c")])):
        ffi = FFI()
        ffi.cdef(cdef)
        ffi.set_source(module, header + "\n".join(f'#include "{h}"' for h in codecs.HEADERS), sources=extra + sources,
                       include_dirs=[str(ROOT / d) for d in ("collective", *codecs.INCLUDE_DIRS)], extra_compile_args=flags)
        built[module] = ffi.compile(tmpdir=str(tmp / "build" / module.rsplit(".", 1)[1]))
    lib = tmp / "libpmpi_f16.so"
    pmpi = [str(ROOT / s) for s in engine.PMPI_SOURCES if not s.startswith(codecs.INCLUDE + "/")]
    subprocess.run(["mpicc.openmpi" if shutil.which("mpicc.openmpi") else "mpicc", "-shared", "-fPIC",
                    *engine.PMPI_CFLAGS, f'-DCODEC_LIST="{listing}"', *(f"-I{ROOT / d}" for d in engine.PMPI_INCLUDE),
                    *pmpi, *sources, *(f"-l{x}" for x in engine.PMPI_LIBRARIES), "-o", str(lib)], check=True)
    return {"modules": built, "library": str(lib)}


@pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(t) for t in ("mpirun", "mpicc")),
                    reason="needs root and OpenMPI (mpirun, mpicc)")
def test_a_new_c_codec_is_one_file_and_one_list_entry(tmp_path):
    b = build_with_codec(tmp_path, TESTS / "codecs" / "f16_codec.c", "CODEC(f16)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,tcp")
    r = subprocess.run(["mpirun", "-np", str(WORLD), "--oversubscribe", "-x", f"LD_PRELOAD={b['library']}",
                        "-x", "INCEPTIONN_MPI_MODE=app", "-x", "INCEPTIONN_MPI_CODEC=f16", "-x", "INCEPTIONN_MPI_LOG=1",
                        "-x", "INCEPTIONN_MPI_ADDR=127.0.0.1", "-x", "INCEPTIONN_BIND_ADDR=127.0.0.1",
                        "-x", "INCEPTIONN_MPI_ERROR_FEEDBACK=0",
                        sys.executable, str(TESTS / "shim_progs" / "new_codec_job.py"), str(tmp_path),
                        json.dumps(b["modules"]), str(N)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    took = [ln for ln in r.stderr.splitlines() if "took MPI_Allreduce" in ln]
    assert len(took) == WORLD and all(ln.endswith("mode app, codec f16") for ln in took), r.stderr
    res = [np.load(tmp_path / f"rank{q}.npz") for q in range(WORLD)]
    assert "f16" in res[0]["codecs"]
    assert json.loads(str(res[0]["traits"])) == {"per_value": True, "wants_scaling": False,
                                                 "wants_error_feedback": False, "needs_agreement": False,
                                                 "thread_safe": True}
    ref = res[0]["numpy"]
    exact = np.sum([x["input"].astype(np.float64) for x in res], axis=0)
    assert np.abs(ref - exact).max() > 0                     # float16: not the exact sum
    for x in res:                                            # one ring, three callers: the same bits
        for key in ("mpi", "group", "numpy"):
            assert x[key].tobytes() == ref.tobytes(), key
    # the DDP hook: the mean gradient within float16's roundings (each hop's partial sum, at most
    # WORLD + 1 of them, each within 2^-11 of a value no larger than the sum of |gradients|)
    ddp, exact_grad = res[0]["ddp"], res[0]["ddp_exact"]
    assert all(x["ddp"].tobytes() == ddp.tobytes() for x in res)
    scale = np.sum([np.abs(x["local"].astype(np.float64)) for x in res], axis=0)
    assert np.all(np.abs(ddp - exact_grad) <= (WORLD + 1) * (2.0 ** -11 * scale + 2.0 ** -24))
    assert not np.array_equal(ddp, exact_grad)


def test_python_codecs_read_the_table():
    """Traits and defaults come from the codecs' C descriptions; the MPI library's codec list is
    the table's with a ring codec in C."""
    from inceptionn.codecs import available_codecs, get_codec, table
    from inceptionn.collective import pmpi_env
    assert set(table.names()) <= set(available_codecs())
    for name in table.names():
        d = table.description(name)
        assert get_codec(name).traits() == {t: bool(getattr(d, t)) for t in get_codec(name).TRAITS}, name
    assert get_codec("inceptionn").error_bound == table.defaults("inceptionn").error_bound
    assert get_codec("thc").bits == table.defaults("thc").bits
    assert get_codec("3lc").sparsity == table.defaults("3lc").sparsity
    assert get_codec("terngrad").clip == table.defaults("terngrad").clip
    assert pmpi_env.codecs() == tuple(n for n in table.names() if table.description(n).app)
    assert pmpi_env.nic_codecs() == ("inceptionn",) and pmpi_env.check_codec(None) == table.names()[0]
