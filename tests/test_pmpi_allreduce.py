"""The MPI_Allreduce library (collective/pmpi_allreduce.c) under ``inceptionn mpirun
--compress-allreduce``: unmodified programs (tests/shim_progs/mpi_allreduce.c, a C program, and
tests/shim_progs/mpi4py_allreduce.py, ``comm.Allreduce(MPI.IN_PLACE, grad)``) on testbed hosts.

What is checked: every rank ends bit-identical; within the codec's bound of the exact sum; the
soft NICs compressed the ring's packets (nic mode); the result does not depend on whether they did
(the same job without daemons gives the same bytes); calls the library must not take (small,
float64, int, MPI_MAX) are byte for byte MPI's own; app mode without daemons; a setup failure on
one rank makes all fall back with one warning line (an address it cannot bind); settings that differ
turn the library off on every rank (one line each); a rank killed in the middle of a call ends
the job, with no result written; the C ring and the Python ring (collective.Group) give the same bits;
error feedback (optional) keeps the sum of repeated results near the exact sum, in bounded memory.

Needs root, OpenMPI (mpirun, mpicc) and mpi4py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import run_cli
from inceptionn.daemon.stats import read as read_stats
from inceptionn.kernel_tc import testbed
from test_mpirun import cli_error, nicds

PROGS = Path(__file__).resolve().parent / "shim_progs"
N = 1_000_003                 # values per float32 call: above the default threshold, not a multiple of anything
WORLD = 4
TAKEN = ("inplace", "separate", "half")
EXACT = ("small", "max", "double", "int")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("mpirun", "mpicc")),
    reason="needs root and OpenMPI (mpirun, mpicc)")


@pytest.fixture(scope="module")
def prog(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("mpi") / "mpi_allreduce"
    subprocess.run(["mpicc", "-O2", "-Wall", "-Wextra", str(PROGS / "mpi_allreduce.c"), "-o", str(out)], check=True)
    return str(out)


def results(d: Path, name: str, dtype=np.float32) -> list[np.ndarray]:
    return [np.fromfile(d / f"rank{r}_{name}.bin", dtype=dtype) for r in range(WORLD)]


def job(tb_name, outdir: Path, *wrapper: str, program: list[str], timeout=240):
    outdir.mkdir(exist_ok=True)
    r = run_cli("mpirun", *wrapper, "--testbed", tb_name, "-np", str(WORLD), "--", *program, timeout=timeout)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def check_taken(d: Path, key: str, inputs: list[np.ndarray], members=None) -> np.ndarray:
    """Bit-identical on every rank (of each half) and within the codec's bound of the exact sum:
    each of the N - 1 lossy hops of phase 1 and the owner's rounding lose at most 2^-7 of the
    scaled values (each block of the partial sum scaled so its max lies in [0.5, 1): 2^-s is at
    most twice the block's max, at most N times the inputs' max)."""
    got = results(d, key)
    groups = [[0, 2], [1, 3]] if key == "half" else [list(range(WORLD))]
    for g in groups:
        assert all(np.array_equal(got[g[0]], got[r]) for r in g), f"{key}: ranks {g} differ"
        exact = np.sum(np.array([inputs[r] for r in g], dtype=np.float64), axis=0)
        m = max(float(np.abs(inputs[r]).max()) for r in g)
        err = np.abs(got[g[0]] - exact).max()
        assert 0 < err <= len(g) * 2.0**-7 * 2 * len(g) * m, (key, err, m)
    return got[0]


def test_c_program_through_the_soft_nics(tb_name, tmp_path, prog):
    """nic mode on 4 hosts with the soft NIC on each, then the same job with no daemon (raw
    packets): same bytes; then plain MPI (no library) for the calls that must pass through."""
    with testbed.Testbed(hosts=WORLD, name=tb_name) as tb:
        nic = tmp_path / "nic"
        with nicds(tb.hosts, tmp_path) as socks:
            r = job(tb_name, nic, "--compress-allreduce", "--log", "1", program=[prog, str(nic), str(N)])
            stats = [read_stats(str(s))["counters"] for s in socks]
        print(r.stderr)
        assert "MPI_Allreduce compressed (mode nic" in r.stderr   # auto: every host runs the soft NIC
        for c in stats:
            assert c["egress_compressed"] > 0 and c["ingress_restored"] > 0, c
        for rank in range(WORLD):
            assert f"inceptionn-mpi[rank {rank}]: summary: 3 MPI_Allreduce calls taken (11.4 MiB" in r.stderr
            assert f"inceptionn-mpi[rank {rank}]: passed MPI_Allreduce(count 1000, MPI_FLOAT, MPI_SUM): count below 65536" in r.stderr
            assert f"inceptionn-mpi[rank {rank}]: passed MPI_Allreduce(count {N}, MPI_INT, MPI_SUM): not float32" in r.stderr
        inputs = results(nic, "input")
        taken = {k: check_taken(nic, k, inputs) for k in TAKEN}

        raw = tmp_path / "raw"          # no daemon: the same computation, nothing compressed on the way
        r = job(tb_name, raw, "--compress-allreduce", "--allreduce-mode", "nic", program=[prog, str(raw), str(N)])
        assert "does not run on every host" in r.stderr
        for k in TAKEN:
            assert results(raw, k)[0].tobytes() == taken[k].tobytes(), f"{k}: depends on the network"

        plain = tmp_path / "plain"      # OpenMPI alone
        job(tb_name, plain, "--tag", "none", program=[prog, str(plain), str(N)])
        for k, dt in (("small", np.float32), ("max", np.float32), ("double", np.float64), ("int", np.int32)):
            for rank in range(WORLD):
                assert (nic / f"rank{rank}_{k}.bin").read_bytes() == (plain / f"rank{rank}_{k}.bin").read_bytes(), k
        assert not np.array_equal(results(plain, "inplace")[0], taken["inplace"])


def test_mpi4py_script_app_mode_and_fallback(tb_name, tmp_path, prog):
    """No daemons: app mode (the codec in the ranks) for an mpi4py script; a setup failure on one
    rank (an address it cannot bind) makes every rank fall back to MPI's own, with one warning
    line; a mid-call failure (one rank framing the codec stream differently) aborts with one line."""
    with testbed.Testbed(hosts=WORLD, name=tb_name) as tb:
        app = tmp_path / "app"
        app.mkdir()
        r = job(tb_name, app, "--compress-allreduce", program=[sys.executable, str(PROGS / "mpi4py_allreduce.py"), str(app), str(N)])
        assert "MPI_Allreduce compressed (mode app" in r.stderr
        res = [np.load(app / f"rank{q}.npz") for q in range(WORLD)]
        inputs = [x["input"] for x in res]
        exact = np.sum(np.array(inputs, dtype=np.float64), axis=0)
        m = max(float(np.abs(x).max()) for x in inputs)
        for key in ("inplace", "separate"):
            assert all(np.array_equal(res[0][key], x[key]) for x in res), key
            assert 0 < np.abs(res[0][key] - exact).max() <= WORLD * 2.0**-7 * 2 * WORLD * m
        plain = tmp_path / "plain"
        plain.mkdir()
        job(tb_name, plain, "--tag", "none", program=[sys.executable, str(PROGS / "mpi4py_allreduce.py"), str(plain), str(N)])
        ref = [np.load(plain / f"rank{q}.npz") for q in range(WORLD)]
        for q in range(WORLD):
            for key in ("small", "double", "max"):
                assert res[q][key].tobytes() == ref[q][key].tobytes(), key

        # setup failure on rank 2: every rank falls back, results are MPI's own bytes
        fb = tmp_path / "fallback"
        wrap = ["sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 2 ]; then export INCEPTIONN_MPI_ADDR=192.0.2.1; fi; exec "$@"', "sh"]
        r = job(tb_name, fb, "--compress-allreduce", "--allreduce-mode", "app", program=[*wrap, prog, str(fb), str(N)])
        # one line per communicator: MPI_COMM_WORLD, and the half {0, 2} where world rank 2 is rank 1
        warnings = sorted(ln for ln in r.stderr.splitlines() if "warning: ring setup failed" in ln)
        assert len(warnings) == 2 and all("192.0.2.1" in w for w in warnings), r.stderr
        assert "on rank 1 of 2" in warnings[0] and "on rank 2 of 4" in warnings[1], warnings
        plain_c = tmp_path / "plain_c"
        job(tb_name, plain_c, "--tag", "none", program=[prog, str(plain_c), str(N)])
        for rank in range(WORLD):
            for k in ("inplace", "separate", *EXACT):
                assert (fb / f"rank{rank}_{k}.bin").read_bytes() == (plain_c / f"rank{rank}_{k}.bin").read_bytes(), k

        # settings that differ between ranks (a job launched by hand): compared in MPI_Init, the
        # library is off on every rank (one line each), every call MPI's own
        wrap = ["sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export INCEPTIONN_MPI_CHUNK=1000 INCEPTIONN_MPI_HEADROOM=2; fi; exec "$@"', "sh"]
        mix = tmp_path / "mix"
        r = job(tb_name, mix, "--compress-allreduce", "--allreduce-mode", "app", program=[*wrap, prog, str(mix), str(N)])
        warnings = [ln for ln in r.stderr.splitlines() if "warning:" in ln and "inceptionn-mpi" in ln]
        assert len(warnings) == WORLD, r.stderr
        assert all("the MPI_Allreduce library is off for this job: rank 1's settings differ from rank 0's (mode app, "
                   "min count 65536, error bound -10, chunk 1000, codec inceptionn, headroom 2, version 5; rank 0: mode "
                   "app, min count 65536, error bound -10, chunk 65536, codec inceptionn, headroom 0, version 5)" in w for w in warnings), warnings
        assert (mix / "rank0_inplace.bin").read_bytes() == (plain_c / "rank0_inplace.bin").read_bytes()

        # mid-call: rank 3 is killed while the ranks loop over MPI_Allreduce; the job ends (no hang),
        # through MPI_Abort or mpirun's own teardown, and no rank writes a result
        bad = tmp_path / "bad"
        bad.mkdir()
        wrap = ["sh", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 3 ]; then (sleep 2; kill -9 $$) & fi; exec "$@"', "sh"]
        r = run_cli("mpirun", "--compress-allreduce", "--allreduce-mode", "app", "--testbed", tb_name, "-np", str(WORLD),
                    "--", *wrap, prog, str(bad), str(N), "1000", timeout=240)
        print(f"\nrank 3 killed mid-loop:\n{r.stderr}")
        assert r.returncode != 0
        errors = [ln for ln in r.stderr.splitlines() if "error: MPI_Allreduce ring" in ln]
        assert len(errors) <= 2 and all("aborting the job" in e for e in errors), r.stderr
        assert not list(bad.glob("*_inplace.bin"))


@pytest.mark.parametrize("mode", ["nic", "app"])
def test_c_ring_and_python_group_agree(tmp_path, mode):
    """One ring: on the same inputs and settings (codec error bound -10, wire format v2: scaling
    per 256-value block at every hop), the library's MPI_Allreduce and collective.Group.allreduce give the same bits. On
    loopback, with no daemon (the result does not depend on the network)."""
    from inceptionn.shim.run import preload_library
    lib = preload_library("inceptionn.collective._pmpi_allreduce")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,tcp")
    r = subprocess.run(["mpirun", "-np", "4", "--oversubscribe", "-x", f"LD_PRELOAD={lib}", "-x", f"INCEPTIONN_MPI_MODE={mode}",
                        "-x", "INCEPTIONN_MPI_ADDR=127.0.0.1", "-x", "INCEPTIONN_BIND_ADDR=127.0.0.1",
                        # two calls of one count: error feedback (the default) would carry the first
                        # one's loss into the second; this test holds the transforms together
                        "-x", "INCEPTIONN_MPI_ERROR_FEEDBACK=0",
                        sys.executable, str(PROGS / "mpi4py_allreduce.py"), str(tmp_path), "300001", "--group", mode],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    res = [np.load(tmp_path / f"rank{q}.npz") for q in range(4)]
    for x in res:
        assert x["inplace"].tobytes() == res[0]["group"].tobytes()
        assert x["separate"].tobytes() == res[0]["group"].tobytes()
    exact = np.sum([x["input"].astype(np.float64) for x in res], axis=0)
    assert np.abs(res[0]["inplace"] - exact).max() > 0   # compressed: not the exact sum


def test_thread_multiple(tb_name, tmp_path):
    """MPI_THREAD_MULTIPLE: two threads of every rank reduce on their own communicators at the
    same time (each its own ring, set up concurrently); the results are what the same inputs give
    one after the other, on every rank."""
    exe = tmp_path / "mpi_threads"
    subprocess.run(["mpicc", "-O2", "-Wall", "-Wextra", "-pthread", str(PROGS / "mpi_threads.c"), "-o", str(exe)], check=True)
    with testbed.Testbed(hosts=WORLD, name=tb_name):
        out = tmp_path / "out"
        # without error feedback (on by default): each thread's calls share one key, and the
        # sequential calls, which the results are compared with, would not carry its residuals
        r = job(tb_name, out, "--compress-allreduce", "--allreduce-mode", "app", "--no-allreduce-error-feedback",
                "--allreduce-choose", "ring",   # 5 calls of a class: the ring's bits on every one
                "--log", "1", program=[str(exe), str(out), "300000", "5"])
        for rank in range(WORLD):   # 2 threads x 5 calls + 2 sequential calls
            assert f"inceptionn-mpi[rank {rank}]: summary: 12 MPI_Allreduce calls taken" in r.stderr, r.stderr
        for t in ("0", "1"):
            got = results(out, f"t{t}")
            seq = results(out, f"seq{t}")
            assert all(g.tobytes() == seq[0].tobytes() and s.tobytes() == seq[0].tobytes() for g, s in zip(got, seq)), t


def test_dry_run_shows_the_library_and_settings(tb_name):
    from inceptionn.shim.run import preload_library
    lib = preload_library("inceptionn.collective._pmpi_allreduce")
    with testbed.Testbed(hosts=2, name=tb_name) as tb:
        r = run_cli("mpirun", "--compress-allreduce", "--allreduce-min-count", "1000", "--allreduce-error-bound", "-12",
                    "--allreduce-headroom", "3", "--testbed", tb_name, "--dry-run", "--json", "-np", "2", "--",
                    "/bin/true")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert plan["policy"] is None
        assert plan["allreduce"] == {"library": lib, "mode": "app", "requested_mode": "auto", "codec": "inceptionn",
                                     "min_count": 1000,
                                     "error_bound": -12, "error_feedback": True, "iface": str(tb.network), "log": False,
                                     "nicd_socket": "/run/inceptionn/nicd.sock", "mpi": "openmpi",
                                     "choose": "auto", "headroom": 3}
        argv = plan["mpirun"]
        exported = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-x")
        assert exported["LD_PRELOAD"] == lib   # no --tag: the tagging library stays out
        assert exported["INCEPTIONN_MPI_ERROR_FEEDBACK"] == "1"   # on by default, said explicitly
        assert exported["INCEPTIONN_MPI_CODEC"] == "inceptionn"
        assert exported["INCEPTIONN_MPI_HEADROOM"] == "3"
        assert "INCEPTIONN_MPI_CHOOSE" not in exported    # auto: the library's default
        assert (exported["INCEPTIONN_MPI_MODE"], exported["INCEPTIONN_MPI_MIN_COUNT"],
                exported["INCEPTIONN_MPI_ERROR_BOUND"], exported["INCEPTIONN_MPI_IFACE"]) == ("app", "1000", "-12", str(tb.network))
        # with a policy: the tagging library first, then this one; a forced nic mode warns
        r = run_cli("mpirun", "--tag", "port=23000-23099", "--compress-allreduce", "--allreduce-mode", "nic",
                    "--testbed", tb_name, "--dry-run", "--json", "-np", "2", "--", "/bin/true")
        plan = json.loads(r.stdout)
        argv = plan["mpirun"]
        preload = next(argv[i + 1] for i, a in enumerate(argv) if a == "-x" and argv[i + 1].startswith("LD_PRELOAD="))
        assert preload.split("=", 1)[1].split() == [preload_library(), lib]
        assert plan["allreduce"]["mode"] == "nic"
        assert any("soft NIC does not run on every host" in w for w in plan["warnings"])


@pytest.mark.parametrize("args,needle", [
    (["--allreduce-mode", "nic", "--", "true"], "--allreduce-mode goes with --compress-allreduce"),
    (["--compress-allreduce", "--allreduce-mode", "fast", "--", "true"], "bad --allreduce-mode 'fast'"),
    (["--compress-allreduce", "--allreduce-min-count", "0", "--", "true"], "bad --allreduce-min-count '0'"),
    (["--compress-allreduce", "--allreduce-error-bound", "-31", "--", "true"], "bad --allreduce-error-bound '-31'"),
    (["--compress-allreduce", "-x", "INCEPTIONN_MPI_MODE=nic", "--", "true"], "do not pass -x INCEPTIONN_MPI_MODE"),
    (["--allreduce-error-feedback", "--", "true"], "--allreduce-error-feedback goes with --compress-allreduce"),
    (["--compress-allreduce", "--allreduce-error-feedback=1", "--", "true"], "--allreduce-error-feedback takes no value"),
    (["--no-allreduce-error-feedback", "--", "true"], "--no-allreduce-error-feedback goes with --compress-allreduce"),
    (["--compress-allreduce", "--allreduce-error-feedback", "--no-allreduce-error-feedback", "--", "true"],
     "--allreduce-error-feedback and --no-allreduce-error-feedback: give one"),
    (["--allreduce-choose", "ring", "--", "true"], "--allreduce-choose goes with --compress-allreduce"),
    (["--compress-allreduce", "--allreduce-choose", "fast", "--", "true"], "bad --allreduce-choose 'fast'"),
    (["--allreduce-headroom", "2", "--", "true"], "--allreduce-headroom goes with --compress-allreduce"),
    (["--compress-allreduce", "--allreduce-headroom", "25", "--", "true"],
     "bad --allreduce-headroom '25': must be an integer in 0..24"),
    (["--compress-allreduce", "--allreduce-headroom", "two", "--", "true"], "bad --allreduce-headroom 'two'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_allreduce_option_errors_are_one_line(args, needle, capsys):
    assert needle in cli_error(capsys, "mpirun", *args)


@pytest.mark.parametrize("mode", ["nic", "app"])
def test_error_feedback_tracks_the_exact_sum(tmp_path, mode):
    """INCEPTIONN_MPI_ERROR_FEEDBACK=1 on real HDC gradients (a different one per rank), the same
    input reduced T times: without error feedback every call loses the same amount, so the sum of
    the T results is off by T times one call's error; with it, what a call lost goes into the next
    one and the sum stays within about one call's error of T times the exact sum. The first call
    is the same bits either way (no residual yet). Then 20 more counts: the residual memory keeps
    16 per communicator (the least recently used dropped), as the summary says. On loopback, no
    daemon (nic mode's result does not depend on the network)."""
    from inceptionn.shim.run import preload_library
    from inceptionn.train.gradients import capture_gradients
    lib = preload_library("inceptionn.collective._pmpi_allreduce")
    grads = capture_gradients(WORLD, seed=3)
    indir = tmp_path / "in"
    indir.mkdir()
    for q, g in enumerate(grads):
        np.save(indir / f"grad{q}.npy", g)
    exact = np.sum(np.array(grads, dtype=np.float64), axis=0)
    calls = 12
    counts = ",".join(str(100_000 + 1000 * i) for i in range(20))
    out = {}
    for ef in ("0", "1"):
        d = tmp_path / f"ef{ef}"
        d.mkdir()
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,tcp")
        r = subprocess.run(["mpirun", "-np", str(WORLD), "--oversubscribe", "-x", f"LD_PRELOAD={lib}",
                            "-x", f"INCEPTIONN_MPI_MODE={mode}", "-x", "INCEPTIONN_MPI_ADDR=127.0.0.1",
                            "-x", f"INCEPTIONN_MPI_ERROR_FEEDBACK={ef}", "-x", "INCEPTIONN_MPI_LOG=1",
                            "-x", "INCEPTIONN_MPI_CHOOSE=ring",   # 12 calls of one count: all the ring's
                            sys.executable, str(PROGS / "mpi4py_feedback.py"), str(indir), str(d), str(calls), counts],
                           capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        res = [np.load(d / f"rank{q}.npz") for q in range(WORLD)]
        assert all(x["total"].tobytes() == res[0]["total"].tobytes() for x in res), "ranks differ"
        out[ef] = res[0]
        summaries = [ln for ln in r.stderr.splitlines() if "summary:" in ln]
        assert len(summaries) == WORLD and all(f"summary: {calls + 20} MPI_Allreduce calls taken" in s for s in summaries)
        if ef == "1":
            # 21 keys: the gradient's and the first 4 counts' residuals went, the last 16 are held
            held = sum(100_000 + 1000 * i for i in range(4, 20)) * 4 / 2**20
            assert all(f"error feedback: {held:.1f} MiB of residuals at the end, 5 dropped" in s for s in summaries), summaries
            assert "error feedback" in next(ln for ln in r.stderr.splitlines() if "ring ready" in ln)
        else:
            assert all("error feedback" not in s for s in summaries)
    assert out["0"]["first"].tobytes() == out["1"]["first"].tobytes()
    one = np.linalg.norm(out["0"]["first"] - exact)
    err = {ef: np.linalg.norm(out[ef]["total"] - calls * exact) for ef in out}
    print(f"\n{mode}: one call's error {one:.3e}; error of the sum of {calls}: without EF {err['0']:.3e}, with EF {err['1']:.3e}")
    assert err["0"] > 0.9 * calls * one           # the same loss every call
    assert err["1"] < 2.5 * one                   # bounded by about one call's loss
