"""The C code that faces the network under AddressSanitizer/UndefinedBehaviorSanitizer: every
codec's C unit test (codecs_c/tests/test_*.c), and bounded libFuzzer runs of every codec decoder
(codecs_c/fuzz/fuzz_*.c), of the soft NIC's packet transforms and of the tagging policy parser
(shim/fuzz). The Makefile builds the binaries; the seed corpus of fuzz_NAME is
tests/fuzz_corpus/NAME.

The fuzz runs are a fixed count of executions from a fixed seed, not a time budget, with address
randomisation off: the same inputs every run (the printed count of new units repeats exactly),
so the verdict cannot depend on the machine's speed or on luck. Finding new
bugs is the long campaign's job (`make -j2 fuzz`, docs/codecs.md), whose findings become seeds
here.

The bounded runs are single-threaded, CPU-bound and independent of each other (each its own
binary, corpus directory and artifact prefix), so they run two at a time, one per core of the
2-core CI machine (fuzz_runs below): each test still runs its own target with the same seed and
run count and checks the same things; only the wall time of the module drops (about half)."""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FUZZ_SEED = 1
# Executions per target, a fixed count so that a run repeats itself exactly. The codec decoders
# run 500,000 in 10-25 s each on the shared 2-core machine when quiet; the soft NIC's packet
# transforms (and the v3 trains, about 7,000 inputs/s) are slower per input (1,000,000 took 295 s of a
# 36-minute CI), so they get fewer.
# Breadth is the long campaign's job (`make -k -j2 fuzz`), whose findings are seeds here.
FUZZ_RUNS = 500_000
FUZZ_RUNS_BY_TARGET = {"fuzz_nicd_packet": 150_000, "fuzz_nicd_train": 150_000}
FUZZ_JOBS = 2                   # bounded runs at once: one per core of the CI machine
# Seconds each took in the last CI run alone (the rest 15-17 s): only the order they start in.
FUZZ_CI_SECONDS = {"fuzz_nicd_packet": 60, "fuzz_thc": 33, "fuzz_nicd_train": 25, "fuzz_blockscale": 20}
UNIT_TESTS = sorted(p.stem for p in (ROOT / "codecs_c" / "tests").glob("test_*.c"))
FUZZ_TARGETS = sorted(p.stem for p in (ROOT / "codecs_c" / "fuzz").glob("fuzz_*.c")) + ["fuzz_nicd_packet", "fuzz_nicd_train",
                                                                                    "fuzz_tag_policy"]


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


def fuzz(binary: Path, runs_wanted: int, seeds: Path, work: Path, env: dict) -> subprocess.CompletedProcess:
    # Without address randomisation and corpus reloads a seeded run repeats itself exactly
    # (libFuzzer's comparison tracing sees pointer values; -reload rereads on a timer). The
    # stack's addresses depend on the lengths of the arguments and the environment too, so the
    # run's own directory is the working directory (no tmp path of varying length in argv) and
    # the environment is fixed (no PYTEST_CURRENT_TEST, which names whatever test pytest is in
    # when a run starts): measured, fuzz_tag_policy added 648 units in one directory and 620 in
    # a longer one; relative, 670 in both.
    (work / "corpus").mkdir()
    return subprocess.run(
        ["setarch", "-R", binary, f"-seed={FUZZ_SEED}", f"-runs={runs_wanted}", "-reload=0",
         "-print_final_stats=1", "-timeout=10", "-artifact_prefix=./", "corpus", str(seeds)],
        cwd=work, env=env, capture_output=True, text=True, timeout=900,
    )


@pytest.fixture(scope="module")
def fuzz_runs(request, tmp_path_factory):
    """The bounded run of every fuzz target this session selected, FUZZ_JOBS at a time, started
    when the first fuzz test asks (the C unit tests before it run alone): target -> future of
    its finished process. The binaries are built first, one make at a time (they share objects);
    the longest runs start first so that the two cores finish together."""
    selected = [item.callspec.params["target"] for item in request.session.items
                if item.module is request.module and item.originalname == "test_fuzz_bounded"]
    binaries = {t: make(f"build/{t}") for t in selected}
    order = sorted(selected, key=lambda t: -FUZZ_CI_SECONDS.get(t, 16))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with ThreadPoolExecutor(max_workers=FUZZ_JOBS) as pool:
        futures = {t: pool.submit(fuzz, binaries[t], FUZZ_RUNS_BY_TARGET.get(t, FUZZ_RUNS), seeds_of(t),
                                  tmp_path_factory.mktemp(t), env) for t in order}
        yield futures
        for f in futures.values():
            f.cancel()


def seeds_of(target: str) -> Path:
    return ROOT / "tests" / "fuzz_corpus" / target.removeprefix("fuzz_")


@pytest.mark.parametrize("target", FUZZ_TARGETS)
def test_fuzz_bounded(fuzz_runs, target):
    seeds = seeds_of(target)
    assert any(seeds.iterdir()), "seed corpus missing"
    n_seeds = sum(1 for _ in seeds.iterdir())
    runs_wanted = FUZZ_RUNS_BY_TARGET.get(target, FUZZ_RUNS)
    r = fuzz_runs[target].result()
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
