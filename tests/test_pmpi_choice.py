"""The MPI_Allreduce library's choice between its ring and MPI's own allreduce
(INCEPTIONN_MPI_CHOOSE, ``--allreduce-choose``; docs/mpi-allreduce.md, "Ring or MPI's own").

Checked on real OpenMPI, an unmodified mpi4py script (tests/shim_progs/mpi4py_choice.py: random
float32 at full precision, a fresh input per call): the first 2 calls of a count class return
the ring's bits; every rank prints the same decision with the same agreed times, and the decision
is the one those times give (whichever path is faster here: the test does not assume which);
later calls are the bits of the chosen path (the ring's, or a plain mpirun's); every rank ends
bit-identical. Made deterministic with INCEPTIONN_MPI_PROBE_TIMES on one rank only: the max over
ranks decides for every rank. A forced setting is honoured, ranks that choose differently turn
the library off, and re-probing is bounded (a round after 256 calls of a class, then 512, ...).

Needs root, OpenMPI (mpirun) and mpi4py.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import run_cli
from inceptionn.kernel_tc import testbed

PROGS = Path(__file__).resolve().parent / "shim_progs"
SCRIPT = [sys.executable, str(PROGS / "mpi4py_choice.py")]
WORLD = 4
N = 262_144                   # the class 262144-524287
CALLS = 5                     # 2 probe calls, 3 on the chosen path
CLASS = "counts 262144-524287"
CHOSE = re.compile(r"inceptionn-mpi\[rank (\d)\]: chose (the ring|MPI's own) for (counts \d+-\d+) on 4 ranks: "
                   r"ring ([0-9.]+) ms, MPI's own ([0-9.]+) ms \(the slowest rank's, best of 2 probe calls\)")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mpirun"), reason="needs root and OpenMPI (mpirun)")


def on_rank(rank: int, **env: str) -> list[str]:
    """A shell in front of the program exporting env in one rank (the wrapper refuses -x INCEPTIONN_MPI_*)."""
    exports = " ".join(f"export {k}={v};" for k, v in env.items())
    return ["sh", "-c", f'if [ "$OMPI_COMM_WORLD_RANK" = {rank} ]; then {exports} fi; exec "$@"', "sh"]


def job(tb_name, out: Path, *wrapper: str, pre=(), calls=CALLS):
    out.mkdir()
    r = run_cli("mpirun", *wrapper, "--testbed", tb_name, "-np", str(WORLD), "--", *pre, *SCRIPT, str(out), str(N),
                str(calls), timeout=240)
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    res = [np.load(out / f"rank{q}.npz") for q in range(WORLD)]
    for i in range(calls):
        assert all(x[f"result{i}"].tobytes() == res[0][f"result{i}"].tobytes() for x in res), f"call {i}: ranks differ"
    return r, [res[0][f"result{i}"].tobytes() for i in range(calls)]


def decisions(stderr: str) -> tuple[str, float, float]:
    """The one decision every rank printed: (path, ring ms, MPI's ms), the same on all four."""
    found = CHOSE.findall(stderr)
    assert sorted(int(f[0]) for f in found) == list(range(WORLD)), stderr[-3000:]
    assert len({f[1:] for f in found}) == 1, found           # same path, class and agreed times
    _, path, cls, ring, mpi = found[0]
    assert cls == CLASS
    return path, float(ring), float(mpi)


def test_choice_from_measured_times_and_its_fallback(tb_name, tmp_path):
    """auto on 4 testbed hosts (app mode, no error feedback so that every path's bits can be
    compared with a run of that path alone): the measured decision, then the same with rank 2
    reporting the ring 1000 s slow (falls back to MPI's own on every rank) and rank 1 reporting
    MPI's own 1000 s slow (stays on the ring)."""
    base = ["--compress-allreduce", "--allreduce-mode", "app", "--no-allreduce-error-feedback"]
    with testbed.Testbed(hosts=WORLD, name=tb_name):
        _, ring = job(tb_name, tmp_path / "ring", *base, "--allreduce-choose", "ring")
        _, plain = job(tb_name, tmp_path / "plain", "--tag", "none")
        assert all(a != b for a, b in zip(ring, plain))        # the two paths' bits differ on every call

        r, got = job(tb_name, tmp_path / "auto", *base, "--log", "1")
        path, ring_ms, mpi_ms = decisions(r.stderr)
        print(f"\nmeasured, {N} random float32, 4 hosts, app mode: ring {ring_ms} ms, MPI's own {mpi_ms} ms: {path}")
        assert ring_ms > 0 and mpi_ms > 0 and (path == "MPI's own") == (mpi_ms < ring_ms)
        chosen = plain if path == "MPI's own" else ring
        assert got == ring[:2] + chosen[2:]
        mpi_calls = 3 if path == "MPI's own" else 0
        assert r.stderr.count(f"{CLASS}: {'MPI' if mpi_calls else 'the ring'}") == WORLD, r.stderr[-3000:]
        assert r.stderr.count(f"; {CALLS - mpi_calls} calls on the ring, {mpi_calls} by MPI's own") == WORLD

        r, got = job(tb_name, tmp_path / "slow-ring", *base, "--log", "1",
                     pre=on_rank(2, INCEPTIONN_MPI_PROBE_TIMES="1000000,0"))
        assert decisions(r.stderr)[:2] == ("MPI's own", 1000000.0)
        assert got == ring[:2] + plain[2:]
        assert r.stderr.count("by MPI's own (chosen for counts 262144-524287)") == 3 * WORLD

        r, got = job(tb_name, tmp_path / "slow-mpi", *base, "--log", "1",
                     pre=on_rank(1, INCEPTIONN_MPI_PROBE_TIMES="0,1000000"))
        path, _, mpi_ms = decisions(r.stderr)
        assert (path, mpi_ms) == ("the ring", 1000000.0)
        assert got == ring


def test_forced_choice_and_a_mismatch(tb_name, tmp_path):
    """--allreduce-choose ring never probes (even when every rank would measure MPI's own faster),
    mpi never sets up a ring; ranks that choose differently turn the library off (one line each)."""
    base = ["--compress-allreduce", "--allreduce-mode", "app", "--no-allreduce-error-feedback", "--log", "1"]
    with testbed.Testbed(hosts=WORLD, name=tb_name):
        _, plain = job(tb_name, tmp_path / "plain", "--tag", "none")
        r, ring = job(tb_name, tmp_path / "ring", *base, "--allreduce-choose", "ring",
                      pre=["env", "INCEPTIONN_MPI_PROBE_TIMES=1000000,0"])
        assert "every such call on the ring (--allreduce-choose ring)" in r.stderr
        assert " chose " not in r.stderr and "by MPI's own" not in r.stderr
        assert r.stderr.count(f"choice for {CLASS}: the ring for all {CALLS} calls (INCEPTIONN_MPI_CHOOSE=ring") == WORLD
        assert all(a != b for a, b in zip(ring, plain))

        r, got = job(tb_name, tmp_path / "mpi", *base, "--allreduce-choose", "mpi")
        assert got == plain
        assert "ring ready" not in r.stderr
        assert r.stderr.count(f"passed MPI_Allreduce(count {N}, MPI_FLOAT, MPI_SUM): INCEPTIONN_MPI_CHOOSE=mpi") == CALLS * WORLD

        r, got = job(tb_name, tmp_path / "mix", *base, pre=on_rank(1, INCEPTIONN_MPI_CHOOSE="ring"))
        off = [ln for ln in r.stderr.splitlines() if "the MPI_Allreduce library is off for this job: rank 1's "
               "INCEPTIONN_MPI_CHOOSE ring differs from rank 0's auto" in ln]
        assert len(off) == WORLD, r.stderr[-3000:]
        assert got == plain


def test_reprobe_is_rare_and_bounded(tmp_path):
    """300 calls of one class on loopback, every rank told MPI's own is faster: probe rounds at
    calls 1-2 and 259-260 only (256 calls after the first decision), 4 calls on the ring."""
    from inceptionn.shim.run import preload_library
    lib = preload_library("inceptionn.collective._pmpi_allreduce")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,tcp")
    r = subprocess.run(["mpirun", "-np", str(WORLD), "--oversubscribe", "-x", f"LD_PRELOAD={lib}",
                        "-x", "INCEPTIONN_MPI_ADDR=127.0.0.1", "-x", "INCEPTIONN_MPI_LOG=1",
                        "-x", "INCEPTIONN_MPI_PROBE_TIMES=5,1", *SCRIPT, str(tmp_path), "65536", "300", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    chose = [ln for ln in r.stderr.splitlines() if " chose " in ln]
    assert len(chose) == 2 * WORLD, chose
    assert sum("next probe round in 256 calls" in ln for ln in chose) == WORLD
    assert sum("next probe round in 512 calls" in ln for ln in chose) == WORLD
    assert r.stderr.count("choice for counts 65536-131071: MPI's own, as ring 5.000 ms > MPI's own 1.000 ms (the "
                          "slowest rank's, best of 2 probe calls, in the last of 2 rounds); 4 calls on the ring, "
                          "296 by MPI's own") == WORLD, r.stderr[-3000:]


@pytest.mark.parametrize("var,value", [("INCEPTIONN_MPI_CHOOSE", "fast"), ("INCEPTIONN_MPI_PROBE_TIMES", "5"),
                                       ("INCEPTIONN_MPI_PROBE_TIMES", "x,1"), ("INCEPTIONN_MPI_PROBE_TIMES", "-1,1")])
def test_bad_settings_stop_the_rank_with_one_line(tmp_path, var, value):
    from inceptionn.shim.run import preload_library
    lib = preload_library("inceptionn.collective._pmpi_allreduce")
    r = subprocess.run([*SCRIPT, str(tmp_path), "10", "1"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, LD_PRELOAD=lib, **{var: value}))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"error: bad {var} '{value}'" in r.stderr
