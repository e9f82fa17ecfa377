"""Running the installed ``inceptionn`` console script as a user would, and checking that a
user mistake gives one line ``inceptionn: error: ...`` and exit status 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).with_name("inceptionn"))


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the installed `inceptionn` console script, as a user would."""
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("inceptionn: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
