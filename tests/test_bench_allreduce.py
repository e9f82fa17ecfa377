"""``inceptionn bench allreduce`` end to end on a small testbed: our ring with and without the
soft NIC and gloo, real processes in namespaces; every rank must end with the same result (the
benchmark checks CRCs) and the compressed ring must stay close to the exact sum. Bad arguments
give one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cli_helpers import assert_one_line_error, run_cli
from netns_helpers import needs_root


@needs_root
def test_small_run_reports_every_allreduce(no_leaks, capsys):
    from inceptionn.cli import main
    rc = main(["bench", "allreduce", "--rates", "1gbit", "--sizes", "1", "--hosts", "3",
               "--scale-hosts", "2", "--scale-size", "1", "--impls", "ring,ring-nic,ring-app,ring-gso,ring-gso-v2,gloo",
               "--reps", "1", "--headroom", "0,2", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    link = r["links"][0]
    row = link["sizes"]["1"]
    assert set(row) == {"ring", "ring-nic", "ring-app", "ring-gso", "ring-gso-v2", "gloo",
                        "ring-nic/h2", "ring-app/h2", "ring-gso/h2", "ring-gso-v2/h2"}
    for impl, v in row.items():
        assert 0 < v["min"] <= v["median"] <= v["max"] < 60, (impl, v)
    assert row["ring"]["nmse"] < 1e-10 and row["gloo"]["nmse"] < 1e-10   # exact float32 sums
    assert 0 < row["ring-nic"]["nmse"] < 0.5                                # lossy, but the sum
    # compressing in the collective gives the same sum as in the NIC (the same codec, scaling and
    # error feedback on the same values; the NIC's reconstruction of a reconstruction is itself)
    assert row["ring-app"]["nmse"] == pytest.approx(row["ring-nic"]["nmse"], rel=1e-6)
    assert row["ring-gso"]["nmse"] == row["ring-nic"]["nmse"] == row["ring-gso-v2"]["nmse"]
    # the compression printed beside them is the ring's: ring-app's first call sent the simulated
    # codec bytes (plus a 4-byte length per payload) and got the simulated sum
    comp = link["compression"]["1"]
    assert row["ring-app"]["first_call_bytes"]["data"] == comp["v2"]["codec_bytes"] + 4 * comp["v2"]["payloads"]
    assert row["ring-app"]["nmse"] == pytest.approx(comp["v2"]["nmse"], rel=1e-9)
    assert comp["v1"]["ratio"] > comp["v2"]["ratio"] > 2
    # headroom 2: its own rows, the simulated figures at h = 2, fewer bytes for a larger error
    h2 = row["ring-app/h2"]
    assert h2["first_call_bytes"]["data"] == comp["v2/h2"]["codec_bytes"] + 4 * comp["v2/h2"]["payloads"]
    assert h2["nmse"] == pytest.approx(comp["v2/h2"]["nmse"], rel=1e-9) and h2["nmse"] > row["ring-app"]["nmse"]
    assert comp["v2/h2"]["ratio"] > comp["v2"]["ratio"]
    assert row["ring-gso/h2"]["nmse"] == row["ring-nic/h2"]["nmse"]
    # who compressed: the daemons for ring-nic (per packet) and ring-gso (super-packets), nobody else
    assert row["ring-nic"]["egress_compressed"] > 0 and row["ring-nic"]["gso_super_packets"] == 0
    supers = row["ring-gso"]["gso_super_packets"] + row["ring-gso"]["egress_trains"]   # v2 or v3 (trains)
    assert supers > 0 and row["ring-gso"]["egress_compressed"] >= supers and row["ring-gso"]["egress_trains"] > 0
    v2 = row["ring-gso-v2"]    # the daemons without trains: super-packets, each cut into v2 packets
    assert v2["egress_trains"] == 0 and v2["gso_super_packets"] > 0 and v2["egress_compressed"] > v2["gso_super_packets"]
    for impl in ("ring", "ring-app", "gloo"):
        assert row[impl]["egress_compressed"] == 0, (impl, row[impl])
    assert set(link["scaling"]["2"]) == {"ring-nic", "wa-nic"}


def test_compression_figures_are_what_the_ring_sends(tmp_path):
    """The compression bench allreduce prints (bench scale's simulator on the benchmark's own
    inputs) against a real ring on the same files: 3 ranks of Group.allreduce(compress="app") on
    loopback send exactly the simulated codec bytes plus a 4-byte length per payload and end with
    the simulated NMSE. The exponents' share is their count (one per 256 values of every chunk
    on every hop) at 34 bits over the codec bytes; v1 sends more zeros: a higher ratio, a far
    larger error."""
    from test_collective import run_ranks
    from inceptionn.bench import allreduce as ba
    from inceptionn.codecs import get_codec
    from inceptionn.collective.ring import block_bounds, chunk_list
    from inceptionn.train.gradients import capture_gradients
    world, n = 3, 200_003
    ba.write_inputs(str(tmp_path), world, 4 * n, capture_gradients(2))
    c = ba.compression(str(tmp_path), world, -10)

    def call(g, rank):
        x = np.load(tmp_path / f"grad{rank}.npy")
        out = g.allreduce(x, compress="app", codec=get_codec("inceptionn", error_bound=-10), error_feedback=False)
        return out, g.stats.last.bytes_sent["data"]
    res = run_ranks(world, call)
    sent = sum(b for _, b in res)
    assert sent == c["v2"]["codec_bytes"] + 4 * c["v2"]["payloads"]
    exact = np.load(tmp_path / "exact.npy")
    err = res[0][0].astype(np.float64) - exact
    assert c["v2"]["nmse"] == pytest.approx(err @ err / (exact @ exact), rel=1e-12)
    assert c["float32_bytes"] == 4 * n * 2 * (world - 1)
    assert ba.measured_ratio(c, {"first_call_bytes": {"data": sent}}) == c["float32_bytes"] / sent
    exps = sum(-(-(e - a) // 256) for lo, hi in block_bounds(n, world) for a, e in chunk_list(lo, hi, ba.CHUNK_VALUES))
    assert c["v2"]["exponent_share"] == pytest.approx(2 * (world - 1) * exps * 34 / 8 / c["v2"]["codec_bytes"])
    assert 0 < c["v2"]["exponent_share"] < 0.03
    assert c["v1"]["ratio"] > c["v2"]["ratio"] > 2 and c["v1"]["nmse"] > 10 * c["v2"]["nmse"]
    line = ba.compression_line(c, -10, {"first_call_bytes": {"data": sent}})
    assert f"{c['v2']['ratio']:.2f}x" in line and f"{c['v1']['ratio']:.2f}x" in line, line


@needs_root
def test_ddp_compress_hooks_beside_gloo(no_leaks, capsys):
    """gloo-fp16 and gloo-bf16 run torch's own DDP hooks over gloo on the testbed: each returns
    the mean, which times the ranks is the float64 sum within what 16-bit values carry (fp16:
    11 significant bits, bf16: 8; a few roundings per value along gloo's ring), bf16 the
    coarser; and the printed table shows them beside gloo and the compressing ring."""
    from inceptionn.bench import allreduce as ba
    from inceptionn.cli import main
    rc = main(["bench", "allreduce", "--rates", "1gbit", "--sizes", "1", "--hosts", "3", "--scale-hosts", "",
               "--impls", "gloo,gloo-fp16,gloo-bf16,ring-app", "--reps", "1", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    row = r["links"][0]["sizes"]["1"]
    assert row["gloo"]["nmse"] < 1e-10
    assert 0 < row["gloo-fp16"]["nmse"] < 1e-5
    assert row["gloo-fp16"]["nmse"] < row["gloo-bf16"]["nmse"] < 1e-3
    for impl in ("gloo-fp16", "gloo-bf16"):
        v = row[impl]
        assert 0 < v["min"] <= v["median"] <= v["max"] < 60 and v["egress_compressed"] == 0, (impl, v)
    ba.print_report(r)
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.lstrip().startswith("MiB"))
    assert head.split()[1:5] == ["gloo", "gloo-fp16", "gloo-bf16", "ring-app"], head
    for peer in ("gloo", "gloo-fp16", "gloo-bf16"):
        x = row[peer]["median"] / row["ring-app"]["median"]
        assert f"faster than {peer}: ring-app {x:.2f}x" in out, out


@needs_root
def test_ring_app_runs_other_codecs(no_leaks, capsys):
    """ring-app+CODEC is the same ring with another codec inside the collective: TernGrad's
    2 bits per value put fewer bytes on the wire than INCEPTIONN's tiers, with a larger error."""
    from inceptionn.cli import main
    rc = main(["bench", "allreduce", "--rates", "1gbit", "--sizes", "1", "--hosts", "2", "--scale-hosts", "",
               "--impls", "ring-app,ring-app+terngrad", "--reps", "1", "--json"])
    assert rc == 0
    row = json.loads(capsys.readouterr().out)["links"][0]["sizes"]["1"]
    inc, tern = row["ring-app"], row["ring-app+terngrad"]
    assert 0 < inc["nmse"] < 1e-3 < tern["nmse"] < 2, (inc["nmse"], tern["nmse"])
    sent = {k: v["first_call_bytes"]["data"] for k, v in row.items()}
    assert 0 < sent["ring-app+terngrad"] < 0.5 * sent["ring-app"], sent


@needs_root
def test_mpi_library_beside_stock_mpi(no_leaks, capsys):
    """The same unmodified mpi4py program: OpenMPI alone (exact), and through the MPI_Allreduce
    library in nic mode (the daemons compressed) and in app mode (nobody else did)."""
    from inceptionn.cli import main
    rc = main(["bench", "allreduce", "--rates", "1gbit", "--sizes", "1", "--hosts", "3", "--scale-hosts", "",
               "--impls", "mpi,mpi-nic,mpi-app", "--reps", "1", "--json"])
    assert rc == 0
    row = json.loads(capsys.readouterr().out)["links"][0]["sizes"]["1"]
    assert row["mpi"]["nmse"] < 1e-10
    assert 0 < row["mpi-nic"]["nmse"] < 0.5 and row["mpi-app"]["nmse"] == pytest.approx(row["mpi-nic"]["nmse"], rel=1e-4)
    assert row["mpi-nic"]["egress_compressed"] > 0
    assert row["mpi"]["egress_compressed"] == 0 and row["mpi-app"]["egress_compressed"] == 0


@needs_root
def test_threshold_sweep(no_leaks, capsys):
    """--sweep: stock MPI_Allreduce and the library taking every count (even 1,000 values, far
    below its default threshold), timed per count, with a crossover per library mode."""
    from inceptionn.cli import main
    rc = main(["bench", "allreduce", "--sweep", "--rates", "1gbit", "--counts", "1000,70000", "--hosts", "3",
               "--reps", "2", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["counts"] == [1000, 70000] and r["impls"] == ["mpi", "mpi-nic", "mpi-app"] and r["reps"] == 2
    link = r["links"][0]
    for count in ("1000", "70000"):
        for impl, v in link["counts"][count].items():
            assert len(v["seconds"]) == 2 and 0 < v["min"] <= v["median"] <= v["max"] < 60, (count, impl, v)
    assert set(link["crossover"]) == {"mpi-nic", "mpi-app"}
    assert all(c in (None, 1000, 70000) for c in link["crossover"].values())


@pytest.mark.parametrize("args,needle", [
    (["--sweep", "--impls", "mpi,ring"], "--sweep measures MPI_Allreduce only"),
    (["--counts", "1000"], "--counts goes with --sweep"),
    (["--sweep", "--counts", "0"], "--counts: numbers of values"),
    (["--impls", "ring,carrier-pigeon"], "unknown 'carrier-pigeon'"),
    (["--impls", "ring+thc"], "--impls ring+thc: a codec goes after ring-app only"),
    (["--impls", "ring-app+zip"], "--impls ring-app+zip: a codec goes after ring-app only, one of 3lc"),
    (["--rates", "fast"], "fast"),
    (["--sizes", "ten"], "--sizes"),
    (["--hosts", "1"], "hosts must be"),
    (["--headroom", "25"], "--headroom: distinct integers in 0..24"),
    (["--sweep", "--headroom", "0,1"], "--headroom goes with the size runs"),
])
def test_bad_arguments_give_one_line(args, needle):
    assert_one_line_error(run_cli("bench", "allreduce", *args), needle)


def test_default_set_runs_the_daemons_default_gso():
    r = run_cli("bench", "allreduce", "--help")
    assert r.returncode == 0
    # argparse wraps at hyphens too
    assert "(defaultring,ring-gso,gloo,gloo-fp16,gloo-bf16,mpi)" in "".join(r.stdout.split())


def test_report_of_a_run_without_every_hook(capsys):
    """The text report of a run whose --impls leave out one of DDP's hooks (gloo-bf16) compares
    each compressing ring with the peers that ran, and with nothing else (it raised KeyError)."""
    from inceptionn.bench.allreduce import print_report

    cell = {"median": 0.4, "min": 0.3, "max": 0.5, "nmse": 2e-4}
    row = {"ring-gso": cell, "gloo": {**cell, "median": 0.33, "nmse": 1e-15},
           "gloo-fp16": {**cell, "median": 0.19, "nmse": 1e-7}}
    print_report({"dataset": "digits", "error_bound": -10, "mtu": 1500, "rounds": 1, "reps": 1, "scale_size": 25,
                  "impls": list(row), "links": [{"rate": "1gbit", "world": 4, "sizes": {"25": row}, "scaling": {}}]})
    out = capsys.readouterr().out
    assert "faster than gloo: ring-gso 0.82x" in out and "faster than gloo-fp16: ring-gso 0.47x" in out, out
    assert "faster than gloo-bf16" not in out
