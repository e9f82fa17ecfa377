"""The command line as a whole: what start-up imports, one error style for every subcommand, help
texts, ``nicd --check`` and the flags of every config key, ``stats --watch``, ``link``'s guards
(root namespace, bytes-per-second units) and the one error-bound range.

The CLI runs as a subprocess, as a user runs it. Nothing here shapes or filters a root-namespace
interface: the root-namespace test only checks the refusal, which touches nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from cli_helpers import CLI, assert_one_line_error, run_cli
from netns_helpers import needs_root
from inceptionn.cli import build_parser
from inceptionn.daemon.config import FIELDS
from inceptionn.limits import ERROR_BOUND_MAX, ERROR_BOUND_MIN

HEAVY = {"numpy", "pyroute2", "cffi", "torch"}

# Runs the CLI in-process and reports which top-level modules it imported.
PROBE = """
import json, sys
from inceptionn.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\nIMPORTED=" + json.dumps(sorted({m.split(".")[0] for m in sys.modules})) + "\\n")
"""


def imported_by(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    line = [x for x in r.stderr.splitlines() if x.startswith("IMPORTED=")]
    assert line, r.stderr
    return set(json.loads(line[-1][len("IMPORTED="):]))


# --- start-up -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["--version"], ["stats", "--help"], ["nicd", "--help"],
                                  ["link", "--help"], ["run", "--help"], ["demo", "--help"],
                                  ["stats", "--socket", "/nonexistent/nicd.sock"],
                                  ["nicd", "--check", "-i", "lo"]],
                         ids=lambda a: " ".join(a))
def test_light_commands_import_nothing_heavy(args):
    assert imported_by(*args) & HEAVY == set()


def test_the_probe_sees_heavy_imports():
    # bench's options come from modules that import numpy: the probe must notice
    assert "numpy" in imported_by("bench", "--help")


# --- one error style ------------------------------------------------------------------------------

ARGPARSE_ERRORS = [
    (["nicd", "--tos", "40x"], ["argument --tos", "'40x'", "(see inceptionn nicd --help)"]),
    (["nicd", "--check", "--queues", "two"], ["--queues", "expected a whole number", "inceptionn nicd --help"]),
    (["link", "eth0", "--rate", "100", "mbit"], ["unrecognized arguments: mbit", "(see inceptionn link --help)"]),
    (["bench", "tiers", "--bogus"], ["--bogus", "(see inceptionn bench tiers --help)"]),
    (["bench"], ["BENCH", "(see inceptionn bench --help)"]),
    (["testbed", "up"], ["--hosts", "(see inceptionn testbed up --help)"]),
    (["train", "--hosts", "x"], ["expected a whole number, got 'x'", "(see inceptionn train --help)"]),
    (["train", "--lr", "fast"], ["expected a number", "(see inceptionn train --help)"]),
    (["stats", "--watch", "0"], ["--watch", "(see inceptionn stats --help)"]),
    (["demo", "--epochs"], ["--option=VALUE", "inceptionn demo --help"]),
    (["run", "--tag"], ["--tag", "inceptionn run --help"]),
    (["nosuch"], ["invalid choice: 'nosuch'", "(see inceptionn --help)"]),
    ([], ["COMMAND", "(see inceptionn --help)"]),
]


@pytest.mark.parametrize("args,needles", ARGPARSE_ERRORS, ids=[" ".join(a) or "-" for a, _ in ARGPARSE_ERRORS])
def test_argparse_errors_are_one_line_naming_the_subcommand(args, needles):
    line = assert_one_line_error(run_cli(*args), *needles)
    assert "usage:" not in line and "_int_auto" not in line and "invalid int value" not in line


def _parsers(parser=None):
    """Every parser of the CLI, subcommands' and their actions' included (filled in)."""
    parser = parser or build_parser()
    parser.format_help()  # fills deferred options
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_help_texts_plain_with_descriptions_and_defaults():
    seen = []
    for p in _parsers():
        seen.append(p.prog)
        text = p.format_help()
        assert "``" not in text, p.prog
        assert p.description, f"{p.prog} has no description"
        for a in p._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS:
                continue
            assert a.help, f"{p.prog} {a.option_strings[-1]} has no help"
            if a.default not in (None, False, argparse.SUPPRESS):
                assert "default" in a.help, f"{p.prog} {a.option_strings[-1]}: default {a.default!r} not said"
            if "--json" in a.option_strings:
                assert "-j" in a.option_strings, f"{p.prog} --json has no -j"
    assert {"inceptionn bench tiers", "inceptionn testbed up", "inceptionn nicd", "inceptionn train"} <= set(seen)


# --- nicd --check and a flag for every config key ---------------------------------------------------

ALL_FLAGS = ["-i", "lo", "--tos", "0x20", "--tos-scaled", "0x1c", "--tos-compressed", "0x34", "--tos-hello", "0x38", "--codec", "inceptionn",
             "--error-bound", "-8", "--queues", "2", "--queue-base", "7300", "--queue-maxlen", "1024",
             "--flow-timeout", "60", "--flow-capacity", "4096", "--flow-owner-cap", "512", "--log-level", "debug",
             "--socket", "/run/inceptionn/other.sock", "--accept-only", "--gso", "--no-trains",
             "--metrics-textfile", "/var/lib/prometheus/node-exporter/inceptionn.prom", "--metrics-interval", "30"]
ALL_VALUES = {"interfaces": ["lo"], "tos": 0x20, "tos_scaled": 0x1c, "tos_compressed": 0x34, "tos_hello": 0x38,
              "codec": "inceptionn",
              "error_bound": -8, "queues": 2, "queue_base": 7300, "queue_maxlen": 1024, "flow_timeout": 60,
              "flow_capacity": 4096, "flow_owner_cap": 512, "log_level": "debug", "socket": "/run/inceptionn/other.sock", "accept_only": True,
              "gso": True, "trains": False, "metrics_textfile": "/var/lib/prometheus/node-exporter/inceptionn.prom",
              "metrics_interval": 30}


def check_json(*args: str) -> dict:
    r = run_cli("nicd", "--check", *args, "-j")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_config_key_has_a_flag_and_check_prints_it():
    assert set(ALL_VALUES) == FIELDS  # the lists above cover every key
    assert check_json(*ALL_FLAGS) == ALL_VALUES


def test_check_prints_a_config_nicd_reads_back(tmp_path):
    r = run_cli("nicd", "--check", *ALL_FLAGS)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("# effective nicd config: ")
    assert "tos_compressed = 0x34\n" in r.stdout  # marks stay in hex
    f = tmp_path / "nicd.toml"
    f.write_text(r.stdout)
    assert check_json("--config", str(f)) == ALL_VALUES


def test_flags_override_the_file(tmp_path):
    f = tmp_path / "nicd.toml"
    f.write_text('interfaces = ["lo"]\nerror_bound = -8\nflow_timeout = 30\n')
    cfg = check_json("--config", str(f), "--error-bound", "-6")
    assert (cfg["error_bound"], cfg["flow_timeout"]) == (-6, 30)


@pytest.mark.parametrize("args,needles", [
    (["-i", "lo", "--flow-timeout", "0"], ["--flow-timeout: flow_timeout", "1 to 604800"]),
    (["-i", "lo", "--queue-maxlen", "8"], ["--queue-maxlen: queue_maxlen"]),
    (["-i", "lo", "--tos-hello", "0x28"], ["--tos-hello: tos_hello", "same mark"]),
    (["-i", "lo", "--tos-compressed", "0x2d"], ["tos_compressed", "ECN"]),
    (["-i", "ntnone0"], ["interface 'ntnone0' does not exist"]),
    (["-i", "lo", "--cleanup"], ["--check and --cleanup"]),
    (["--config", "/nonexistent/nicd.toml"], ["cannot read config /nonexistent/nicd.toml"]),
])
def test_check_refuses_with_one_line(args, needles):
    r = run_cli("nicd", "--check", *args)
    assert_one_line_error(r, *needles)
    assert r.stdout == ""


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare(1) to drop root")
def test_check_needs_no_root():
    # a user namespace where this process is uid 1000: nicd itself refuses, --check works
    as_user = ["unshare", "--user", "--map-user=1000", "--map-group=1000", CLI, "nicd", "-i", "lo"]
    r = subprocess.run(as_user + ["--check", "-j"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["interfaces"] == ["lo"]
    r = subprocess.run(as_user, capture_output=True, text=True, timeout=60)
    assert_one_line_error(r, "nicd needs CAP_NET_ADMIN")


# --- stats: --watch, -j, per queue -------------------------------------------------------------------

def _read_line(stream, timeout: float) -> str:
    import select

    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "no output in time"
    return stream.readline()


@needs_root
def test_stats_watch_until_ctrl_c(tb_name, tmp_path):
    from inceptionn.daemon.launch import nicd
    from inceptionn.daemon.stats import format_stats
    from inceptionn.kernel_tc.testbed import Testbed

    sock = str(tmp_path / "h1.sock")
    watches = []

    def watch(*args):
        watches.append(subprocess.Popen([CLI, "stats", "--socket", sock, "--watch", "0.2", *args], text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        return watches[-1]

    def ctrl_c(proc) -> str:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err  # Ctrl-C is how --watch ends: not an error
        assert "Traceback" not in err and "interrupted" not in err
        return err

    with Testbed(hosts=1, name=tb_name) as tb:
        try:
            with nicd(tb.hosts[0], sock, -10) as daemon:
                js = watch("-j")
                docs = [json.loads(_read_line(js.stdout, 10)) for _ in range(3)]  # one JSON document a line
                assert all(d["pid"] == daemon.pid for d in docs)
                assert docs[0]["uptime_s"] < docs[1]["uptime_s"] < docs[2]["uptime_s"]  # read afresh each time
                ctrl_c(js)

                text = watch()  # a header and the counters per sample
                assert _read_line(text.stdout, 10).startswith("every 0.2 s: inceptionn stats, ")
                assert _read_line(text.stdout, 10).startswith(f"nicd pid {daemon.pid}")
            # the daemon gone (a restart, say), the watch says so and keeps watching
            said = _read_line(text.stderr, 10)
            if "no nicd is running" not in said and "went away" not in said:
                text.kill()
                raise AssertionError(said + text.stderr.read())
            assert text.poll() is None
            ctrl_c(text)
        finally:
            for proc in watches:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        # a new watch with nothing to watch (a wrong path, say) is an error at once
        assert_one_line_error(run_cli("stats", "--socket", sock, "--watch", "1"), "no nicd is running")

        # the daemon reports each queue pair's own counters, and stats prints a line per pair
        snap = docs[-1]
        assert [(q["egress_queue"], q["ingress_queue"]) for q in snap["queues"]] == [(7100, 7101)]
        assert snap["queues"][0]["counters"] == snap["counters"]  # one pair: its counters are the totals
        line = format_stats(snap).splitlines()[-1]
        assert line.startswith("queue 7100/7101: egress 0 packets (0 compressed), ingress ")


def test_stats_text_shows_every_counter():
    """The text view leaves no counter out: each one, given a value no other has, appears in it
    (the tiers as their shares)."""
    from inceptionn.daemon.datapath import COUNTERS
    from inceptionn.daemon.stats import format_stats

    values = {name: 1_000_003 + 7_919 * i for i, name in enumerate(COUNTERS)}
    snap = {"pid": 1, "uptime_s": 2.0, "flows_active": 3, "flows_expired": 4, "counters": values,
            "config": {"interfaces": ["eth0"], "codec": "inceptionn", "error_bound": 10, "queues": 1, "gso": True},
            "queues": []}
    words = set(format_stats(snap).replace("(", " ").replace(")", " ").replace(",", " ").replace(";", " ").split())
    missing = [n for n, v in values.items() if str(v) not in words and not n.startswith("tier")]
    assert not missing, f"counters the text view leaves out: {missing}"


# --- link: the root namespace and tc's bytes units -------------------------------------------------

def _qdiscs(dev: str) -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout


NO_SUCH_IFACE = "incnone0"  # never shape a real interface of this machine, even by mistake


@pytest.mark.skipif(not shutil.which("tc"), reason="needs tc to read the qdiscs back")
@pytest.mark.parametrize("extra", [["--rate", "1mbit"], ["--loss", "50%"], ["--rate", "100mbps"]])
def test_link_refuses_the_root_namespace_without_force(extra):
    # An interface name that does not exist: the guard comes first, and if it ever regressed the
    # command would fail on the missing interface instead of shaping this machine's own link.
    before = _qdiscs("lo")
    r = run_cli("link", NO_SUCH_IFACE, *extra)
    assert_one_line_error(r, "root network namespace", "--force", "--netns")
    assert "warning" not in r.stderr  # refused before anything else is said or done
    assert _qdiscs("lo") == before


@needs_root
def test_link_refuses_a_named_namespace_that_is_the_root_one():
    # a name for this very namespace; not inc-*, whose processes testbed cleanups stop
    name = f"cliroot{os.getpid()}"
    subprocess.run(["ip", "netns", "attach", name, str(os.getpid())], check=True)
    try:
        before = _qdiscs("lo")
        assert_one_line_error(run_cli("link", NO_SUCH_IFACE, "--netns", name, "--rate", "1mbit"),
                              f"namespace '{name}' is the machine's root network namespace", "--force")
        assert _qdiscs("lo") == before
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)
    assert not os.path.exists(f"/run/netns/{name}")


@needs_root
def test_link_inside_a_namespace_and_the_mbps_warning(veth_ns):
    # no --netns: the command itself runs in the test namespace, which is not the root one
    r = subprocess.run(["ip", "netns", "exec", veth_ns, CLI, "link", "va", "--rate", "100mbps", "-j"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    warning = r.stderr.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("inceptionn: warning: --rate 100mbps means megabytes"), r.stderr
    assert "800mbit" in warning[0] and "write 100mbit" in warning[0]
    assert json.loads(r.stdout)["rate_bps"] == 800_000_000
    r = run_cli("link", "va", "--netns", veth_ns, "--rate", "100mbit")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # bit units: no warning
    assert run_cli("link", "va", "--netns", veth_ns, "--clear").returncode == 0


# --- one error-bound range -------------------------------------------------------------------------

def test_error_bound_range_is_the_codecs_everywhere():
    from inceptionn.codecs import get_codec
    from inceptionn.codecs._native import lib
    from inceptionn.errors import UserError
    from inceptionn.train.job import TrainConfig

    assert (ERROR_BOUND_MIN, ERROR_BOUND_MAX) == (lib.INC_MIN_ERROR_BOUND, lib.INC_MAX_ERROR_BOUND)
    for k in (ERROR_BOUND_MIN - 1, ERROR_BOUND_MIN, ERROR_BOUND_MAX, ERROR_BOUND_MAX + 1):
        ok = ERROR_BOUND_MIN <= k <= ERROR_BOUND_MAX
        try:
            get_codec("inceptionn", error_bound=k)
            codec_ok = True
        except ValueError:
            codec_ok = False
        try:
            TrainConfig(algo="inc", compress="nic", error_bound=k).check()
            train_ok = True
        except UserError as exc:
            assert f"from {ERROR_BOUND_MIN} to {ERROR_BOUND_MAX}" in str(exc)
            train_ok = False
        r = run_cli("nicd", "--check", "-i", "lo", "--error-bound", str(k))
        if r.returncode != 0:
            assert_one_line_error(r, f"from {ERROR_BOUND_MIN} to {ERROR_BOUND_MAX}")
        assert (codec_ok, train_ok, r.returncode == 0) == (ok, ok, ok), k


def test_on_off_setting_flags_override_the_file_both_ways(tmp_path):
    """trains (kind "onoff"): --trains and --no-trains each beat the file; neither given, the file
    decides, and without it the table's default."""
    from inceptionn.daemon.config import NicdConfig

    for written in (True, False):
        f = tmp_path / "nicd.toml"
        f.write_text(f'interfaces = ["lo"]\ntrains = {str(written).lower()}\n')
        assert check_json("--config", str(f))["trains"] is written
        assert check_json("--config", str(f), "--trains")["trains"] is True
        assert check_json("--config", str(f), "--no-trains")["trains"] is False
    assert check_json("-i", "lo")["trains"] is NicdConfig().trains


def test_nicd_help_names_the_config_defaults():
    import re

    from inceptionn.daemon.config import NicdConfig

    nicd = next(p for p in _parsers() if p.prog == "inceptionn nicd")
    flags = {a.option_strings[-1]: a for a in nicd._actions}
    for key in FIELDS - {"interfaces", "accept_only", "gso", "trains", "metrics_textfile"}:  # off unless given
        default = getattr(NicdConfig(), key)
        said = re.search(r"\(default ([^,)]+)", flags[f"--{key.replace('_', '-')}"].help).group(1)
        assert said == (f"{default:#04x}" if key.startswith("tos") else str(default)), key
    assert f"(default {'on' if NicdConfig().trains else 'off'})" in flags["--no-trains"].help


def test_mpirun_takes_j_for_json_too():
    # mpirun's options are parsed by the wrapper itself (all others go to OpenMPI's mpirun)
    args = ["--tag", "port=23000-23099", "--dry-run", "-np", "2", "--", "true"]
    long, short = run_cli("mpirun", *args[:3], "--json", *args[3:]), run_cli("mpirun", *args[:3], "-j", *args[3:])
    assert long.returncode == short.returncode == 0, (long.stderr, short.stderr)
    assert json.loads(short.stdout) == json.loads(long.stdout)
