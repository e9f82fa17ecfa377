"""Data-parallel training through the MPI_Allreduce library: examples/mpi4py_hdc.py (numpy and
mpi4py only, one ``comm.Allreduce(MPI.IN_PLACE, grad)`` of all 789,010 float32 gradient values per
step) on 4 testbed hosts, under plain ``inceptionn mpirun`` (OpenMPI's own sum) and under
``--compress-allreduce`` (app mode: the codec in the library, no daemon; nic mode gives the same
bits, tests/test_pmpi_allreduce.py) with and without ``--allreduce-error-feedback``, seeds 0, 1, 2.

Checked: the library took every gradient call (its summary line in every rank); the replicas
stayed identical; every run learns (final test accuracy above 90%); with error feedback the mean
final accuracy of the compressed runs is not more than 0.5 point below the uncompressed runs'
(the issue's target, read as README's training table reads it: not worse). Without it the
compressed runs are printed, not held to the target: on these seeds their mean is 1.3 points
lower (docs/mpi-allreduce.md). The runs are deterministic (the
compressed sum does not depend on the network), so this is a fixed comparison, not a sample.
Needs root, OpenMPI and mpi4py.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from cli_helpers import run_cli
from inceptionn.kernel_tc import testbed

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "mpi4py_hdc.py"
SEEDS = (0, 1, 2)
EPOCHS, DECAY_AT = 14, 11        # lr 0.1, then 0.01 for the last 4 epochs: the final accuracy settles
STEPS = EPOCHS * 15              # 1,438 training images / 4 ranks / 25 per step = 15 steps per epoch

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mpirun"), reason="needs root and OpenMPI")


def train(tb_name: str, seed: int, *wrapper: str) -> tuple[dict, str]:
    r = run_cli("mpirun", *wrapper, "--testbed", tb_name, "-np", "4", "-x", "OMP_NUM_THREADS=1",
                "-x", "OPENBLAS_NUM_THREADS=1", "--", sys.executable, str(SCRIPT), "--seed", str(seed),
                "--epochs", str(EPOCHS), "--decay-at", str(DECAY_AT), timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    done = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"event": "done"')]
    assert len(done) == 1, r.stdout
    assert done[0]["replicas"] == 1 and done[0]["steps"] == STEPS, done[0]
    return done[0], r.stderr


def test_training_accuracy_compressed_vs_uncompressed(tb_name):
    acc = {"uncompressed": {}, "compressed": {}, "compressed, error feedback": {}}
    with testbed.Testbed(hosts=4, name=tb_name):
        for seed in SEEDS:
            acc["uncompressed"][seed] = train(tb_name, seed, "--tag", "none")[0]["final_accuracy"]
            for name, ef in (("compressed", []), ("compressed, error feedback", ["--allreduce-error-feedback"])):
                done, err = train(tb_name, seed, "--compress-allreduce", "--allreduce-mode", "app", *ef, "--log", "1")
                acc[name][seed] = done["final_accuracy"]
                summaries = [ln for ln in err.splitlines() if "summary:" in ln]
                assert len(summaries) == 4, err
                assert all(f"summary: {STEPS} MPI_Allreduce calls taken" in s for s in summaries), err
                # one residual: the script's one gradient of 789,010 values (3.0 MiB)
                assert all(("error feedback: 3.0 MiB of residuals" in s) == bool(ef) for s in summaries), summaries
    mean = {name: sum(d.values()) / len(d) for name, d in acc.items()}
    print(f"\nfinal test accuracy, seeds {SEEDS}:")
    for name, d in acc.items():
        print(f"  {name:<27} {'  '.join(f'{d[s]:.4f}' for s in SEEDS)}   mean {mean[name]:.4f} "
              f"({100 * (mean[name] - mean['uncompressed']):+.2f} points)")
    assert all(a > 0.9 for d in acc.values() for a in d.values()), acc
    assert mean["compressed, error feedback"] >= mean["uncompressed"] - 0.005
