"""``inceptionn bench scale``: the ring simulator's figures (the simulator's bits against real
rings: tests/test_collective.py::test_simulator_gives_the_bits_of_the_real_ring)."""
from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error, run_cli


def test_json_rows_and_the_precision_that_no_longer_falls_with_ranks():
    r = run_cli("bench", "scale", "--ranks", "2,4,16", "--values", "20000", "--codecs", "inceptionn,terngrad",
                "--sets", "heavy", "--block", "64,256", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {(x["codec"], x["variant"], x["block"], x["ranks"]): x for x in out["rows"]}
    assert len(rows) == len(out["rows"]) == 3 * (1 + 2 + 1) and all(x["set"] == "heavy" for x in out["rows"])
    assert "[bench scale] heavy N=16 inceptionn after 2^-10 block 256 headroom 0" in r.stderr   # progress
    assert {x["headroom"] for x in out["rows"] if x["variant"] == "after" and x["codec"] == "inceptionn"} == {0}
    for n in (2, 4, 16):
        before, after = rows[("inceptionn", "before", None, n)], rows[("inceptionn", "after", 256, n)]
        assert after["nmse"] < before["nmse"] / 10, (n, before, after)
        assert 1 < after["ratio"] < before["ratio"]
        assert rows[("inceptionn", "after", 64, n)]["nmse"] <= after["nmse"]    # smaller blocks: finer
        assert rows[("terngrad", "after", None, n)]["ratio"] > 10
    assert rows[("inceptionn", "before", None, 16)]["nmse"] > 0.3                # v1 fell with N ...
    assert rows[("inceptionn", "after", 256, 16)]["nmse"] < 0.02                 # ... v2 does not


def test_headroom_and_error_bound_dials():
    """Headroom h puts each block's max h octaves lower: fewer values in the codec's 16-bit tier
    (a better ratio), a coarser step for all of them (a larger error); likewise a larger bound."""
    r = run_cli("bench", "scale", "--ranks", "4", "--values", "20000", "--codecs", "inceptionn", "--sets", "heavy",
                "--after-only", "--headroom", "0,2", "--error-bound=-10,-6", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {(x["error_bound"], x["headroom"]): x for x in json.loads(r.stdout)["rows"]}
    assert set(rows) == {(-10, 0), (-10, 2), (-6, 0), (-6, 2)}
    for k in (-10, -6):
        assert rows[(k, 2)]["ratio"] > rows[(k, 0)]["ratio"] and rows[(k, 2)]["nmse"] > rows[(k, 0)]["nmse"]
    assert rows[(-6, 0)]["ratio"] > rows[(-10, 0)]["ratio"] and rows[(-6, 0)]["nmse"] > rows[(-10, 0)]["nmse"]


def test_text_table():
    r = run_cli("bench", "scale", "--ranks", "2,8", "--values", "5000", "--codecs", "inceptionn", "--sets", "heavy",
                timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ring simulated: 5000 values per rank")
    assert "N=2" in lines[1] and "N=8" in lines[1]
    assert [ln.split()[:3] for ln in lines[2:4]] == [["heavy", "inceptionn", "before"], ["heavy", "inceptionn", "after"]]


@pytest.mark.parametrize("args, needle", [
    (["--ranks", "1,4"], "--ranks must be integers in 2..1024"),
    (["--ranks", "2,x"], "--ranks takes comma-separated integers"),
    (["--codecs", "zip"], "--codecs: unknown zip"),
    (["--sets", "real,fake"], "--sets takes real, heavy"),
    (["--error-bound", "0"], "--error-bound must be integers in -30..-1"),
    (["--headroom", "-1"], "--headroom must be integers in 0..24"),
    (["--block", "0"], "--block must be integers in 1..65536"),
])
def test_bad_arguments_are_one_line(args, needle):
    assert_one_line_error(run_cli("bench", "scale", *args), needle)


def test_help_says_what_it_simulates():
    r = run_cli("bench", "scale", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for needle in ("simulated in one process", "same ring blocks, pipeline chunks and per-chunk transforms",
                   "--ranks", "--block", "--headroom", "before"):
        assert needle in text, needle
