"""`inceptionn link`: units, shaping set/show/clear on a veth inside a test namespace, and the
one-line errors. The CLI is run as a subprocess, as a user runs it."""
from __future__ import annotations

import json
import subprocess

import pytest

from cli_helpers import assert_one_line_error, run_cli
from netns_helpers import needs_root
from inceptionn.errors import UserError
from inceptionn.kernel_tc import link, lossrules
from inceptionn.kernel_tc.units import (
    format_percent, format_rate, format_time, parse_percent, parse_rate, parse_time,
)


# --- units (no root needed) ----------------------------------------------------------------------

@pytest.mark.parametrize("text,bits", [
    ("100mbit", 100_000_000), ("100Mbit", 100_000_000), ("1gbit", 10**9), ("10kbit", 10_000),
    ("1.5mbit", 1_500_000), ("1000000", 1_000_000), ("8bit", 8), ("1kibit", 1024),
    ("1mbps", 8_000_000), ("125kbps", 1_000_000), ("100bps", 800), ("1mibit", 2**20),
])
def test_parse_rate(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["", "fast", "10parsecs", "-1mbit", "0", "0mbit", "mbit", "1e999mbit", "4bit"])
def test_parse_rate_rejects(text):
    with pytest.raises(UserError):
        parse_rate(text)


@pytest.mark.parametrize("text,us", [("2ms", 2000), ("1s", 10**6), ("250us", 250), ("10", 10),
                                     ("1.5ms", 1500), ("0ms", 0), ("3msec", 3000)])
def test_parse_time(text, us):
    assert parse_time(text) == us


@pytest.mark.parametrize("text", ["-1ms", "2min", "ms", "fast"])
def test_parse_time_rejects(text):
    with pytest.raises(UserError):
        parse_time(text)


@pytest.mark.parametrize("text,pct", [("0.5%", 0.5), ("0.5", 0.5), ("100%", 100.0), ("0%", 0.0)])
def test_parse_percent(text, pct):
    assert parse_percent(text) == pct


@pytest.mark.parametrize("text", ["101%", "-1%", "5 percent", "half"])
def test_parse_percent_rejects(text):
    with pytest.raises(UserError):
        parse_percent(text)


def test_formatting_round_trips():
    for text in ("10mbit", "1gbit", "125kbit", "8bit"):
        assert format_rate(parse_rate(text)) == text
    assert format_rate(1_500_000) == "1.5mbit"
    assert format_rate(1_234_567) == "1.235mbit"
    assert format_time(2000) == "2ms" and format_time(1500) == "1.5ms"
    assert format_percent(0.5) == "0.5%" and format_percent(10.0000001) == "10%"


@pytest.mark.parametrize("rate,mtu", [(10**7, 1500), (10**8, 1500), (10**9, 1500), (10**7, 9000), (10**9, 9000)])
def test_burst_suits_rate_and_mtu(rate, mtu):
    burst, quantum = link.burst_and_quantum(rate, mtu)
    assert burst >= rate / 8 * 0.005     # covers 5 ms of late timers at this rate
    assert burst >= 2 * (mtu + 14)       # and at least two full frames
    assert quantum >= 65536              # a whole GSO super-packet per round


# --- shaping on a real interface ---------------------------------------------------------------

def _show(netns: str, iface: str = "va") -> dict:
    proc = run_cli("link", iface, "--netns", netns, "--show", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _tc_qdiscs(netns: str, iface: str = "va") -> str:
    # the tc tool as an independent reader of what the kernel holds
    return subprocess.run(["tc", "-n", netns, "qdisc", "show", "dev", iface],
                          capture_output=True, text=True, check=True).stdout


@needs_root
def test_set_show_clear(veth_ns, no_leaks):
    assert _show(veth_ns)["rate_bps"] is None

    proc = run_cli("link", "va", "--netns", veth_ns, "--rate", "100mbit")
    assert proc.returncode == 0, proc.stderr
    assert "rate: 100mbit" in proc.stdout
    shown = _show(veth_ns)
    assert shown["rate_bps"] == 100_000_000 and shown["rate"] == "100mbit"
    assert shown["burst_bytes"] >= 100_000_000 / 8 * 0.005 * 0.99
    assert shown["managed"] and shown["root_qdisc"] == "htb"
    assert "htb 1ce0: root" in _tc_qdiscs(veth_ns)
    assert "rate 100Mbit" in subprocess.run(["tc", "-n", veth_ns, "class", "show", "dev", "va"],
                                            capture_output=True, text=True).stdout

    text = run_cli("link", "va", "--netns", veth_ns, "--show")
    assert text.returncode == 0 and "rate: 100mbit" in text.stdout and "loss: none" in text.stdout

    cleared = run_cli("link", "va", "--netns", veth_ns, "--clear")
    assert cleared.returncode == 0 and "removed" in cleared.stdout
    assert _show(veth_ns)["rate_bps"] is None
    assert "htb" not in _tc_qdiscs(veth_ns)
    again = run_cli("link", "va", "--netns", veth_ns, "--clear")  # idempotent
    assert again.returncode == 0 and "no inceptionn shaping" in again.stdout


@needs_root
def test_rate_and_loss_and_exact_clear(veth_ns, no_leaks):
    # a rule that is not ours must survive --clear
    subprocess.run(["ip", "netns", "exec", veth_ns, "iptables", "-w", "-A", "OUTPUT", "-o", "va",
                    "-m", "comment", "--comment", "someone-else", "-j", "ACCEPT"], check=True)
    proc = run_cli("link", "va", "--netns", veth_ns, "--rate", "10mbit", "--loss", "0.5%")
    assert proc.returncode == 0, proc.stderr
    shown = _show(veth_ns)
    assert shown["rate_bps"] == 10_000_000
    if shown["loss_method"] == "iptables-statistic":
        assert shown["loss_rules"] == 2  # OUTPUT and FORWARD
    assert abs(shown["loss_percent"] - 0.5) < 1e-6
    assert "loss: 0.5%" in run_cli("link", "va", "--netns", veth_ns, "--show").stdout

    # setting again replaces the whole configuration: no loss asked, no loss left
    assert run_cli("link", "va", "--netns", veth_ns, "--rate", "20mbit").returncode == 0
    shown = _show(veth_ns)
    assert shown["rate_bps"] == 20_000_000 and shown["loss_percent"] is None
    assert lossrules.list_rules(veth_ns) == []

    assert run_cli("link", "va", "--netns", veth_ns, "--loss", "3%").returncode == 0
    assert run_cli("link", "va", "--netns", veth_ns, "--clear").returncode == 0
    rules = subprocess.run(["ip", "netns", "exec", veth_ns, "iptables-save"], capture_output=True, text=True).stdout
    assert "inceptionn" not in rules
    assert "someone-else" in rules


@needs_root
@pytest.mark.skipif(link.netem_available(), reason="this kernel has netem")
def test_delay_says_netem_is_missing_and_changes_nothing(veth_ns, no_leaks):
    assert run_cli("link", "va", "--netns", veth_ns, "--rate", "10mbit").returncode == 0
    for extra in (["--delay", "2ms"], ["--delay", "2ms", "--jitter", "1ms"], ["--rate", "20mbit", "--delay", "5ms"]):
        assert_one_line_error(run_cli("link", "va", "--netns", veth_ns, *extra), "netem")
    assert _show(veth_ns)["rate_bps"] == 10_000_000  # the refused call left the link as it was


@needs_root
@pytest.mark.parametrize("args,needle", [
    (["--rate", "10parsecs"], "unknown unit"),
    (["--rate=-1mbit"], "greater than zero"),
    (["--rate", "-1mbit"], "--option=VALUE"),
    (["--rate", "0"], "greater than zero"),
    (["--rate", "0kbit"], "greater than zero"),
    (["--loss", "101%"], "between 0% and 100%"),
    (["--loss=-1%"], "between 0% and 100%"),
    (["--loss", "lots"], "bad percentage"),
    (["--delay", "5lightyears"], "unknown unit"),
    (["--delay=-2ms"], "must not be negative"),
    (["--jitter", "1ms"], "needs --delay"),
    ([], "nothing to do"),
    (["--show", "--rate", "1mbit"], "take no"),
    (["--show", "--clear"], "not allowed with"),
])
def test_bad_values_are_one_line_errors(args, needle, veth_ns, no_leaks):
    assert_one_line_error(run_cli("link", "va", "--netns", veth_ns, *args), needle)
    assert "htb" not in _tc_qdiscs(veth_ns)


@needs_root
def test_missing_interface_and_namespace(veth_ns, no_leaks):
    assert_one_line_error(run_cli("link", "nosuch0", "--netns", veth_ns, "--rate", "1mbit"), "no interface 'nosuch0'")
    assert_one_line_error(run_cli("link", "nosuch0", "--netns", veth_ns, "--show"), "no interface")
    assert_one_line_error(run_cli("link", "va", "--netns", "inc-no-such-ns", "--rate", "1mbit"),
                          "does not exist")
