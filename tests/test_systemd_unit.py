"""The systemd unit as a file: it verifies, its exposure score stays low, and its ExecStart /
ExecStopPost command lines, run exactly as written (the installed binary and config mapped to this
checkout), start the daemon and clean up after a crash. The unit under a real systemd, installed
by `make install-service`: tests/test_systemd_nspawn.py."""
import configparser
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path


from inceptionn.daemon.nicd import wait_ready
from inceptionn.kernel_tc import testbed

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "inceptionn-nicd.service"
VENV_BIN = Path(sys.executable).parent
INSTALLED_BIN = "/opt/inceptionn/bin/inceptionn"  # the venv `make install-service` builds


def unit_commands(key):
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str
    parser.read(UNIT)
    return parser["Service"][key].splitlines()


def test_unit_verifies():
    r = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    if not os.path.exists(INSTALLED_BIN):  # before make install-service only this may be missing
        problems = [p for p in problems if f"Command {INSTALLED_BIN} is not executable" not in p]
    assert problems == [], problems


def test_exposure_score_is_low():
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNIT)], capture_output=True, text=True)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    score = float(m.group(1))
    print(f"systemd-analyze security --offline=yes: exposure {score}")
    assert score <= 2.0


def as_written(line, config):
    """The unit's command line with the installed paths mapped to this checkout."""
    argv = shlex.split(line.lstrip("-+"))
    return [str(VENV_BIN / "inceptionn") if a == INSTALLED_BIN else
            str(config) if a == "/etc/inceptionn/nicd.toml" else a for a in argv]


def test_execstart_and_execstoppost_as_written(tmp_path):
    start = unit_commands("ExecStart")
    stop_post = unit_commands("ExecStopPost")
    assert len(start) == 1 and len(stop_post) == 1
    with testbed.Testbed(hosts=1, name="unit") as tb:
        h = tb.hosts[0]
        config = tmp_path / "nicd.toml"
        config.write_text(f'interfaces = ["{h.ifname}"]\nsocket = "{tmp_path}/nicd.sock"\n')
        daemon = h.popen(as_written(start[0], config), stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(daemon)
            rules = h.run(["iptables-save", "-t", "mangle"], capture_output=True, text=True, check=True).stdout
            assert rules.count("inceptionn-nicd") >= 4
            daemon.send_signal(signal.SIGKILL)  # a crash: the daemon cannot remove its rules
            daemon.wait(10)
            rules = h.run(["iptables-save", "-t", "mangle"], capture_output=True, text=True, check=True).stdout
            assert "inceptionn-nicd" in rules
            h.run(as_written(stop_post[0], config), check=True, capture_output=True)
            rules = h.run(["iptables-save", "-t", "mangle"], capture_output=True, text=True, check=True).stdout
            assert "inceptionn-nicd" not in rules and "NFQUEUE" not in rules
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(10)
