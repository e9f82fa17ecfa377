"""``inceptionn mpirun``: a real OpenMPI job over 4 testbed hosts in which exactly the designated
sockets carry ToS 0x24 (the shim's default).

The job (tests/shim_progs/mpi_grad.c) has no tagging code: after MPI_Init it opens a ring of plain
TCP connections on ports 23000+rank and moves float32 values both ways on each, between
MPI_Allreduce calls that run over MPI's TCP BTL. The soft NIC runs on h1 and h2 only, so one
ring link (h1 <-> h2) is compressed and restored, the others leave tagged but raw. Every packet a
host sends is counted by DSCP and port in its namespace (iptables, mangle OUTPUT: what the host's
stack emits, before the soft NIC rewrites anything).

Needs root, OpenMPI (mpirun, mpicc) and iptables.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_helpers import CLI, assert_one_line_error, run_cli
from inceptionn.cli import main
from inceptionn.daemon.stats import read as read_stats
from inceptionn.shim.contract import TOS_SCALED
from inceptionn.kernel_tc import testbed

PROGS = Path(__file__).resolve().parent / "shim_progs"
GRAD = (23000, 23099)          # the gradient sockets: the tag policy
BTL = (61000, 61099)           # MPI's TCP BTL listeners: the wrapper's default --btl-ports
NFLOATS = 1 << 19              # per direction and connection (2 MiB)
DSCP = TOS_SCALED >> 2  # the shim's default mark (raw gradients: the soft NIC scales them)
COMPRESSED = 0x2C >> 2  # what the soft NIC sends: with gso (its default) through a raw socket,
                        # so its compressed packets cross OUTPUT too, after their tagged original

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("mpirun", "mpicc", "iptables-restore")),
    reason="needs root, OpenMPI (mpirun, mpicc) and iptables")


@pytest.fixture(scope="module")
def mpi_grad(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("mpi") / "mpi_grad"
    subprocess.run(["mpicc", "-O2", "-Wall", "-Wextra", "-pthread", str(PROGS / "mpi_grad.c"), "-o", str(out)], check=True)
    return str(out)


def install_counters(host) -> None:
    g, b = f"{GRAD[0]}:{GRAD[1]}", f"{BTL[0]}:{BTL[1]}"
    rules = [
        f"-p tcp -m multiport --ports {g} -m dscp --dscp {DSCP} -m comment --comment grad-tag",
        f"-p tcp -m multiport --ports {g} -m dscp ! --dscp {DSCP} -m dscp ! --dscp {COMPRESSED} "
        "-m comment --comment grad-plain",
        f"-p tcp -m multiport --ports {b} -m dscp --dscp {DSCP} -m comment --comment btl-tag",
        f"-p tcp -m multiport --ports {b} -m dscp ! --dscp {DSCP} -m comment --comment btl-plain",
        f"-p tcp -m dscp --dscp {DSCP} -m comment --comment tcp-tag",
        "-p tcp -m comment --comment tcp-all",
    ]
    text = "*mangle\n" + "".join(f"-A OUTPUT {r}\n" for r in rules) + "COMMIT\n"
    host.run(["iptables-restore", "-w", "5", "--noflush"], input=text, text=True, check=True)


def counters(host) -> dict[str, int]:
    out = host.run(["iptables-save", "-c", "-t", "mangle"], capture_output=True, text=True, check=True).stdout
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"^\[(\d+):\d+\] .*--comment \"?([\w-]+)\"?", out, re.M)}


@contextlib.contextmanager
def nicds(hosts, tmp_path):
    """The soft NIC in each of ``hosts`` until the block ends (SIGTERM removes its rules);
    yields their stats sockets."""
    procs, socks = [], []
    try:
        for h in hosts:
            sock, log = tmp_path / f"{h.name}.sock", tmp_path / f"nicd-{h.name}.log"
            with open(log, "wb") as logf:
                procs.append((h.popen([CLI, "nicd", "-i", h.ifname, "--socket", str(sock)], stdout=logf, stderr=logf), log))
            socks.append(sock)
        deadline = time.monotonic() + 60
        for proc, log in procs:
            while b"nicd: ready" not in log.read_bytes():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield socks
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cli_error(capsys, *argv: str) -> str:
    """Run the CLI's main() in this process (no interpreter start-up per case) on arguments that
    must fail before anything is launched; returns its one error line."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, (rc, err)
    assert err.startswith("inceptionn: error: "), err
    return err.strip()


def test_mpirun_tags_exactly_the_gradient_sockets(tb_name, tmp_path, mpi_grad):
    with testbed.Testbed(hosts=4, name=tb_name) as tb:
        for h in tb.hosts:
            install_counters(h)
        h1, h2, h3, h4 = tb.hosts
        taglog = tmp_path / "tag.log"
        with nicds([h1, h2], tmp_path) as (sock1, sock2):
            started = time.monotonic()
            r = run_cli("mpirun", "--tag", f"port={GRAD[0]}-{GRAD[1]}", "--log", f"1:{taglog}", "--testbed", tb_name,
                        "-np", "4", "--", mpi_grad, "eth0", str(GRAD[0]), str(NFLOATS), timeout=240)
            took = time.monotonic() - started
            assert r.returncode == 0, (r.stdout, r.stderr)
            c1, c2 = read_stats(str(sock1))["counters"], read_stats(str(sock2))["counters"]
        print(f"\nmpirun job over 4 hosts: {took:.1f} s\n{r.stderr}{r.stdout}")

        # the report, before launch: the soft NIC runs on h1 and h2 only
        report = r.stderr.splitlines()
        assert report[0].startswith(f"inceptionn mpirun: testbed {tb_name}, 4 host(s); tag policy port=23000-23099")
        for h, running in ((h1, True), (h2, True), (h3, False), (h4, False)):
            line = next(ln for ln in report if ln.split()[:2] == [h.name, h.ip])
            assert ("soft NIC running (eth0" in line) == running, line

        # every rank on its own host; its two gradient sockets and its listener tagged; data intact
        ranks = [ln for ln in r.stdout.splitlines() if ln.startswith("rank ")]
        assert sorted(ranks) == [f"rank {i} host h{i + 1} out_tos 0x24 in_tos 0x24 listen_tos 0x24 ok" for i in range(4)]
        assert r.stdout.splitlines()[-1] == "all ok"

        # the packets: on every host, gradient ports always tagged, MPI's never, nothing else tagged
        other_plain = 0
        for h in tb.hosts:
            c = counters(h)
            where = f"{h.name}: {c}"
            assert c["grad-tag"] > 0 and c["grad-plain"] == 0, where
            assert c["btl-tag"] == 0 and c["btl-plain"] > 0, where
            assert c["tcp-tag"] == c["grad-tag"], where
            other_plain += c["tcp-all"] - c["grad-tag"] - c["btl-plain"]
        assert other_plain > 0   # MPI's out-of-band and PMIx traffic, also untagged

        # the library's own account: 4 listeners, 4 connects, 4 accepts, all on gradient ports
        tagged = [ln for ln in taglog.read_text().splitlines() if ": tagged fd" in ln]
        events = sorted(re.search(r"\((listen|connect|accept)", ln).group(1) for ln in tagged)
        assert events == ["accept"] * 4 + ["connect"] * 4 + ["listen"] * 4, tagged
        assert all(re.search(r"port=23000-23099\)$", ln) for ln in tagged)

        # end to end: the h1 <-> h2 link went through both soft NICs, compressed both ways
        for c in (c1, c2):
            assert c["egress_compressed"] > 0 and c["ingress_restored"] > 0, c
            assert c["egress_raw_not_negotiated"] > 0, c   # toward h3 / from h4: no soft NIC there
        assert not any(v for k, v in c1.items() if k.startswith("drop_")), c1


def test_mpirun_on_one_host_and_dry_run(tb_name, mpi_grad):
    with testbed.Testbed(hosts=2, name=tb_name) as tb:
        h1 = tb.hosts[0]
        # without --testbed: the real mpirun on this host (here: inside h1), interface chosen
        r = h1.run([CLI, "mpirun", "--tag", f"rport={GRAD[0]}-{GRAD[1]}", "--iface", "eth0", "-np", "2", "--",
                    mpi_grad, "eth0", str(GRAD[0]), "4096"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "this host only" in r.stderr and "soft NIC not running" in r.stderr
        ranks = sorted(ln.split(" host ")[1].split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("rank "))
        # rport: the connecting socket is tagged, the accepted one and the listener are not
        assert ranks == ["out_tos 0x24 in_tos 0x00 listen_tos 0x00 ok"] * 2

        r = run_cli("mpirun", "--tag", "port=40000-40010", "--testbed", tb_name, "--dry-run", "--json",
                    "--mca", "btl_tcp_if_include", "eth0", "-np", "2", "--", "/bin/true")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        assert [(h["name"], h["address"], h["nic"]["state"]) for h in plan["hosts"]] == \
            [("h1", h1.ip, "stopped"), ("h2", tb.hosts[1].ip, "stopped")]
        argv = plan["mpirun"]
        mca = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
        assert mca["pml"] == "ob1" and "tcp" in mca["btl"].split(",")
        assert mca["btl_tcp_port_min_v4"] == str(BTL[0]) and mca["btl_tcp_port_range_v4"] == "100"
        assert mca["oob_tcp_if_include"] == "198.18.0.0/24" and mca["plm_rsh_no_tree_spawn"] == "1"
        assert argv.count("btl_tcp_if_include") == 1 and argv[argv.index("btl_tcp_if_include") + 1] == "eth0"  # the user's wins
        assert "INCEPTIONN_TAG=port=40000-40010,tos=0x24,override=keep" in argv
        assert argv[argv.index("--host") + 1] == f"{h1.ip}:1,{tb.hosts[1].ip}:1"
        assert plan["argv"][:4] == ["ip", "netns", "exec", h1.netns]
        assert plan["env"]["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
        # 40000-40010 lies in the hosts' ephemeral range (32768-60999): a warning, not an error
        assert len(plan["warnings"]) == 1 and "ephemeral port range 32768-60999" in plan["warnings"][0]

        # more testbed ranks than this machine's cores: they yield instead of busy-polling
        cores = len(os.sched_getaffinity(0))
        assert ("mpi_yield_when_idle" in mca) == (2 > cores)
        r = run_cli("mpirun", "--tag", "none", "--testbed", tb_name, "--slots", str(cores), "--dry-run", "--json",
                    "--", "/bin/true")
        argv = json.loads(r.stdout)["mpirun"]
        assert argv[argv.index("mpi_yield_when_idle") + 1] == "1", argv


def test_nic_status_reads_the_daemons_rules(tb_name, tmp_path):
    """The report's per-host state, from the rules and bound queues of each namespace (read by
    daemon/rules.py): running, stale after a crash (rules left, queues unread), stopped after a
    clean stop (only the fail-closed drops are left), stopped where no daemon ever ran."""
    from inceptionn.daemon.rules import nic_status
    with testbed.Testbed(hosts=2, name=tb_name) as tb:
        h1, h2 = tb.hosts
        log = tmp_path / "nicd.log"
        with open(log, "wb") as logf:
            proc = h1.popen([CLI, "nicd", "-i", h1.ifname, "--queues", "2", "--socket", str(tmp_path / "s")],
                            stdout=logf, stderr=logf)
        try:
            deadline = time.monotonic() + 60
            while b"nicd: ready" not in log.read_bytes():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            st = nic_status(h1)
            assert (st["state"], st["queues"], st["interfaces"]) == ("running", [7100, 7101, 7102, 7103], ["eth0"]), st
            assert st["detail"] == "soft NIC running (eth0; queues 7100-7103)"
            assert st["ephemeral_ports"] == [32768, 60999]
        finally:
            proc.kill()   # a crash: the rules stay, nobody reads their queues
            proc.wait()
        st = nic_status(h1)
        assert st["state"] == "stale" and "no daemon reads queues 7100, 7101, 7102, 7103" in st["detail"], st
        r = h1.run([CLI, "nicd", "--cleanup"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "inceptionn-failclosed" in h1.run(["iptables-save", "-t", "raw"], capture_output=True, text=True).stdout
        st = nic_status(h1)   # the drops alone are no daemon
        assert (st["state"], st["queues"]) == ("stopped", []), st
        assert nic_status(h2)["state"] == "stopped"


@pytest.mark.parametrize("args,needle", [
    (["--tag", "all", "--", "true"], "--tag all would tag MPI's own TCP sockets"),
    (["--tag", "net=198.18.0.0/24", "--", "true"], "--tag net= would tag MPI's own"),
    (["--tag", "port=61050", "--", "true"], "overlaps the ports of MPI's TCP BTL (61000-61099)"),
    (["--tag", "port=5000", "--btl-ports", "4990-5010", "--", "true"], "overlaps the ports of MPI's TCP BTL (4990-5010)"),
    (["--tag", "rport=5000", "--mca", "btl_tcp_port_min_v4", "4999", "--", "true"], "overlaps the ports of MPI's TCP BTL (4999-"),
    (["--tag", "port=5000", "-np", "2", "true"], "put -- before the program"),
    (["--tag", "port=5000", "--"], "no program after --"),
    (["--tag", "bogus", "--", "true"], "bad tag policy 'bogus'"),
    (["--tag", "port=5000", "-x", "LD_PRELOAD=/x.so", "--", "true"], "do not pass -x LD_PRELOAD"),
    (["--tag", "port=5000", "--json", "--", "true"], "--json goes with --dry-run"),
    (["--tag", "port=5000", "--slots", "2", "--", "true"], "--slots goes with --testbed"),
    (["--tag", "port=5000", "--btl-ports", "9-5", "--", "true"], "bad --btl-ports"),
    (["--tag", "port=5000", "--mpirun", "/bin/echo", "--", "true"], "is not OpenMPI's mpirun"),
    (["--tag", "port=5000", "--testbed", "nosuchtb", "--", "true"], "no testbed 'nosuchtb' is up"),
    (["--tag"], "--tag needs a value"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_mpirun_errors_are_one_line(args, needle, capsys):
    assert needle in cli_error(capsys, "mpirun", *args)


def test_mpirun_errors_through_the_console_script(monkeypatch):
    monkeypatch.delenv("INCEPTIONN_TAG", raising=False)
    assert_one_line_error(run_cli("mpirun", "-np", "2", "--", "true"), "mpirun needs --tag POLICY")
    assert_one_line_error(run_cli("mpirun", "--tag", "all", "--", "true"), "--tag all would tag MPI's own")


def test_help(capsys):
    assert main(["mpirun", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: inceptionn mpirun")
    for opt in ("--tag", "--log", "--testbed", "--slots", "--iface", "--btl-ports", "--mpirun", "--dry-run", "--json"):
        assert f"  {opt}" in out, opt
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "    run " in top and "    mpirun " in top
