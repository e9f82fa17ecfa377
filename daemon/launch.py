"""Start the soft NIC on a testbed host for a benchmark or a training job, and read its counters.

    with nicd(host, "/tmp/x/h1.sock", error_bound=-10) as proc:
        ...                                   # tagged traffic of ``host`` is compressed
        counters = read_stats("/tmp/x/h1.sock")
    # stopped (SIGTERM: the daemon removes its rules), killed if it does not stop in 10 s

The daemon runs as ``python -m inceptionn nicd`` inside the host's namespace with its own stats
socket; ``wait_ready`` blocks until it says it is ready (or raises UserError with what it said).
After that its stderr is drained by a thread (kept: the last lines, for error messages), so a
chatty daemon can never block on a full pipe.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import threading
from contextlib import contextmanager

from ..procs import stop
from .nicd import wait_ready


def nicd_argv(host, sock: str, error_bound: int, accept_only: bool = False,
              log_level: str = "warning", gso: bool | None = None, queues: int = 1, trains: bool | None = None) -> list[str]:
    """gso: True --gso, False --no-gso (per packet), None the daemon's default (auto); trains: True
    --trains, False --no-trains (format v2 only), None the daemon's default (on)."""
    argv = [sys.executable, "-m", "inceptionn", "nicd", "-i", host.ifname, "--socket", sock,
            "--error-bound", str(error_bound), "--log-level", log_level]
    return (argv + (["--accept-only"] if accept_only else []) + {True: ["--gso"], False: ["--no-gso"], None: []}[gso]
            + (["--queues", str(queues)] if queues != 1 else []) + {True: ["--trains"], False: ["--no-trains"], None: []}[trains])


@contextmanager
def nicd(host, sock: str, error_bound: int, accept_only: bool = False, *, new_session: bool = False,
         log_level: str = "warning", gso: bool | None = None, queues: int = 1, trains: bool | None = None):
    """Run nicd on ``host`` for the duration of the block; yields the Popen (with ``.log``, a
    deque of its last stderr lines). ``new_session`` keeps a terminal's Ctrl-C away from it,
    so the caller stops it in order."""
    p = host.popen(nicd_argv(host, sock, error_bound, accept_only, log_level, gso, queues, trains), stderr=subprocess.PIPE,
                   start_new_session=new_session)
    p.log = collections.deque(maxlen=50)
    try:
        p.log.extend(wait_ready(p))
        threading.Thread(target=_drain, args=(p,), name=f"nicd-{host.name}-stderr", daemon=True).start()
        yield p
    finally:
        stop(p)


def _drain(p) -> None:
    for line in iter(p.stderr.readline, b""):
        p.log.append(line.decode(errors="replace").rstrip())


def read_stats(sock: str) -> dict:
    """The running daemon's counters (what ``inceptionn stats --json`` prints under "counters")."""
    from .stats import read

    return read(sock)["counters"]
