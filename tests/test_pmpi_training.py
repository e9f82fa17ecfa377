"""Data-parallel training through the MPI_Allreduce library: examples/mpi4py_hdc.py (numpy and
mpi4py only, one ``comm.Allreduce(MPI.IN_PLACE, grad)`` of all 789,010 float32 gradient values per
step) on 4 testbed hosts, under plain ``inceptionn mpirun`` (OpenMPI's own sum) and under
``--compress-allreduce`` at its defaults (mode auto: app here, no daemon; nic gives the same bits,
tests/test_pmpi_allreduce.py; error feedback on), seeds 0-5.

Checked: the library took every gradient call with error feedback on (its summary line in every
rank); the replicas stayed identical; every run learns (final test accuracy above 90%); the mean
final accuracy of the compressed runs is not more than 0.3 point below the uncompressed runs'
(issue 29). One test image is 0.28 point and the seeds spread by 0.7-1.4 points (standard
deviation), so a mean over few seeds cannot resolve 0.3 point: seeds 0-2 alone give -0.46 (seed 0
dips to 93.9% with error feedback), 0-5 give +0.28, the ten seeds 0-9 +0.08 (docs/collectives.md,
"Error feedback's default, measured"). The runs are deterministic (the compressed sum does not
depend on the network), so this is a fixed comparison over the first six seeds, not a sample.
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
SEEDS = (0, 1, 2, 3, 4, 5)
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
    acc = {"uncompressed": {}, "compressed (defaults)": {}}
    with testbed.Testbed(hosts=4, name=tb_name):
        for seed in SEEDS:
            acc["uncompressed"][seed] = train(tb_name, seed, "--tag", "none")[0]["final_accuracy"]
            done, err = train(tb_name, seed, "--compress-allreduce", "--log", "1")
            acc["compressed (defaults)"][seed] = done["final_accuracy"]
            summaries = [ln for ln in err.splitlines() if "summary:" in ln]
            assert len(summaries) == 4, err
            assert all(f"summary: {STEPS} MPI_Allreduce calls taken" in s and "mode app" in s for s in summaries), err
            # error feedback on by default: one residual, the script's one gradient of 789,010 values (3.0 MiB)
            assert all("error feedback: 3.0 MiB of residuals" in s for s in summaries), summaries
    mean = {name: sum(d.values()) / len(d) for name, d in acc.items()}
    print(f"\nfinal test accuracy, seeds {SEEDS}:")
    for name, d in acc.items():
        print(f"  {name:<22} {'  '.join(f'{d[s]:.4f}' for s in SEEDS)}   mean {mean[name]:.4f} "
              f"({100 * (mean[name] - mean['uncompressed']):+.2f} points)")
    assert all(a > 0.9 for d in acc.values() for a in d.values()), acc
    assert mean["compressed (defaults)"] >= mean["uncompressed"] - 0.003
