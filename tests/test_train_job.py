"""Data-parallel training on the namespace testbed: real workers, real collectives, real soft NICs.

Small runs (a few iterations on digits) that check what the launcher promises: accuracy recorded,
a time breakdown that adds up, fewer bytes on the wire than the workers wrote when the soft NIC
compresses, bit-identical replicas, one-line errors, and a testbed that is gone afterwards, also
after Ctrl-C. Needs root for everything that builds a testbed.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from cli_helpers import CLI, assert_one_line_error, run_cli
from netns_helpers import needs_root
from inceptionn.errors import UserError
from inceptionn.kernel_tc import netns as ns
from inceptionn.train import worker
from inceptionn.train.job import RunResult, TrainConfig, TrainingTestbed
from inceptionn.train.report import comparison_rows, format_table

PARTS = ("compute", "communicate", "sum", "codec")


# --- no root needed ----------------------------------------------------------------------------

def test_config_names_and_checks():
    assert TrainConfig(algo="wa").name == "WA"
    assert TrainConfig(algo="wa", compress="nic").name == "WA+C"
    assert TrainConfig(algo="inc").name == "INC"
    assert TrainConfig(algo="inc", compress="nic").name == "INC+C"
    assert TrainConfig(compress="nic", scaling=False).name == "INC+C (no scaling)"
    assert TrainConfig(compress="nic", scaling=False, error_feedback=False).name == "INC+C (no scaling, no EF)"
    assert TrainConfig(compress="terngrad").name == "INC+terngrad"
    assert TrainConfig(compress="terngrad", error_feedback=True).name == "INC+terngrad +EF"
    assert TrainConfig(algo="ddp").name == "DDP" and TrainConfig(algo="ddp", compress="fp16").name == "DDP fp16 hook"
    TrainConfig(algo="ddp", compress="powersgd-r4").check()
    for bad, needle in [(dict(algo="ps"), "unknown algorithm"), (dict(compress="zip"), "unknown compression"),
                        (dict(epochs=0), "--epochs"), (dict(max_iters=0), "--max-iters"),
                        (dict(error_bound=3), "--error-bound"), (dict(lr=0), "--lr"),
                        (dict(epochs=2, decay_at=3), r"--decay-at must be an epoch from 1 to --epochs \(2\)"),
                        (dict(decay_at=0), "--decay-at"), (dict(batch=0), "--batch must be at least 1"),
                        (dict(warmup=-1), "--warmup-iters must be 0 or more"),
                        (dict(algo="ddp", compress="nic"),
                         "ddp runs DDP's hooks: --compress none, fp16, bf16, powersgd-r1, powersgd-r4"),
                        (dict(compress="fp16"), "unknown compression")]:
        with pytest.raises(UserError, match=needle):
            TrainConfig(**bad).check()


def test_time_to_accuracy_on_hand_made_curves():
    from inceptionn.bench.train import time_to_accuracy, time_to_accuracy_rows

    assert time_to_accuracy([0.5, 0.8, 0.9, 0.95], 0.9, 2.0) == 6.0      # epoch 3, 2 s each
    assert time_to_accuracy([0.95, 0.5], 0.9, 3.0) == 3.0                # first reach counts
    assert time_to_accuracy([0.5, 0.89], 0.9, 1.0) is None               # never
    assert time_to_accuracy([], 0.0, 1.0) is None

    def run(name, seed, accs, per_iter):
        return RunResult(config={"seed": seed}, name=name, hosts=2, rate=None, mtu=1500, dataset="d", iters_per_epoch=10,
                         iterations=10 * len(accs), accuracy=accs, final_accuracy=accs[-1],
                         replicas_identical=True, replicas=[], times={"iteration": per_iter},
                         train_seconds=1.0, wall_seconds=1.0, bytes={})

    # INC ends at 0.90 over seeds: the target is 0.897. X's mean curve 0.80, 0.898: epoch 2 at
    # 0.05 s/iteration = 1.0 s, though seed 1 alone reaches it at epoch 1; Y's mean stays below.
    res = [run("INC", 0, [0.7, 0.91], 0.1), run("INC", 1, [0.7, 0.89], 0.1),
           run("X", 0, [0.70, 0.896], 0.05), run("X", 1, [0.90, 0.900], 0.05),
           run("Y", 0, [0.8, 0.896], 0.01)]
    tta = time_to_accuracy_rows(res)
    assert tta["baseline"] == "INC" and tta["target"] == pytest.approx(0.897)
    rows = {r["name"]: r for r in tta["rows"]}
    assert rows["INC"]["seconds"] == pytest.approx(2.0) and rows["INC"]["epoch"] == 2
    assert rows["X"]["seconds"] == pytest.approx(1.0) and rows["X"]["curve"] == pytest.approx([0.8, 0.898])
    assert rows["Y"]["seconds"] is None and rows["Y"]["epoch"] is None

    # another link's time per iteration: the same epochs, that link's seconds; Y was not timed
    at = time_to_accuracy_rows(res, per_iteration={"INC": 0.5, "X": 0.2})
    rows = {r["name"]: r for r in at["rows"]}
    assert at["target"] == pytest.approx(0.897) and set(rows) == {"INC", "X"}
    assert rows["INC"]["seconds"] == pytest.approx(10.0) and rows["X"]["seconds"] == pytest.approx(4.0)


def test_bench_train_reprints_a_saved_json_report(tmp_path):
    """`bench train --report FILE` prints the tables of the report its --json wrote, runs nothing
    (no testbed: no root needed), and a file that is not such a report is one clear error."""
    from inceptionn.bench.train import build_report

    res = [_fake("INC", 0, 0.5, 0.4, 0.92), _fake("INC", 1, 0.5, 0.4, 0.94),
           _fake("INC+C", 0, 0.2, 0.1, 0.93), _fake("INC+C", 1, 0.2, 0.1, 0.95)]
    report = build_report({"dataset": "digits", "hosts": 4, "rate": "100mbit", "mtu": 9000, "epochs": 1,
                           "iters_per_epoch": 15, "seeds": [0, 1], "error_bound": -10, "time_iters": 30},
                          res, [], {"1gbit": {"INC": 0.1, "INC+C": 0.04}})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    proc = run_cli("bench", "train", "--report", str(path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "HDC on digits, 4 hosts, 100mbit links (MTU 9000)" in out and "seeds 0, 1" in out
    assert any(line.startswith("INC+C") and "94.00%" in line and "+1.00" in line for line in out.splitlines()), out
    assert "Time to accuracy at 1gbit" in out
    assert any(line.startswith("INC+C") and "40.0 ms/iteration" in line for line in out.splitlines()), out

    (tmp_path / "other.json").write_text(json.dumps({"rounds": 1}))
    assert_one_line_error(run_cli("bench", "train", "--report", str(tmp_path / "other.json")),
                          "is not what 'inceptionn bench train --json' writes")
    assert_one_line_error(run_cli("bench", "train", "--report", str(tmp_path / "none.json")), "cannot read")


def test_bench_train_config_syntax():
    from inceptionn.bench.train import config_spec, parse_configs

    assert config_spec("inc+c") == ("inc", "nic", None, None, 0)
    assert config_spec("inc+c@h2") == ("inc", "nic", None, None, 2)
    assert config_spec("inc+thc") == ("inc", "thc", None, None, 0)
    assert config_spec("wa+terngrad") == ("wa", "terngrad", None, None, 0)
    assert config_spec("inc+inceptionn@h1") == ("inc", "inceptionn", None, None, 1)
    assert config_spec("ddp-fp16") == ("ddp", "fp16", None, None, 0)
    assert config_spec("inc+terngrad@ef") == ("inc", "terngrad", None, True, 0)
    assert config_spec("inc+c@h3@noef") == ("inc", "nic", None, False, 3)
    # headroom only where the wire is scaled, error feedback only on a lossy ring; unknown codecs,
    # junk after @h and repeated or contradicting modifiers are unknown entries
    for bad in ("inc+thc@h1", "ddp-fp16@h1", "inc+zip", "inc+c@h", "inc+c@hx", "ps+thc", "inc+c@h-1",
                "inc@ef", "ddp-fp16@noef", "inc+c@ef@noef", "inc+c@h1@h2", "inc+c@", "inc+thc@fast"):
        assert config_spec(bad) is None, bad
    assert parse_configs("INC, inc+c@h2 ,inc") == ["inc", "inc+c@h2"]
    with pytest.raises(UserError, match="unknown inc\\+thc@h1; choose .* @hN"):
        parse_configs("inc,inc+thc@h1")
    with pytest.raises(UserError, match="--configs inc\\+c@h99: headroom must be an integer"):
        parse_configs("inc+c@h99")


def test_shards_are_disjoint_and_equal():
    shards = [worker.shard_indices(1438, r, 4, seed=3) for r in range(4)]
    assert {len(s) for s in shards} == {359}
    assert len(np.unique(np.concatenate(shards))) == 4 * 359
    assert np.array_equal(shards[1], worker.shard_indices(1438, 1, 4, seed=3))
    assert worker.iterations_per_epoch(1438, 4, 25, None) == 15
    assert worker.iterations_per_epoch(1438, 4, 25, 4) == 4


def test_warmup_rises_linearly_to_the_rate():
    assert [worker.warmup_lr(0.1, k, 4) for k in (1, 2, 4, 5, 100)] == pytest.approx([0.025, 0.05, 0.1, 0.1, 0.1])
    assert worker.warmup_lr(0.1, 1, 0) == 0.1


def _fake(name, seed, it, comm, acc):
    algo, _, c = name.partition("+")
    return RunResult(config={"seed": seed, "algo": algo.lower()}, name=name, hosts=4, rate="100mbit", mtu=9000,
                     dataset="digits", iters_per_epoch=15, iterations=15, accuracy=[acc], final_accuracy=acc,
                     replicas_identical=True, replicas=[],
                     times={"compute": 0.01, "communicate": comm, "sum": 0.001, "codec": 0.0, "iteration": it},
                     train_seconds=1.0, wall_seconds=2.0, bytes={"wire_per_iteration": 1e6})


def test_table_reduction_and_speedup():
    rows = {r["name"]: r for r in comparison_rows([_fake("WA", 0, 1.0, 0.9, 0.9), _fake("INC", 0, 0.5, 0.4, 0.92),
                                                   _fake("INC", 1, 0.5, 0.5, 0.94)])}
    assert rows["INC"]["runs"] == 2 and rows["INC"]["accuracy"] == pytest.approx(0.93)
    assert rows["INC"]["comm_reduction"] == pytest.approx(0.5)
    assert rows["INC"]["speedup"] == pytest.approx(2.0)
    text = format_table([_fake("WA", 0, 1.0, 0.9, 0.9), _fake("INC", 0, 0.5, 0.45, 0.92)])
    assert "-50.0%" in text and "2.00x" in text
    # the demo: times of one short run, accuracy of whole runs over seeds
    [row] = comparison_rows([_fake("WA", 0, 1.0, 0.9, 0.1)],
                            accuracy_runs=[_fake("WA", 0, 9.0, 9.0, 0.9), _fake("WA", 1, 9.0, 9.0, 0.94)])
    assert row["iteration"] == 1.0 and row["runs"] == 1 and row["accuracy_runs"] == 2 and row["seeds"] == [0, 1]
    assert row["accuracy"] == pytest.approx(0.92) and row["accuracy_min"] == 0.9 and row["accuracy_max"] == 0.94


# --- real runs -----------------------------------------------------------------------------------

def _check_breakdown(r):
    t = r.times
    assert all(t[k] >= 0 for k in PARTS)
    total = sum(t[k] for k in PARTS)
    # the parts are measured inside the iteration; what is left is bookkeeping between them
    assert total == pytest.approx(t["iteration"], rel=0.05, abs=0.003), t
    assert t["communicate"] > 0 and t["compute"] > 0


@needs_root
def test_small_runs_on_the_soft_nic(tb_name, no_leaks):
    with TrainingTestbed(hosts=3, rate="100mbit", mtu=9000, name=tb_name) as bed:
        events = []
        runs = {}
        for cfg in (TrainConfig(algo="inc", compress="nic", epochs=2, max_iters=3),
                    TrainConfig(algo="inc", compress="none", epochs=1, max_iters=3),
                    TrainConfig(algo="wa", compress="nic", epochs=1, max_iters=3)):
            runs[cfg.name] = bed.run(cfg, lambda c, e: events.append((c.name, e)))
        assert ns.list_netns(f"inc-{tb_name}-")   # still up between runs
    inc_c, inc, wa_c = runs["INC+C"], runs["INC"], runs["WA+C"]

    for r in runs.values():
        assert r.hosts == 3 and r.dataset == "digits"
        assert r.replicas_identical and len({x["checksum"] for x in r.replicas}) == 1
        assert len({x["final_accuracy"] for x in r.replicas}) == 1
        assert 0.0 <= r.final_accuracy <= 1.0
        _check_breakdown(r)
    assert len(inc_c.accuracy) == 2 and inc_c.iterations == 6 and inc_c.final_accuracy == inc_c.accuracy[-1]
    assert [e["epoch"] for n, e in events if n == "INC+C" and e["event"] == "epoch"] == [1, 2]

    # compressed: the soft NICs shrank the tagged payload, and the links carried less than the
    # workers wrote; uncompressed: no daemon, the links carried at least what was written
    nic = inc_c.bytes["nicd"]
    assert nic["egress_compressed"] > 0 and nic["egress_wire_bytes"] < nic["egress_orig_bytes"]
    assert nic["ratio"] > 2 and not nic["drops"]
    assert inc_c.bytes["wire_tx"] < inc_c.bytes["app_sent"]
    assert "nicd" not in inc.bytes and inc.bytes["wire_tx"] >= inc.bytes["app_sent"]
    assert inc_c.bytes["wire_per_iteration"] < inc.bytes["wire_per_iteration"] / 2
    # WA+C compresses the gradient leg only: the weights come back raw
    assert wa_c.bytes["nicd"]["egress_wire_bytes"] < wa_c.bytes["nicd"]["egress_orig_bytes"]
    assert wa_c.bytes["wire_per_iteration"] > inc_c.bytes["wire_per_iteration"]


@needs_root
def test_defaults_train_as_well_as_uncompressed(tb_name, no_leaks):
    """``inceptionn train --compress nic`` at its defaults (wire format v2, error feedback on)
    against the same run uncompressed: 4 hosts, seed 0, 10 epochs with the rate decayed from
    epoch 8 (81 s at load 20). The two runs start from the same weights and data order; the
    compressed one must end within 2 points of the uncompressed one (mean of the last 3 epochs),
    the soft NICs having compressed. A guard against lost precision, which costs tens of points
    (issue 29: wire format v1 on 16 ranks ended at 35% against 97.8%), not a test of the issue's
    0.3-point bound: one seed moves a run by about a point, so that bound takes several seeds
    (docs/collectives.md, "Error feedback's default, measured", has inceptionn train's)."""
    runs = {}
    with TrainingTestbed(hosts=4, rate=None, mtu=9000, name=tb_name) as bed:
        for compress in ("none", "nic"):
            runs[compress] = bed.run(TrainConfig(algo="inc", compress=compress, epochs=10, decay_at=8), lambda c, e: None)
    plain, comp = runs["none"], runs["nic"]
    print({k: [round(100 * a, 2) for a in r.accuracy] for k, r in runs.items()})
    assert plain.replicas_identical and comp.replicas_identical
    nic = comp.bytes["nicd"]
    assert nic["egress_compressed"] > 0 and nic["ratio"] > 2 and not nic["drops"], nic
    last = {k: sum(r.accuracy[-3:]) / 3 for k, r in runs.items()}
    assert last["none"] > 0.7, plain.accuracy                      # the baseline learned (chance: 0.1)
    assert abs(last["nic"] - last["none"]) <= 0.02, (comp.accuracy, plain.accuracy)


def test_noise_seeds_come_from_the_run_seed_and_the_rank():
    """A stochastic codec's rounding seed: the same for the same (seed, rank), another per rank
    and per seed; THC's shared rotation seed is left alone (its noise has a seed of its own)."""
    assert worker.noise_seeds("terngrad", 3, 1) == worker.noise_seeds("terngrad", 3, 1)
    assert len({worker.noise_seeds("terngrad", s, r)["seed"] for s in (0, 1) for r in range(4)}) == 8
    assert set(worker.noise_seeds("thc", 0, 1)) == {"noise_seed"}
    assert worker.noise_seeds("inceptionn", 0, 1) == {} == worker.noise_seeds("3lc", 0, 1)


@needs_root
def test_stochastic_codecs_repeat_with_the_seed(tb_name, no_leaks):
    """TernGrad and THC round at random inside the ring: two runs of one seed end with the same
    parameters bit for bit (so bench train's seeds mean something for them too), another seed
    with others. Each worker's codec drew from OS entropy before, and runs of one seed differed."""
    runs = {}
    with TrainingTestbed(hosts=3, rate=None, mtu=9000, name=tb_name) as bed:
        for codec in ("terngrad", "thc"):
            for seed in (0, 0, 1):
                r = bed.run(TrainConfig(algo="inc", compress=codec, epochs=2, max_iters=8, seed=seed),
                            lambda c, e: None)
                assert r.replicas_identical, r.replicas
                runs.setdefault(codec, []).append((r.replicas[0]["checksum"], r.accuracy))
    for codec, (a, b, other) in runs.items():
        assert a == b, (codec, a, b)
        assert other[0] != a[0], (codec, other, a)


@needs_root
def test_demo_recipe_trains_stably(tb_name, no_leaks):
    """The demo's recipe (lr 0.1, momentum 0.9, warm-up over 30 iterations) on the uncompressed
    ring, 4 hosts, seed 0, 10 epochs of digits: no epoch's test accuracy below the first's, and
    above 90% at the end; the paper's recipe without the warm-up falls below its first epoch
    (59% to 25% at epoch 3 when this was written). Deterministic: the same seed gives the same
    values on every run."""
    from inceptionn.demo import DEFAULT_WARMUP
    runs = {}
    with TrainingTestbed(hosts=4, rate=None, mtu=9000, name=tb_name) as bed:
        for warmup in (DEFAULT_WARMUP, 0):
            runs[warmup] = bed.run(TrainConfig(algo="inc", epochs=10, warmup=warmup), lambda c, e: None).accuracy
    print(runs)
    warm, cold = runs[DEFAULT_WARMUP], runs[0]
    assert min(warm) == warm[0] and warm[-1] > 0.9, warm
    assert min(cold[1:]) < cold[0], cold


def _stream_lines(proc) -> "queue.Queue[str]":
    q: queue.Queue = queue.Queue()

    def pump():
        for line in iter(proc.stderr.readline, ""):
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q, needle: str, timeout: float, seen: list) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            raise AssertionError("process ended before: " + needle + "\n" + "\n".join(seen))
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"no {needle!r} within {timeout} s:\n" + "\n".join(seen))


def _interrupt_and_check(args: list[str], ready: str, tb: str) -> list[str]:
    proc = subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen: list[str] = []
    try:
        q = _stream_lines(proc)
        _wait_for(q, ready, 120, seen)
        hosts = ns.list_netns(f"inc-{tb}-h")
        pids = [p for h in hosts for p in ns.pids(h)]
        assert pids, "nothing runs in the testbed hosts"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        while (line := q.get(timeout=10)) is not None:
            seen.append(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, seen)
    assert seen[-1] == "inceptionn: interrupted", seen
    assert not any("Traceback" in line for line in seen), seen
    assert ns.list_netns(f"inc-{tb}-") == []
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not alive, f"processes of the testbed still running: {alive}"
    return seen


@needs_root
def test_ctrl_c_tears_down_training_with_daemons(tb_name, no_leaks):
    seen = _interrupt_and_check(["train", "--hosts", "2", "--compress", "nic", "--epochs", "1", "--max-iters", "100000",
                                 "--name", tb_name], "INC+C: 2 workers", tb_name)
    assert any("starting the soft NIC" in line for line in seen)


@needs_root
def test_ddp_hooks_put_16_bit_gradients_on_the_wire(tb_name, no_leaks):
    """--algo ddp runs torch's DDP hooks over gloo on the testbed: without a hook the links carry
    what the uncompressed ring carries (float32 both ways), with the fp16 hook about half; the
    replicas end identical."""
    runs = {}
    with TrainingTestbed(hosts=3, rate=None, mtu=9000, name=tb_name) as bed:
        for algo, compress in (("inc", "none"), ("ddp", "none"), ("ddp", "fp16"), ("ddp", "bf16")):
            r = bed.run(TrainConfig(algo=algo, compress=compress, epochs=1, max_iters=3), lambda c, e: None)
            runs[r.name] = r
    assert set(runs) == {"INC", "DDP", "DDP fp16 hook", "DDP bf16 hook"}
    for r in runs.values():
        assert r.replicas_identical and r.iterations == 3, r.name
        _check_breakdown(r)
    wire = {k: r.bytes["wire_per_iteration"] for k, r in runs.items()}
    params = 4 * 789_010   # float32 bytes of the model's gradient
    assert wire["DDP"] == pytest.approx(wire["INC"], rel=0.1), wire
    assert wire["DDP"] > 2 * (3 - 1) / 3 * params * 3, wire   # a ring allreduce: 2(N-1)/N of it per host
    for hook in ("DDP fp16 hook", "DDP bf16 hook"):
        assert 0.4 < wire[hook] / wire["DDP"] < 0.6, wire


@needs_root
def test_ddp_powersgd_hook_trains_on_fewer_bytes(tb_name, no_leaks):
    """torch's powerSGD_hook at rank 1 and 4: plain allreduce for its warm-up (2 of 20
    iterations here), then P and Q factors per weight matrix; it trains (accuracy twice
    digits' 10% chance), the replicas end identical, and over the whole run the links carry less
    than a third of uncompressed DDP's bytes, rank 1 less than rank 4."""
    from inceptionn.train.torch_hooks import powersgd_start_iter

    assert powersgd_start_iter(20) == 2 and powersgd_start_iter(1000) == 100
    runs = {}
    with TrainingTestbed(hosts=3, rate=None, mtu=9000, name=tb_name) as bed:
        for compress in ("none", "powersgd-r1", "powersgd-r4"):
            r = bed.run(TrainConfig(algo="ddp", compress=compress, epochs=1, max_iters=20), lambda c, e: None)
            runs[r.name] = r
    assert set(runs) == {"DDP", "DDP powersgd-r1 hook", "DDP powersgd-r4 hook"}
    wire = {k: r.bytes["wire_per_iteration"] for k, r in runs.items()}
    for name, r in runs.items():
        assert r.replicas_identical and r.iterations == 20, name
        assert r.final_accuracy > 0.2, (name, r.final_accuracy)
        _check_breakdown(r)
    assert wire["DDP powersgd-r1 hook"] < wire["DDP powersgd-r4 hook"] < wire["DDP"] / 3, wire


@needs_root
def test_demo_end_to_end(tb_name, no_leaks, tmp_path):
    """The demo's parts on a short run: timed runs on shaped links (the five configurations),
    whole runs over two seeds for the accuracy, the lines that judge it, the chart."""
    out = tmp_path / "demo.png"
    proc = run_cli("demo", "--hosts", "2", "--epochs", "2", "--timed-epochs", "1", "--max-iters", "3",
                   "--seeds", "2", "--name", tb_name, "--out", str(out), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    rows = {row["name"]: row for row in r["rows"]}
    assert list(rows) == ["WA", "WA+C", "INC", "INC+C", "DDP fp16 hook"]
    for row in rows.values():
        assert row["runs"] == 1 and row["accuracy_runs"] == 2 and row["seeds"] == [0, 1], row
        assert row["replicas_identical"]
    assert [t["iterations"] for t in r["timed"]] == [3] * 5 and [t["rate"] for t in r["timed"]] == ["100mbit"] * 5
    assert len(r["runs"]) == 10 and {t["rate"] for t in r["runs"]} == {None}
    assert all(len(t["accuracy"]) == 2 for t in r["runs"])
    inc = [t["final_accuracy"] for t in r["runs"] if t["name"] == "INC"]
    assert rows["INC"]["accuracy"] == pytest.approx(sum(inc) / 2)
    assert r["fell"] == [f"{t['name']} seed {t['config']['seed']}" for t in r["runs"] if min(t["accuracy"]) < t["accuracy"][0]]
    assert rows["DDP fp16 hook"]["wire_per_iteration"] < 0.6 * rows["INC"]["wire_per_iteration"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # progress went to stderr, one line per milestone
    assert "WA+C: epoch 1/1: test accuracy" in proc.stderr and "WA+C: epoch 2/2: test accuracy" in proc.stderr
    assert "tearing down" in proc.stderr and "Traceback" not in proc.stderr


@needs_root
def test_demo_without_torch_skips_the_fp16_hook(tb_name, no_leaks, tmp_path):
    """Where torch cannot be imported (a package named torch that fails to import comes first on
    the path), the demo runs the paper's four configurations and says why the fifth is missing."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no torch in this test')\n")
    out = tmp_path / "demo.png"
    proc = subprocess.run([CLI, "demo", "--hosts", "2", "--epochs", "1", "--timed-epochs", "1", "--max-iters", "2",
                           "--seeds", "1", "--name", tb_name, "--out", str(out)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert proc.returncode == 0, proc.stderr
    assert "PyTorch is not installed: the DDP fp16 hook column is skipped" in proc.stderr
    table = proc.stdout.split("\n\n")[0]
    assert "INC+C" in table and "DDP" not in table, proc.stdout
    assert "(skipped: no PyTorch)" in proc.stdout and out.exists()


@needs_root
def test_demo_ctrl_c_tears_down(tb_name, no_leaks, tmp_path):
    out = tmp_path / "demo.png"
    _interrupt_and_check(["demo", "--hosts", "2", "--epochs", "1", "--max-iters", "100000", "--name", tb_name,
                          "--out", str(out)], "WA: 2 workers", tb_name)
    assert not out.exists()


@needs_root
def test_divergence_is_one_clear_error(tb_name, no_leaks):
    proc = run_cli("train", "--hosts", "2", "--lr", "1e7", "--epochs", "1", "--max-iters", "10",
                   "--name", tb_name, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("inceptionn: error: INC: training diverged"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert ns.list_netns(f"inc-{tb_name}-") == []


@needs_root
@pytest.mark.parametrize("args,needles", [
    (["train", "--data", "/nonexistent/mnist"], ["does not exist"]),
    (["train", "--compress", "zip"], ["unknown compression", "nic"]),
    (["train", "--hosts", "1"], ["--hosts must be at least 2"]),
    (["train", "--epochs", "0"], ["--epochs must be at least 1"]),
    (["train", "--epochs", "3", "--decay-at", "4"], ["--decay-at must be an epoch from 1 to --epochs (3)"]),
    (["train", "--batch", "0"], ["--batch must be at least 1"]),
    (["demo", "--out", "/nonexistent/dir/x.png"], ["does not exist"]),
    (["bench", "train", "--configs", "inc,bogus"], ["unknown bogus"]),
    (["bench", "train", "--time-at", "100mbit,fast"], ["--time-at: bad rate 'fast'"]),
])
def test_user_errors_are_one_line(args, needles, tb_name, no_leaks):
    proc = run_cli(*args, "--name", tb_name, timeout=60)
    assert_one_line_error(proc, *needles)
    assert ns.list_netns(f"inc-{tb_name}-") == []
