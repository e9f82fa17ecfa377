"""The C code that faces the network under AddressSanitizer/UndefinedBehaviorSanitizer: every
codec's C unit test (codecs_c/tests/test_*.c), and bounded libFuzzer runs of every codec decoder
(codecs_c/fuzz/fuzz_*.c) and of the soft NIC's packet transforms. The Makefile builds the
binaries; the seed corpus of fuzz_NAME is tests/fuzz_corpus/NAME."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FUZZ_SECONDS = int(os.environ.get("FUZZ_SECONDS", "30"))  # per target
UNIT_TESTS = sorted(p.stem for p in (ROOT / "codecs_c" / "tests").glob("test_*.c"))
FUZZ_TARGETS = sorted(p.stem for p in (ROOT / "codecs_c" / "fuzz").glob("fuzz_*.c")) + ["fuzz_nicd_packet"]


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
    r = subprocess.run(
        [binary, f"-max_total_time={FUZZ_SECONDS}", "-print_final_stats=1", "-timeout=10",
         f"-artifact_prefix={tmp_path}/", str(tmp_path), str(seeds)],
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 120,
    )
    tail = r.stderr[-3000:]
    assert r.returncode == 0, tail
    runs = int(next(line.split(":")[-1] for line in r.stderr.splitlines() if "number_of_executed_units" in line))
    print(f"{target}: {runs} executions in {FUZZ_SECONDS} s")
    assert runs > 1000, tail
