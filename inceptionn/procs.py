"""Helpers for the child processes the tools start (daemons on testbed hosts, training workers):
stop one politely, and read how much CPU one has used."""
from __future__ import annotations

import os
import subprocess

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def stop(p: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM (a daemon then removes its rules), SIGKILL if still running after ``timeout`` s."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (from /proc; 0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # after the command name, which may hold spaces
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK   # utime + stime
