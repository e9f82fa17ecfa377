"""Every decode gives the same bits on any x86-64 CPU, whatever its SIMD level (issue: THC tables
tie-broken by the last bit of a float sum made a fresh clone fail on AMD EPYC).

The same codec calls on real gradients run here (numpy's AVX2/AVX-512 loops, OpenBLAS's kernel for
this CPU, the codecs' AVX2 paths where the CPU has them) and in child processes held to the
portable paths: the C codecs' scalar code (INCEPTIONN_CODEC_SIMD=off), numpy's baseline loops
(NPY_DISABLE_CPU_FEATURES naming every dispatched feature) and OpenBLAS's oldest x86-64 kernels.
Bytes on the wire and decoded values must not move by a bit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codec_digest import digests

HERE = Path(__file__).parent


def _numpy_dispatched_features() -> str:
    """numpy's dispatched features this CPU has (under `make test-portable` they are disabled
    already: the list it disabled)."""
    from numpy._core import _multiarray_umath as um
    return os.environ.get("NPY_DISABLE_CPU_FEATURES") or " ".join(
        f for f in um.__cpu_dispatch__ if um.__cpu_features__.get(f))


LIMITS = {
    "C codecs scalar": {"INCEPTIONN_CODEC_SIMD": "off"},
    "numpy baseline, OpenBLAS Prescott": {"NPY_DISABLE_CPU_FEATURES": _numpy_dispatched_features(),
                                          "OPENBLAS_CORETYPE": "Prescott"},
    "everything portable": {"INCEPTIONN_CODEC_SIMD": "off", "OPENBLAS_CORETYPE": "Prescott",
                            "NPY_DISABLE_CPU_FEATURES": _numpy_dispatched_features()},
}


@pytest.fixture(scope="module")
def sample(grads, tmp_path_factory):
    # 300,007 real gradient values (an odd length: partial groups, blocks and buckets), with the
    # special values every codec must carry through
    x = np.array(grads[: 300_007], dtype=np.float32)
    x[17] = 0.0
    x[18] = -0.0
    x[19] = np.float32(1e-40)        # a denormal
    path = tmp_path_factory.mktemp("portable") / "x.npy"
    np.save(path, x)
    return x, path


@pytest.fixture(scope="module")
def here(sample):
    return digests(sample[0])


@pytest.mark.parametrize("limit", LIMITS)
def test_every_codec_gives_the_same_bits_on_portable_paths(sample, here, limit):
    env = dict(os.environ, **LIMITS[limit])
    out = subprocess.run([sys.executable, str(HERE / "codec_digest.py"), str(sample[1])], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    there = json.loads(out.stdout)
    assert there.keys() == here.keys()
    differ = sorted(k for k in here if here[k] != there[k])
    assert not differ, f"{limit}: these differ from the default run: {differ}"


def test_the_limits_really_hold_in_the_child(sample):
    """The child really ran without the SIMD paths (else the comparison above proves nothing)."""
    code = ("import json, numpy; from numpy._core import _multiarray_umath as um; "
            "from inceptionn.codecs._native import lib; "
            "print(json.dumps([lib.inc_have_avx2(), [f for f in um.__cpu_dispatch__ if um.__cpu_features__[f]]]))")
    env = dict(os.environ, **LIMITS["everything portable"])
    avx2, numpy_simd = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                                 text=True, check=True).stdout)
    assert avx2 == 0 and numpy_simd == []


def test_numpy_references_agree_with_c_on_every_case(here):
    """Within one run the numpy references give the C codecs' bytes (the child checks the same on
    the portable paths), so a host running either decodes what the other sent."""
    for key, value in here.items():
        if " numpy " in key:
            for c_impl in ("auto", "c", "scalar"):
                other = key.replace(" numpy ", f" {c_impl} ")
                if other in here:
                    assert here[other] == value, (key, other)
