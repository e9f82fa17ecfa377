"""``inceptionn bench latency`` end to end on a small testbed: the OSU-style program under stock
OpenMPI and under the MPI_Allreduce library, every size on both sides; bad arguments give one
line."""
from __future__ import annotations

import json
import shutil

import pytest

from cli_helpers import assert_one_line_error, run_cli
from netns_helpers import needs_root


@needs_root
@pytest.mark.skipif(not shutil.which("mpicc"), reason="needs OpenMPI's mpicc")
def test_small_run_reports_both_sides(no_leaks, capsys):
    from inceptionn.cli import main
    rc = main(["bench", "latency", "--rates", "1gbit", "--hosts", "2", "--min-size", "4096", "--max-size", "524288",
               "--iterations", "3", "--warmup", "2", "--rounds", "1", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    runs = r["rates"]["1gbit"]
    sizes = [4096 << i for i in range(8)]
    for side in ("mpi", "library"):
        assert len(runs[side]) == 1 and sorted(map(int, runs[side][0])) == sizes, runs
        assert all(v > 0 for v in runs[side][0].values()), runs


def test_bad_arguments_are_one_line():
    assert_one_line_error(run_cli("bench", "latency", "--min-size", "8192", "--max-size", "4096"),
                          "4 <= --min-size <= --max-size")
