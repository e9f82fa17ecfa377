"""The soft NIC's counters in the formats operators collect (issue 23, part 2), checked with the
real tools from Debian: promtool (package prometheus) lints the Prometheus text, the OpenMetrics
parser of python3-prometheus-client reads the OpenMetrics text (Debian 12's promtool 2.42 reads
the 0.0.4 format only), and a real node_exporter (prometheus-node-exporter) serves the textfile
the daemon writes, scraped over HTTP.

Counters come from real daemons in a two-host testbed that compressed a real tagged transfer,
with two queue pairs, so every series is per queue pair. The names checked are the data path's
own list (datapath.COUNTERS, from nicd_queue.h), not a copy.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_helpers import wait_until  # noqa: E402
from test_nicd import INC, running_nicd, transfer  # noqa: E402

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMTOOL = shutil.which("promtool")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's python3-prometheus-client lives there

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")


def _has_om_parser() -> bool:
    return subprocess.run([SYSTEM_PYTHON, "-c", "import prometheus_client.openmetrics.parser"],
                          capture_output=True).returncode == 0


def stats_output(sock, *args: str) -> str:
    r = subprocess.run([INC, "stats", "--socket", str(sock), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


OM_READER = r"""
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    out[fam.name] = {"type": fam.type, "help": fam.documentation,
                     "samples": [[s.name, s.labels, s.value] for s in fam.samples]}
print(json.dumps(out))
"""


def parse_openmetrics(text: str) -> dict:
    """Families as the reference OpenMetrics parser reads them (it raises on any deviation)."""
    r = subprocess.run([SYSTEM_PYTHON, "-c", OM_READER], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def parse_prometheus(text: str) -> dict[tuple[str, tuple], float]:
    """Samples of the 0.0.4 text: {(name, sorted label pairs): value} (our label values hold no
    commas or quotes)."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        pairs = tuple(sorted(tuple(kv.split("=", 1)) for kv in labels.rstrip("}").split(",") if kv))
        samples[name, tuple((k, v.strip('"')) for k, v in pairs)] = float(value)
    return samples


@contextmanager
def compressed_pair(tb_name, tmp_path, *extra):
    """Two hosts with nicd (2 queue pairs), after a tagged transfer h1 -> h2; yields (h1's
    daemon, h2's daemon, the testbed)."""
    from inceptionn.kernel_tc.testbed import Testbed
    data = (np.random.default_rng(3).standard_normal(200_000) / 64).astype(np.float32).tobytes()
    with Testbed(hosts=2, name=tb_name) as tb:
        h1, h2 = tb.hosts
        with running_nicd(h1, tmp_path, "--queues", 2, *extra) as d1, running_nicd(h2, tmp_path, "--queues", 2) as d2:
            got = transfer(h1, h2, data, tmp_path)
            assert len(got) == len(data)
            yield d1, d2, tb


def settled(sock) -> dict:
    """The counters once two reads a little apart agree (the last ACKs have been counted)."""
    prev = None
    for _ in range(50):
        cur = json.loads(stats_output(sock, "--json"))
        if prev is not None and cur["counters"] == prev["counters"] and cur["queues"] == prev["queues"]:
            return cur
        prev = cur
        time.sleep(0.2)
    raise AssertionError("counters kept changing")


@needs_root
@pytest.mark.skipif(not PROMTOOL, reason="needs promtool (apt-get install prometheus)")
@pytest.mark.skipif(not _has_om_parser(), reason="needs python3-prometheus-client (apt-get install)")
def test_stats_openmetrics_and_prometheus_export_every_counter_per_queue_pair(tmp_path, tb_name):
    from inceptionn.daemon.datapath import COUNTERS

    with compressed_pair(tb_name, tmp_path) as (d1, d2, tb):
        snap = settled(d1.sock)
        om = stats_output(d1.sock, "--format", "openmetrics")
        prom = stats_output(d1.sock, "--format", "prometheus")
        assert json.loads(stats_output(d1.sock, "--format", "json"))["counters"] == snap["counters"]
        assert stats_output(d1.sock, "--format", "text").startswith(f"nicd pid {d1.proc.pid},")
    assert snap["counters"]["egress_compressed"] > 0, snap["counters"]  # real compression happened
    assert om.endswith("# EOF\n")

    # promtool: parses and lints the Prometheus text (exit 0, nothing to say)
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=prom, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr

    # the reference OpenMetrics parser: every counter of the data path, a counter family with
    # HELP, one sample per queue pair, equal to the daemon's own per-queue counters
    fams = parse_openmetrics(om)
    queues = snap["queues"]
    assert len(queues) == 2
    for name in COUNTERS:
        fam = fams.get(f"inceptionn_nicd_{name}")
        assert fam is not None, f"counter {name} not exported"
        assert fam["type"] == "counter" and fam["help"].startswith(name.replace("_", " ")), fam
        got = {(s[1]["egress_queue"], s[1]["ingress_queue"]): s[2] for s in fam["samples"]
               if s[0] == f"inceptionn_nicd_{name}_total"}
        want = {(str(q["egress_queue"]), str(q["ingress_queue"])): q["counters"][name] for q in queues}
        assert got == want, name
        assert sum(got.values()) == snap["counters"][name], name
    assert fams["inceptionn_nicd"]["type"] == "info"
    info = fams["inceptionn_nicd"]["samples"][0][1]
    assert (info["codec"], info["error_bound"], info["queues"]) == ("inceptionn", "-10", "2"), info
    assert fams["inceptionn_nicd_flows_expired"]["type"] == "counter"
    assert fams["inceptionn_nicd_flows_active"]["type"] == "gauge"
    # the comments of nicd_queue.h are the HELP texts
    assert "payload bytes of the packets sent compressed" in fams["inceptionn_nicd_egress_orig_bytes"]["help"]

    # the two formats carry the same samples
    samples = parse_prometheus(prom)
    for name in COUNTERS:
        for q in queues:
            key = (f"inceptionn_nicd_{name}_total",
                   (("egress_queue", str(q["egress_queue"])), ("ingress_queue", str(q["ingress_queue"]))))
            assert samples[key] == q["counters"][name], key


def test_openmetrics_help_for_a_counter_the_header_does_not_describe():
    """A counter a data-path change adds without a comment is exported anyway, its name as HELP."""
    from inceptionn.daemon.datapath import COUNTERS
    from inceptionn.daemon.metrics import exposition

    counters = dict.fromkeys(COUNTERS, 0) | {"brand_new_thing": 7}
    text = exposition({"config": {}, "counters": counters,
                       "queues": [{"egress_queue": 1, "ingress_queue": 2, "counters": counters}]})
    assert "# HELP inceptionn_nicd_brand_new_thing brand new thing\n" in text
    assert 'inceptionn_nicd_brand_new_thing_total{egress_queue="1",ingress_queue="2"} 7\n' in text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def node_exporter(directory: Path):
    """A real node_exporter on 127.0.0.1 (a free port) with only its textfile collector,
    reading ``directory``; yields the URL of its /metrics."""
    port = free_port()
    p = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                          "--collector.textfile", f"--collector.textfile.directory={directory}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert wait_until(lambda: _get(url) is not None or p.poll() is not None, 30), "node_exporter did not answer"
        assert p.poll() is None, p.stderr.read().decode()
        yield url
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()
    except OSError:
        return None


@needs_root
@pytest.mark.skipif(not NODE_EXPORTER, reason="needs node_exporter (apt-get install prometheus-node-exporter)")
def test_node_exporter_serves_the_daemons_textfile(tmp_path, tb_name):
    """metrics_textfile in node_exporter's textfile directory: node_exporter serves the
    daemon's counters per queue pair (equal to `inceptionn stats`), every scrape reads a whole
    file while the daemon rewrites it each second, and the stop removes it."""
    from inceptionn.daemon.datapath import COUNTERS

    directory = tmp_path / "textfile"
    directory.mkdir()
    prom = directory / "inceptionn.prom"
    with node_exporter(directory) as url:
        with compressed_pair(tb_name, tmp_path, "--metrics-textfile", prom, "--metrics-interval", 1) as (d1, d2, tb):
            assert oct(prom.stat().st_mode & 0o777) == "0o644"  # readable by node_exporter's own user
            snap = settled(d1.sock)
            want = {(q["egress_queue"], q["ingress_queue"]): q["counters"] for q in snap["queues"]}

            def served():
                text = _get(url) or ""
                got = parse_prometheus(text)
                return all(got.get((f"inceptionn_nicd_{name}_total",
                                    (("egress_queue", str(e)), ("ingress_queue", str(i))))) == c[name]
                           for (e, i), c in want.items() for name in COUNTERS) and text

            text = wait_until(served, 15) and served()
            assert text, f"node_exporter did not serve the daemon's counters:\n{_get(url)}"
            assert snap["counters"]["egress_compressed"] > 0
            assert parse_prometheus(text)[("node_textfile_scrape_error", ())] == 0
            # scrapes while the daemon rewrites the file (every second): never half a file
            for _ in range(25):
                got = parse_prometheus(_get(url))
                assert got[("node_textfile_scrape_error", ())] == 0
                assert any(k[0] == "inceptionn_nicd_egress_packets_total" for k in got)
                time.sleep(0.1)
            assert [p.name for p in directory.iterdir()] == ["inceptionn.prom"]  # no temporary file left
        # stopped: the file is gone, and with it the series
        assert not prom.exists()
        after = _get(url)
        assert "inceptionn_nicd_" not in after, after


@pytest.mark.parametrize("value,needle", [
    ("metrics.prom", "absolute path ending in .prom"),
    ("/var/lib/prometheus/node-exporter/inceptionn.txt", "absolute path ending in .prom"),
])
def test_metrics_textfile_bad_value_refused_in_one_line(value, needle):
    r = subprocess.run([INC, "nicd", "--check", "-i", "lo", "--metrics-textfile", value], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and needle in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr


@needs_root
def test_metrics_textfile_without_its_directory_refused_before_any_rule(tmp_path, tb_name):
    from inceptionn.kernel_tc.testbed import Testbed
    with Testbed(hosts=1, name=tb_name) as tb:
        (h,) = tb.hosts
        r = h.run([INC, "nicd", "-i", h.ifname, "--socket", str(tmp_path / "s.sock"),
                   "--metrics-textfile", str(tmp_path / "missing" / "inceptionn.prom")],
                  capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "no directory" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        saved = h.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
        assert "inceptionn-nicd-" not in saved
