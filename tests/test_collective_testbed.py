"""The collectives across a namespace testbed with a soft NIC (``inceptionn nicd``) on every host:
real netfilter queues, real compression on the wire, one process per host.

What must hold:
- every collective's result is bit-identical on all ranks, and equal bit for bit to what the
  same operations give without any NIC (the values a tagged socket carries are fixed points of
  the codec, so compression changes the time, never the numbers); within the codec's error of
  the true sum;
- the soft NICs compressed the gradient sockets (egress compressed, ingress restored on every
  host for the ring; on the workers' egress and the aggregator's ingress only for WA);
- the untagged planes were never touched: the plain ring, the codec-in-collective ring, the
  control connections and the WA weights leave no trace in the daemons' compression counters;
  the sockets' ToS read back from the kernel agree.

Needs root (namespaces, iptables, NFQUEUE).
"""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from netns_helpers import needs_root
from proc_helpers import wait_all
from test_collective import ring_expected, same_bits, wa_expected
from test_nicd import assert_went_compressed

PEER = str(Path(__file__).resolve().parent / "collective_peer.py")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from collective_peer import data  # noqa: E402

pytestmark = needs_root


def run_job(tb, tmp_path, n, error_bound=-10, phases="raw,app,nic,wa", nicd_on=None, timeout=240):
    """One peer per host; ``nicd_on[r]``: whether host r runs a soft NIC (default: all)."""
    from inceptionn.daemon.launch import nicd, read_stats

    hosts = tb.hosts
    world = len(hosts)
    nicd_on = nicd_on or [True] * world
    store = tmp_path / "store"
    socks = [str(tmp_path / f"{h.name}.sock") if on else None for h, on in zip(hosts, nicd_on)]
    with ExitStack() as stack:
        for h, s in zip(hosts, socks):
            if s:
                stack.enter_context(nicd(h, s, error_bound))
        procs = []
        for r, h in enumerate(hosts):
            argv = [sys.executable, PEER, "--rank", str(r), "--world", str(world), "--store", str(store),
                    "--bind", h.ip, "--n", str(n), "--out", str(tmp_path), "--error-bound", str(error_bound),
                    "--phases", phases]
            if socks[r]:
                argv += ["--nicd-socket", socks[r]]
            procs.append(h.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        wait_all(procs, timeout)
        final = [read_stats(s) if s else None for s in socks]   # through `inceptionn stats --json`
    results = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    return results, info, final


def test_ring_and_wa_through_the_soft_nics(tb_name, tmp_path):
    from inceptionn.codecs import get_codec
    from inceptionn.kernel_tc.testbed import Testbed

    world, n, k = 4, 400_001, -10
    codec = get_codec("inceptionn", error_bound=k)
    with Testbed(hosts=world, mtu=9000, name=tb_name) as tb:
        res, info, final = run_job(tb, tmp_path, n, k)
    xs = [data(r, n) for r in range(world)]
    exact = np.sum(np.array(xs, dtype=np.float64), axis=0)
    m = max(float(np.abs(x).max()) for x in xs)
    for phase, want in (("raw", ring_expected(xs, "raw", codec=codec)),
                        ("app", ring_expected(xs, "app", codec=codec)),
                        ("nic", ring_expected(xs, "nic", codec=codec)),
                        ("wa", wa_expected(xs, "nic", codec=codec) * np.float32(-0.1))):
        got = [r[phase] for r in res]
        assert same_bits(got), f"{phase}: ranks differ"
        assert np.array_equal(got[0].view(np.uint32), want.view(np.uint32)), \
            f"{phase}: differs from the same computation without NICs"
        ref = exact * -0.1 if phase == "wa" else exact
        hops = {"raw": 0, "app": world, "nic": world, "wa": 1}[phase]
        assert np.abs(got[0] - ref).max() <= hops * 2.0**-7 * 2 * world * m + 1e-5 * m, phase
    assert not np.array_equal(res[0]["nic"], res[0]["raw"])

    d = [i["deltas"] for i in info]
    sent = [i["stats"]["by_op"]["allreduce"]["bytes_sent"]["gradient"] for i in info]
    for r in range(world):
        # untagged planes never reach the compressor
        for phase in ("raw", "app"):
            assert d[r][phase]["egress_compressed"] == 0 and d[r][phase]["egress_orig_bytes"] == 0, (r, phase, d[r])
            assert d[r][phase]["ingress_restored"] == 0, (r, phase)
        # the ring's gradient sockets: compressed out of every host, restored into every host
        nic = d[r]["nic"]
        assert nic["egress_compressed"] > 0 and nic["ingress_restored"] > 0, (r, nic)
        assert nic["egress_wire_bytes"] < nic["egress_orig_bytes"]
        # (retransmitted segments are counted again, so no upper bound)
        assert_went_compressed(nic, sent[r], f"rank {r}'s gradient bytes")
        # ToS as the kernel has it: only the opening side of gradient sockets is tagged
        for c in info[r]["conns"]:
            tagged = c["kind"] in ("RING_TAGGED", "WA_TAGGED") and c["direction"] == "out"
            assert c["tos"] == (0x28 if tagged else 0), (r, c)
        for key, v in final[r].items():
            if key.startswith("drop_"):
                assert v == 0, (r, key, v)
    # WA: only the gradient leg (workers -> aggregator) is compressed; weights go back untagged
    assert d[0]["wa"]["egress_compressed"] == 0 and d[0]["wa"]["egress_orig_bytes"] == 0
    assert d[0]["wa"]["ingress_restored"] > 0
    for r in range(1, world):
        assert d[r]["wa"]["egress_compressed"] > 0 and d[r]["wa"]["ingress_restored"] == 0, (r, d[r]["wa"])


def test_numbers_do_not_depend_on_which_hosts_run_a_soft_nic(tb_name, tmp_path):
    """h4 runs no daemon: of the ring's flows h1->h2 and h2->h3 are compressed, h3->h4 and
    h4->h1 are not negotiated and go raw. Same results as everywhere else, bit for bit."""
    from inceptionn.codecs import get_codec
    from inceptionn.kernel_tc.testbed import Testbed

    world, n = 4, 200_003
    codec = get_codec("inceptionn", error_bound=-10)
    with Testbed(hosts=world, mtu=1500, name=tb_name) as tb:
        res, info, final = run_job(tb, tmp_path, n, phases="nic,wa", nicd_on=[True, True, True, False])
    xs = [data(r, n) for r in range(world)]
    for phase, want in (("nic", ring_expected(xs, "nic", codec=codec)),
                        ("wa", wa_expected(xs, "nic", codec=codec) * np.float32(-0.1))):
        got = [r[phase] for r in res]
        assert same_bits(got), f"{phase}: ranks differ"
        assert np.array_equal(got[0].view(np.uint32), want.view(np.uint32)), phase
    d = [i["deltas"] for i in info]
    assert d[0]["nic"]["egress_compressed"] > 0 and d[1]["nic"]["ingress_restored"] > 0    # h1 -> h2
    assert d[1]["nic"]["egress_compressed"] > 0 and d[2]["nic"]["ingress_restored"] > 0    # h2 -> h3
    assert d[2]["nic"]["egress_compressed"] == 0 and d[2]["nic"]["egress_raw_bytes"] > 0   # h3 -> h4: raw
    assert d[0]["nic"]["ingress_restored"] == 0                                            # h4 -> h1: raw
    assert d[2]["wa"]["egress_compressed"] > 0 and d[0]["wa"]["ingress_restored"] > 0      # h3 -> h1 in WA
