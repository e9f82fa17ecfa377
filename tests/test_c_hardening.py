"""The C code that faces the network under AddressSanitizer/UndefinedBehaviorSanitizer: every
codec's C unit test (codecs_c/tests/test_*.c), and bounded libFuzzer runs of every codec decoder
(codecs_c/fuzz/fuzz_*.c), of the soft NIC's packet transforms and of the tagging policy parser
(shim/fuzz). The Makefile builds the binaries; the seed corpus of fuzz_NAME is
tests/fuzz_corpus/NAME.

The fuzz runs are a fixed count of executions from a fixed seed, not a time budget, with address
randomisation off: the same inputs every run (the printed count of new units repeats exactly),
so the verdict cannot depend on the machine's speed or on luck. Finding new
bugs is the long campaign's job (`make -j2 fuzz`, docs/codecs.md), whose findings become seeds
here."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FUZZ_SEED = 1
# Executions per target, a fixed count so that a run repeats itself exactly. The codec decoders
# run 500,000 in 10-25 s each on the shared 2-core machine when quiet; the soft NIC's packet
# transforms are slower per input (1,000,000 took 295 s of a 36-minute CI), so they get fewer.
# Breadth is the long campaign's job (`make -k -j2 fuzz`), whose findings are seeds here.
FUZZ_RUNS = 500_000
FUZZ_RUNS_BY_TARGET = {"fuzz_nicd_packet": 150_000}
UNIT_TESTS = sorted(p.stem for p in (ROOT / "codecs_c" / "tests").glob("test_*.c"))
FUZZ_TARGETS = sorted(p.stem for p in (ROOT / "codecs_c" / "fuzz").glob("fuzz_*.c")) + ["fuzz_nicd_packet", "fuzz_tag_policy"]


def make(target):
    subprocess.run(["make", "-s", "--no-print-directory", target], cwd=ROOT, check=True)
    return ROOT / target


@pytest.mark.parametrize("name", UNIT_TESTS)
def test_c_unit_test_under_asan_ubsan(name):
    binary = make(f"build/{name}_san")
    r = subprocess.run([binary], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(" passed, 0 failed"), r.stdout
    assert "runtime error" not in r.stderr  # UBSan reports go to stderr


@pytest.mark.parametrize("target", FUZZ_TARGETS)
def test_fuzz_bounded(tmp_path, target):
    binary = make(f"build/{target}")
    seeds = ROOT / "tests" / "fuzz_corpus" / target.removeprefix("fuzz_")
    assert any(seeds.iterdir()), "seed corpus missing"
    n_seeds = sum(1 for _ in seeds.iterdir())
    runs_wanted = FUZZ_RUNS_BY_TARGET.get(target, FUZZ_RUNS)
    r = subprocess.run(
        # Without address randomisation and corpus reloads a seeded run repeats itself exactly
        # (libFuzzer's comparison tracing sees pointer values; -reload rereads on a timer).
        ["setarch", "-R", binary, f"-seed={FUZZ_SEED}", f"-runs={runs_wanted}", "-reload=0",
         "-print_final_stats=1", "-timeout=10", f"-artifact_prefix={tmp_path}/", str(tmp_path), str(seeds)],
        capture_output=True, text=True, timeout=900,
    )
    tail = r.stderr[-3000:]
    assert r.returncode == 0, tail
    stats = {k: v for k, _, v in (line.rpartition(":") for line in r.stderr.splitlines() if line.startswith("stat::"))}
    runs = int(stats["stat::number_of_executed_units"])
    print(f"{target}: {runs} executions, {stats['stat::average_exec_per_sec'].strip()}/s, seed {FUZZ_SEED}, "
          f"{stats['stat::new_units_added'].strip()} new units")
    # Every seed was read and every execution asked for happened (a target that returned early
    # or a run cut short would show fewer); the mutations explored new inputs beyond the seeds.
    assert f"seed corpus: files: {n_seeds} " in r.stderr, tail
    assert runs == runs_wanted, tail
    assert int(stats["stat::new_units_added"]) > 0, tail
