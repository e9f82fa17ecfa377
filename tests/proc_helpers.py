"""Running a job's peer processes in a test: wait for all of them, kill the stragglers."""
from __future__ import annotations

import subprocess
import time


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each process's output (stdout, stderr merged), all within ``timeout`` seconds overall;
    asserts every one exited 0. Any still running when this returns or raises is killed."""
    deadline = time.monotonic() + timeout
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return logs
