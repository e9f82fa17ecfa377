"""A throwaway Slurm cluster on a testbed: munged and slurmctld in the last host's namespace, one
slurmd in each of the others (node names h1, h2, ... as their UTS host names), everything on
testbed addresses, every file in one temporary directory. Never a machine-wide service: the
daemons run in the foreground as children of the test, inside namespaces the test created, and
the testbed's teardown kills every process left in them (slurmstepd included).

Measured here, and why the layout is what it is:
- Each daemon enters its namespace with ``nsenter --net`` and not ``ip netns exec``: the latter
  remounts /sys for the namespace, which hides /sys/fs/cgroup, and slurmd 22.05 then refuses to
  start ("Unable to initialize cgroup plugin"; its cgroup.conf has no "disabled" yet). With
  proctrack/pgid and task/none it creates no cgroup.
- Each slurmd reads its own copy of slurm.conf (identical) beside its own mpi.conf: the PMIx
  plugin puts a per-step directory under PMIxCliTmpDirBase (default /tmp), and nodes sharing a
  file system collide on it ("spmix_appdir_0_2.0: File exists").
- One munged serves all: its socket is a file, which every network namespace reaches.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SLURM_TOOLS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo", "munged")

CONF = """\
ClusterName=inceptionn
SlurmctldHost={ctl_name}({ctl_ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
{nodes}
PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """``with SlurmCluster(tb) as sc: sc.run(["srun", ...])``: nodes are tb.hosts[:-1], the
    controller tb.hosts[-1]. ``run`` starts a client command inside the first node's namespace."""

    def __init__(self, tb):
        self.tb = tb
        self.nodes = tb.hosts[:-1]
        self.ctl = tb.hosts[-1]
        self.dir = Path(tempfile.mkdtemp(prefix="inceptionn-slurm-"))
        self.procs: list[subprocess.Popen] = []
        self.conf = self.dir / "slurm.conf"

    def _daemon(self, host, hostname: str | None, argv: list[str], log: str) -> None:
        prefix = ["nsenter", f"--net=/run/netns/{host.netns}"]
        if hostname:
            prefix += ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
        with open(self.dir / log, "wb") as out:
            self.procs.append(subprocess.Popen([*prefix, *argv], stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def __enter__(self) -> "SlurmCluster":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        d.chmod(0o711)                       # munged wants its socket's directory searchable
        (d / "ctld").mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        nodes = "\n".join(f"NodeName={h.name} NodeAddr={h.ip} CPUs=1 State=UNKNOWN" for h in self.nodes)
        text = CONF.format(d=d, ctl_name=self.ctl.name, ctl_ip=self.ctl.ip, nodes=nodes,
                           names=",".join(h.name for h in self.nodes))
        self.conf.write_text(text)
        self._daemon(self.ctl, None, ["munged", "-F", "--force", f"--socket={d}/munge.sock", f"--key-file={key}",
                                      f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                                      f"--seed-file={d}/munged.seed"], "munged.out")
        self._wait(lambda: (d / "munge.sock").exists(), "munged")
        self._daemon(self.ctl, self.ctl.name, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        for h in self.nodes:
            conf_dir = d / "conf" / h.name
            (conf_dir / "tmp").mkdir(parents=True)
            (d / "spool" / h.name).mkdir(parents=True)
            (conf_dir / "slurm.conf").write_text(text)
            (conf_dir / "mpi.conf").write_text(f"PMIxCliTmpDirBase={conf_dir / 'tmp'}\n")
            self._daemon(h, h.name, ["slurmd", "-D", "-N", h.name, "-f", str(conf_dir / "slurm.conf")],
                         f"slurmd-{h.name}.out")
        self._wait(self._all_idle, "the nodes to be idle")

    def _all_idle(self) -> bool:
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20)
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return r.returncode == 0 and all(states.get(h.name) == "idle" for h in self.nodes)

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise AssertionError(f"slurm cluster: no {what} ({'a daemon exited' if dead else 'timeout'}):\n"
                                     + self.logs())
            time.sleep(0.3)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted(self.dir.glob("*.out")) + sorted(self.dir.glob("*.log")))

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def run(self, argv: list[str], *, env: dict | None = None, timeout: float = 180,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        """A client command (srun, sbatch, sinfo) in the first node's namespace. On a timeout, the
        command's own output and the daemons' logs (a timeout's repr would cut both short)."""
        try:
            return subprocess.run(["nsenter", f"--net=/run/netns/{self.nodes[0].netns}", *argv], capture_output=True,
                                  text=True, timeout=timeout, env=env or self.env(), cwd=cwd)
        except subprocess.TimeoutExpired as e:
            out = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else x
                            for x in (e.stdout, e.stderr) if x)
            raise AssertionError(f"no end in {timeout} s: {' '.join(argv)}\n{out[-6000:]}\n{self.logs()}") from None

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
            p.wait()
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        self.stop()
