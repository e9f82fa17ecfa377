"""A real systemd host for tests: systemd-nspawn boots this machine's own root file system under
a throw-away overlay, so the container has the same packages and this checkout at the same path,
and everything it writes (/opt, /etc, /var) lands in a tmpfs that goes away with it.

    with booted("sd1", netns="inc-tb-h1", read_only=[checkout]) as c:
        c.run(["systemctl", "start", "inceptionn-nicd"], check=True)
    # powered off, unmounted and gone here

``netns`` puts the container into an existing network namespace (a testbed host), without it the
container has a private network with only loopback. ``read_only`` directories appear at the same
path, read-only (the overlay covers the root file system only, not what is mounted on it).
Commands run through ``nsenter`` into all of the container's namespaces, with the environment of
a root login: they see its /, its systemd and its network.

Nothing stays behind: on exit the container is powered off (SIGTERM to systemd-nspawn), then the
overlay, the tmpfs, the container's cgroups and nspawn's propagation directory are removed;
``leftovers(name)`` says what of it still exists.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

# Each container's systemd-nspawn runs in a cgroup of its own (in each hierarchy systemd uses:
# unified, or the named v1 one plus unified on hybrid hosts), so two containers never share the
# "payload" cgroup nspawn creates for systemd next to its own "supervisor" one.
CGROUP_FS = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "inc-nspawn-"
LOGIN_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]
PROPAGATE_DIR = Path("/run/systemd/nspawn/propagate")


def missing_tools() -> list[str]:
    return [t for t in ("systemd-nspawn", "nsenter", "mount", "umount") if shutil.which(t) is None]


def _cgroup_dirs(name: str) -> list[Path]:
    if (CGROUP_FS / "cgroup.procs").exists():  # unified only
        roots = [CGROUP_FS]
    else:
        roots = [r for r in (CGROUP_FS / "systemd", CGROUP_FS / "unified") if (r / "cgroup.procs").exists()]
    return [r / f"{CGROUP_PREFIX}{name}" for r in roots]


def _remove_cgroup(d: Path) -> None:
    if not d.exists():
        return
    for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        sub.rmdir()
    d.rmdir()


class Container:
    def __init__(self, name: str, root: Path, proc: subprocess.Popen, console: Path):
        self.name, self.root, self.proc, self.console = name, root, proc, console
        self.pid1: int | None = None

    def command(self, argv) -> list[str]:
        """argv run inside the container with the environment of a root login, not ours."""
        return ["nsenter", "-t", str(self.pid1), "-a", "--", "env", "-i", *LOGIN_ENV, *map(str, argv)]

    def run(self, argv, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.command(argv), **kwargs)

    def sh(self, script: str, **kwargs) -> subprocess.CompletedProcess:
        """A shell command line inside the container (cwd: /)."""
        return self.run(["sh", "-c", script], **kwargs)

    def read_bytes(self, path: str) -> bytes:
        """A file as the container sees it (its /tmp, for one, is a tmpfs of its own)."""
        r = self.run(["cat", path], text=False)
        if r.returncode != 0:
            raise FileNotFoundError(f"{self.name}:{path}: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def console_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _find_pid1(self, deadline: float) -> None:
        """systemd-nspawn's child is the container's PID 1 (its own PID namespace)."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn {self.name} exited {self.proc.returncode}:\n{self.console_tail()}")
            try:
                children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
            except OSError:
                children = []
            for pid in children:
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                        self.pid1 = int(pid)
                        return
                except OSError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"container {self.name}: no systemd started:\n{self.console_tail()}")

    def wait_running(self, deadline: float) -> str:
        """Wait until the boot finished; returns systemd's state (running, or degraded)."""
        state = ""
        while time.monotonic() < deadline:
            left = max(1.0, deadline - time.monotonic())
            try:
                r = self.run(["systemctl", "is-system-running", "--wait"], timeout=left)
                state = r.stdout.strip()
            except subprocess.TimeoutExpired:
                break
            if state in ("running", "degraded"):
                return state
            time.sleep(0.2)  # "offline" until the bus is up
        raise RuntimeError(f"container {self.name} did not finish booting (state {state!r}):\n{self.console_tail()}")


def leftovers(name: str, workdir: Path | None = None) -> list[str]:
    """What a container named ``name`` could leave on the machine and still exists."""
    found = [str(d) for d in _cgroup_dirs(name) if d.exists()]
    if (PROPAGATE_DIR / name).exists():
        found.append(str(PROPAGATE_DIR / name))
    if workdir is not None:
        mounts = Path("/proc/self/mountinfo").read_text()
        found += [line.split()[4] for line in mounts.splitlines() if line.split()[4].startswith(str(workdir))]
        if workdir.exists():
            found.append(str(workdir))
    return found


@contextmanager
def booted(name: str, *, netns: str | None = None, read_only=(), boot_timeout: float = 90):
    """Boot a container named ``name`` (unique on this machine); yields a Container."""
    with booted_all([(name, netns)], read_only=read_only, boot_timeout=boot_timeout) as (container,):
        yield container


@contextmanager
def booted_all(hosts, *, read_only=(), boot_timeout: float = 90):
    """Boot one container per ``(name, netns)`` of ``hosts`` at once (a boot mostly waits on
    systemd's units, so the boots overlap); yields the Containers in that order."""
    with ExitStack() as stack:
        containers = [stack.enter_context(_started(name, netns, read_only)) for name, netns in hosts]
        deadline = time.monotonic() + boot_timeout
        for c in containers:
            c._find_pid1(deadline)
        for c in containers:
            c.wait_running(deadline)
        yield containers


@contextmanager
def _started(name: str, netns: str | None, read_only):
    """systemd-nspawn started for ``name`` (not yet booted); everything of it removed on exit."""
    workdir = Path(tempfile.mkdtemp(prefix=f"nspawn-{name}-"))
    root, rw = workdir / "root", workdir / "rw"
    root.mkdir()
    rw.mkdir()
    cgroups = _cgroup_dirs(name)
    mounted: list[Path] = []
    container = None
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(rw)], check=True)
        mounted.append(rw)
        (rw / "upper").mkdir()
        (rw / "work").mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir=/,upperdir={rw}/upper,workdir={rw}/work", str(root)], check=True)
        mounted.append(root)
        # a host of its own: a new machine id (written, not removed: an empty one would be a
        # "first boot", where systemd enables every unit its presets name, networkd among them)
        machine_id = root / "etc" / "machine-id"
        machine_id.unlink(missing_ok=True)
        machine_id.write_text(uuid.uuid4().hex + "\n")
        for d in cgroups:
            d.mkdir()
        argv = ["systemd-nspawn", "--boot", "--directory", str(root), "--machine", name, "--register=no",
                "--keep-unit", "--link-journal=no", "--console=read-only"]
        # nspawn grants CAP_NET_ADMIN with --private-network only; a namespace of our own is as private
        argv += [f"--network-namespace-path=/run/netns/{netns}", "--capability=CAP_NET_ADMIN"] if netns \
            else ["--private-network"]
        argv += [f"--bind-ro={d}" for d in read_only]
        # enter the container's own cgroups first, then become systemd-nspawn
        enter = "; ".join(f'echo $$ > "{d}/cgroup.procs"' for d in cgroups)
        console = workdir / "console.log"
        with open(console, "wb") as out:
            proc = subprocess.Popen(["sh", "-c", f'{enter}; exec "$@"', "sh", *argv], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        container = Container(name, root, proc, console)
        yield container
    finally:
        try:
            if container is not None:
                _power_off(container)
        finally:
            for m in reversed(mounted):
                subprocess.run(["umount", str(m)], check=True)
            for d in cgroups:
                _remove_cgroup(d)
            shutil.rmtree(PROPAGATE_DIR / name, ignore_errors=True)  # nspawn cannot remove it from disk-backed /run
            shutil.rmtree(workdir)


def _power_off(c: Container, timeout: float = 60) -> None:
    """SIGTERM makes systemd-nspawn power the container off cleanly. If that hangs: SIGKILL to the
    container's PID 1 (ends its PID namespace; nspawn is still waiting for it, so the PID is
    still that systemd), then to nspawn."""
    if c.proc.poll() is not None:
        return
    c.proc.terminate()
    try:
        c.proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    if c.pid1 is not None:
        try:
            os.kill(c.pid1, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        c.proc.wait(10)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.wait(10)
