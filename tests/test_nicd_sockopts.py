"""The socket options nicd sets (daemon/nicd_queue.c, sockopt): one the kernel refuses is logged
once per daemon, with what it costs, and the daemon runs on.

Triggered for real: root of a user namespace of its own holds CAP_NET_ADMIN over that namespace's
network namespace (it binds the queues, its iptables install the rules), but SO_RCVBUFFORCE and
SO_SNDBUFFORCE ask for CAP_NET_ADMIN in the initial user namespace, as in a rootless container.
The namespaces (and the rules in them) go away with the daemon. Needs root (unshare)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from netns_helpers import wait_until

INC = str(Path(sys.executable).parent / "inceptionn")

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter"),
              pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (util-linux)")]


def test_refused_buffer_options_are_logged_once_per_daemon(tmp_path):
    """Two queue threads each set the same options: each refused one is one warning line naming
    the option, the error and its cost; the daemon still binds its queues and serves counters."""
    sock, log = tmp_path / "nicd.sock", tmp_path / "nicd.log"
    argv = ["unshare", "--user", "--map-root-user", "--net", "--", "sh", "-c",
            f'ip link set lo up && exec "$0" nicd -i lo --queues 2 --socket {sock}', INC]
    with open(log, "wb") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=f)
    try:
        assert wait_until(lambda: b"nicd: ready" in log.read_bytes() or p.poll() is not None, 30), log.read_text()
        assert p.poll() is None, log.read_text()
        r = subprocess.run([INC, "stats", "--socket", str(sock), "--json"], capture_output=True, text=True,
                           timeout=20)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["counters"]["egress_packets"] >= 0
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0, log.read_text()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = log.read_text()
    rcv = [l for l in text.splitlines() if "SO_RCVBUFFORCE" in l]
    assert rcv == ["nicd WARNING: SO_RCVBUFFORCE failed (Operation not permitted): the queue socket keeps the "
                   "default receive buffer: a burst may overflow it, its ingress packets are dropped and its "
                   "egress packets leave raw"], text
    snd = [l for l in text.splitlines() if "SO_SNDBUFFORCE failed" in l]
    assert len(snd) == 1 and "verdict_errors" in snd[0], text
    assert text.count("SO_SNDBUFFORCE on the raw socket failed") == 1, text  # gso (the default): the raw socket
    assert "Traceback" not in text, text
