"""The codec's C code under AddressSanitizer/UndefinedBehaviorSanitizer, and a bounded libFuzzer
run of its decoder and encoder. Both binaries are built by the Makefile (make keeps them fresh)."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUZZ_SECONDS = int(os.environ.get("FUZZ_SECONDS", "60"))


def make(target):
    subprocess.run(["make", "-s", "--no-print-directory", target], cwd=ROOT, check=True)
    return ROOT / target


def test_c_unit_test_under_asan_ubsan():
    binary = make("build/test_codec_san")
    r = subprocess.run([binary], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(" passed, 0 failed"), r.stdout
    assert "runtime error" not in r.stderr  # UBSan reports go to stderr


def test_fuzz_codec_bounded(tmp_path):
    binary = make("build/fuzz_inceptionn")
    seeds = ROOT / "tests" / "fuzz_corpus" / "inceptionn"
    assert any(seeds.iterdir()), "seed corpus missing"
    r = subprocess.run(
        [binary, f"-max_total_time={FUZZ_SECONDS}", "-print_final_stats=1", "-timeout=10",
         f"-artifact_prefix={tmp_path}/", str(tmp_path), str(seeds)],
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 120,
    )
    tail = r.stderr[-3000:]
    assert r.returncode == 0, tail
    runs = int(next(line.split(":")[-1] for line in r.stderr.splitlines() if "number_of_executed_units" in line))
    print(f"fuzz: {runs} executions in {FUZZ_SECONDS} s")
    assert runs > 1000, tail
