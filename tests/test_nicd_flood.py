"""Flow lifetime and fairness (issue 31): an unprivileged local user floods the flow table with
tagged connect-and-reset connections, then holds more connections open than its cap allows;
another user's flow is still negotiated and compressed, and every entry ends at its RST or
after its FIN. Real daemons on both hosts of a testbed (see tests/test_nicd.py); the flooder
runs as the user nobody (setpriv), with the system Python and nothing but the standard library.

The table is small here (flow_capacity 1024: 768 flows) so the flood is short: before entries
ended at RST and owners had a cap, its 2,000 negotiated connections filled the table and the
victim's flow stayed raw (flow_table_full) for flow_timeout.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import threading

import pytest
from netns_helpers import wait_until
from test_nicd import PY, Transfer, make_testbed, recon, running_nicd, stats

from inceptionn.daemon._datapath import lib

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root (namespaces, netfilter) and setpriv")

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
CAPACITY, OWNER_CAP = 1024, 64
RESETS, HELD = 2000, 200
FLOOD_PORT = 6000

# Accepts and closes every connection (h2, root, untagged).
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4096)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.close()
"""

# The flood (h1, user nobody): `resets` tagged connections, each reset at once (SO_LINGER 0: an
# RST, no FIN); then `held` more held open until stdin closes, then closed with a FIN each.
FLOODER = """
import socket, struct, sys, time
host, port, resets, held = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def tagged():
    s = socket.socket(); s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x28)
    s.connect((host, port)); return s

t0 = time.monotonic()
for _ in range(resets):
    s = tagged(); s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.close()
print(f"reset {resets} {time.monotonic() - t0:.3f}", flush=True)
kept = [tagged() for _ in range(held)]
print(f"held {len(kept)}", flush=True)
sys.stdin.read()
for s in kept:
    s.close()
print("closed", flush=True)
"""


def test_a_flooding_user_cannot_keep_another_users_flow_raw(tmp_path, small):
    flags = ["--flow-capacity", CAPACITY, "--flow-owner-cap", OWNER_CAP]
    with make_testbed(mtu=1500) as tb:
        h1, h2 = tb.hosts
        server = h2.popen([PY, "-c", SERVER, h2.ip, str(FLOOD_PORT)], stdout=subprocess.PIPE, text=True)
        flood = None
        try:
            assert server.stdout.readline().strip() == "listening"
            with running_nicd(h1, tmp_path, *flags) as d1, running_nicd(h2, tmp_path, *flags) as d2:
                flood = h1.popen([*NOBODY, "/usr/bin/python3", "-c", FLOODER, h2.ip, str(FLOOD_PORT), str(RESETS),
                                  str(HELD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
                samples, done = [], threading.Event()
                sampler = threading.Thread(target=lambda: [samples.append(active(d1)) for _ in iter(
                    lambda: done.wait(0.2), True)])
                sampler.start()
                try:
                    line = flood.stdout.readline()  # the flood's end
                finally:
                    done.set()
                    sampler.join()
                assert line.startswith("reset"), (line, flood.stderr.read() if flood.poll() is not None else "")
                seconds = float(line.split()[2])
                line = flood.stdout.readline()
                assert line.strip() == f"held {HELD}", line
                assert wait_until(lambda: d1.counters()["flow_owner_full"] >= HELD - OWNER_CAP, 10)
                c = d1.counters()
                # Every reset connection was negotiated and ended at its RST; of the held ones, the
                # first OWNER_CAP were negotiated, the rest stayed raw at the owner's cap.
                assert c["flows_negotiated"] == RESETS + OWNER_CAP, c
                assert c["flows_closed_rst"] == RESETS, c
                assert c["flow_owner_full"] == HELD - OWNER_CAP and c["flow_table_full"] == 0, c
                assert wait_until(lambda: active(d1) == OWNER_CAP, 5), active(d1)
                most_active = max(samples + [OWNER_CAP])
                assert most_active < CAPACITY * 3 // 4  # the flood never filled the table

                # Another user (root) on the same host: negotiated and compressed.
                before = d1.counters()
                t = Transfer(h1, h2, small.tobytes(), tmp_path, tos=0x28)
                try:
                    got = t.finish()
                finally:
                    t.close()
                after, c2 = d1.counters(), d2.counters()
                victim = {k: after[k] - before[k] for k in after}
                assert victim["flows_negotiated"] == 1 and victim["flow_owner_full"] == 0, victim
                assert victim["egress_compressed"] > 0 and c2["ingress_restored"] > 0, (victim, c2)
                assert got == recon(small, -10).tobytes()

                # The held connections end with a FIN each: their entries linger, then go.
                flood.stdin.close()
                assert flood.stdout.readline().strip() == "closed"
                assert flood.wait(timeout=30) == 0, flood.stderr.read()
                assert wait_until(lambda: d1.counters()["flows_closed_fin"] == OWNER_CAP + 1, 10), d1.counters()
                assert active(d1) > 0  # still lingering for retransmissions
                assert wait_until(lambda: active(d1) == 0, lib.NICD_FIN_LINGER_S + 5), active(d1)
                print(f"\nflood as nobody: {RESETS} connect-and-reset connections in {seconds:.2f} s, "
                      f"{HELD} held (cap {OWNER_CAP}): flows active at most {most_active} of "
                      f"{CAPACITY * 3 // 4}, {c['flows_closed_rst']} ended by RST, {c['flow_owner_full']} cap hits; "
                      f"the victim's flow: {victim['egress_compressed']} packets compressed "
                      f"({victim['egress_orig_bytes']} -> {victim['egress_wire_bytes']} bytes), "
                      f"{c2['ingress_restored']} restored")
        finally:
            for p in (flood, server):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()


def active(d) -> int:
    """Negotiated flows in the daemon's table (its once-a-second count)."""
    return int(stats(d.sock)["flows_active"])
