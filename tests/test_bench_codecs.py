"""``inceptionn bench codecs``: every codec row on real gradients, with tiny settings.

One in-process run with --json (one captured gradient, one timing round) checks every row for
sane numbers; bad arguments give one line through the console script; a root-only run trains
with one codec inside the collective for one iteration to check the accuracy column end to end.
"""
from __future__ import annotations

import json
import math

import pytest

from cli_helpers import assert_one_line_error, run_cli
from netns_helpers import needs_root
from inceptionn.bench import codecs as bc
from inceptionn.bench.codecs_report import format_table
from inceptionn.cli import main
from inceptionn.errors import UserError


@pytest.fixture(scope="module")
def report():
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["bench", "codecs", "--captures", "2", "--rounds", "1", "--json"])
    assert rc == 0, err.getvalue()
    assert "[bench codecs]" in err.getvalue()          # progress on stderr, not in the JSON
    return json.loads(out.getvalue())


def test_every_row_has_sane_numbers(report):
    rows = {r["id"]: r for r in report["rows"]}
    assert list(rows) == ["float32"] + bc.ROW_IDS
    assert report["gradients"]["captures"] == 2 and report["gradients"]["params"] == 789010
    assert len(report["gradients"]["tensors"]) == 10
    for rid in bc.ROW_IDS:
        r = rows[rid]
        assert r["ratio"] > 1, r
        assert math.isfinite(r["nmse"]) and r["nmse"] >= 0, r
        for way in ("encode", "decode"):
            t = r[way]
            assert 0 < t["min_gbps"] <= t["gbps"] <= t["max_gbps"], (rid, way, t)
        assert (r["ef_sum_nmse"] is not None) == r["error_feedback"], r
        if r["error_feedback"]:
            assert math.isfinite(r["ef_sum_nmse"]) and r["ef_sum_nmse"] >= 0
        assert r["accuracy"] is None                    # no training asked for
        assert r["paper"]
    assert rows["float32"]["ratio"] == 1.0 and rows["float32"]["encode"]["gbps"] > 0
    # what the formats dictate, whatever the gradients
    assert rows["terngrad-2bit"]["ratio"] == pytest.approx(16, rel=0.01)
    assert rows["terngrad-base3"]["ratio"] == pytest.approx(20, rel=0.01)
    assert rows["3lc-nozre"]["ratio"] == pytest.approx(20, rel=0.01)
    assert rows["3lc-s1.0"]["ratio"] > rows["3lc-nozre"]["ratio"]   # ZRE only removes bytes
    assert rows["thc-nonuniform"]["ratio"] < 8                       # padding and header counted
    assert rows["fft"]["ratio"] < 21.3                               # the bitmap counted
    # the agreement values are counted: THC's norm; wire format v2 agrees on nothing, its exponents
    # ride in the stream: 34 bits (NO_COMPRESS) for each of a gradient's 3,083 blocks of 256 at least
    assert rows["thc-uniform"]["agreement_bytes"] == 2 * 8
    assert rows["inc-raw"]["agreement_bytes"] == rows["inc-scaled"]["agreement_bytes"] == 0
    assert rows["inc-scaled"]["wire_bytes"] >= 2 * (2 * 789010 + 34 * -(-789010 // 256)) / 8
    # the scale is exact and puts values into the codec's range: far less error than raw
    assert rows["inc-scaled"]["nmse"] < rows["inc-raw"]["nmse"] / 100
    # THC in the ring engine, 4 ranks summed without decoding: its codec time is reported (no bound on
    # it: speed is shown, not asserted) and the sum of 4 real gradients is close to the exact one
    ring = report["summed_ring"]
    assert (ring["row"], ring["ranks"], ring["values"], ring["calls"]) == ("thc-nonuniform", 4, 789010, 1)
    for key in ("codec_seconds", "call_cpu_seconds"):
        assert 0 < ring[key]["min"] <= ring[key]["median"] <= ring[key]["max"], ring
    assert 0 < ring["nmse"] < 0.1, ring


def test_text_table(report):
    text = format_table(report)
    for row in bc.ROWS:
        assert row.label in text
    assert "39.4x (Table 2)" in text and "21.3x" in text


def test_row_selection():
    assert [r.id for r in bc.select_rows("thc")] == ["thc-nonuniform", "thc-uniform"]
    assert [r.id for r in bc.select_rows("fft, 3lc-s1.5")] == ["3lc-s1.5", "fft"]
    assert len(bc.select_rows(None)) == len(bc.ROWS)
    for bad in ("zip", "", ","):
        with pytest.raises(UserError, match="--codecs"):
            bc.select_rows(bad)


def test_training_configs_cover_runnable_rows():
    import argparse

    args = argparse.Namespace(train_epochs=2, train_max_iters=None, data=None, seed=3)
    configs, index = bc.train_configs(bc.ROWS, args)
    assert configs[0].compress == "none"
    assert {c.compress for c in configs} == {"none", "inceptionn", "terngrad", "3lc", "thc", "fft"}
    raw = configs[index["inc-raw"]]
    assert raw.scaling is False and raw.error_feedback is False
    assert all(c.epochs == 2 and c.seed == 3 for c in configs)
    for c in configs:
        c.check()
    # rows differing losslessly borrow a run; the others have none
    configs, index = bc.train_configs(bc.select_rows("terngrad-base3,3lc-s1.9"), args)
    assert list(index) == ["baseline", "terngrad-2bit"]


@pytest.mark.parametrize("args,needle", [
    (["--rounds", "0"], "--rounds"),
    (["--captures", "0"], "--captures"),
    (["--codecs", "zip"], "unknown 'zip'"),
    (["--train-epochs", "-1"], "--train-epochs"),
    (["--data", "/nonexistent/mnist"], "does not exist"),
    (["--train-epochs", "1", "--train-hosts", "1"], "--train-hosts"),
])
def test_bad_arguments_are_one_line(args, needle):
    assert_one_line_error(run_cli("bench", "codecs", *args), needle)


@needs_root
def test_accuracy_column_from_a_real_training_run(tb_name, capsys):
    rc = main(["bench", "codecs", "--captures", "1", "--rounds", "1", "--codecs", "terngrad", "--json",
               "--train-epochs", "1", "--train-max-iters", "2", "--train-name", tb_name])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["id"]: r for r in report["rows"]}
    train = report["training"]
    assert set(train["runs"]) == {"baseline", "terngrad-2bit"}
    assert train["iterations"] == 2 and train["hosts"] == 4
    for run in train["runs"].values():
        assert run["replicas_identical"] and 0 <= run["final_accuracy"] <= 1
    assert rows["float32"]["accuracy"] == train["runs"]["baseline"]["final_accuracy"]
    assert rows["terngrad-2bit"]["accuracy"] == train["runs"]["terngrad-2bit"]["final_accuracy"]
    assert rows["terngrad-base3"]["accuracy"] == rows["terngrad-2bit"]["accuracy"]
    assert rows["terngrad-base3"]["accuracy_from"] == "terngrad-2bit"
