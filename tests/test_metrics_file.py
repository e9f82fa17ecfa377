"""The metrics textfile's safety (issue 31): whatever stands at the path when the daemon stops or
`--cleanup` runs (a directory, a link, a FIFO, someone else's file), neither fails and neither
removes it; the daemon removes only the file it wrote, and never follows a parent directory that
was replaced after it started. daemon/metrics.py directly (TextfileWriter, remove_stale_textfile),
then a real daemon's stop and --cleanup with a directory at the path."""
from __future__ import annotations

import os
import signal
import stat

import pytest

from inceptionn.daemon import metrics

SNAPSHOT = {"pid": 1, "uptime_s": 1.0, "config": {"codec": "inceptionn", "interfaces": ["eth0"]},
            "flows_active": 0, "flows_expired": 0, "counters": {"egress_packets": 3}}
TEXT = metrics.exposition(SNAPSHOT, "prometheus")


def written(tmp_path):
    prom = tmp_path / "inceptionn.prom"
    w = metrics.TextfileWriter(str(prom))
    w.write(TEXT)
    return w, prom


def leftovers(d) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


def test_what_the_daemon_writes_starts_with_the_signature():
    assert TEXT.encode().startswith(metrics.SIGNATURE)


def test_write_then_remove(tmp_path):
    w, prom = written(tmp_path)
    assert prom.read_text() == TEXT and stat.S_IMODE(prom.stat().st_mode) == 0o644
    w.write(TEXT + "# again\n")  # a rewrite is a new inode, and the one remembered
    assert prom.read_text().endswith("# again\n") and leftovers(tmp_path) == []
    assert w.remove() is None and not prom.exists()


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo", "other file"])
def test_stop_leaves_whatever_replaced_the_file(tmp_path, kind):
    w, prom = written(tmp_path)
    prom.unlink()
    precious = tmp_path / "precious"
    precious.write_text("precious\n")
    if kind == "directory":
        prom.mkdir()
    elif kind == "symlink":
        prom.symlink_to(precious)
    elif kind == "fifo":
        os.mkfifo(prom)
    else:
        prom.write_text(TEXT)  # the same bytes, another inode: not the file we wrote
    reason = w.remove()
    assert reason is not None and "left in place" in reason, reason
    assert os.path.lexists(prom) and precious.read_text() == "precious\n"
    if kind == "directory":
        assert prom.is_dir()


def test_a_write_onto_a_directory_fails_cleanly(tmp_path):
    """The Textfile loop logs the OSError and retries; no temporary file is left behind."""
    w, prom = written(tmp_path)
    prom.unlink()
    prom.mkdir()
    with pytest.raises(OSError):
        w.write(TEXT)
    assert leftovers(tmp_path) == [] and prom.is_dir()
    assert w.remove() is not None and prom.is_dir()


def test_a_replaced_parent_directory_is_never_followed(tmp_path):
    """The directory is opened once: renamed away and replaced by a link to another directory,
    the writes still go to the directory opened at start, and the other one is never touched."""
    d, elsewhere = tmp_path / "textfile", tmp_path / "elsewhere"
    d.mkdir()
    elsewhere.mkdir()
    (elsewhere / "inceptionn.prom").write_text("someone else's\n")
    w = metrics.TextfileWriter(str(d / "inceptionn.prom"))
    w.write(TEXT)
    d.rename(tmp_path / "moved")
    d.symlink_to(elsewhere)
    w.write(TEXT + "# second\n")
    assert (tmp_path / "moved" / "inceptionn.prom").read_text().endswith("# second\n")
    assert w.remove() is None
    assert not (tmp_path / "moved" / "inceptionn.prom").exists()
    assert (elsewhere / "inceptionn.prom").read_text() == "someone else's\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["inceptionn.prom"]


def test_a_missing_directory_is_one_line():
    from inceptionn.errors import UserError

    with pytest.raises(UserError, match="cannot open /nonexistent-inc"):
        metrics.TextfileWriter("/nonexistent-inc/inceptionn.prom")


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo", "foreign file", "missing", "no directory"])
def test_cleanup_removes_only_a_metrics_file(tmp_path, kind):
    """--cleanup has no inode to go by: it removes a regular file of this user that starts as
    the daemon writes it, and leaves anything else."""
    prom = tmp_path / "inceptionn.prom"
    target = tmp_path / "target.prom"
    target.write_text(TEXT)
    if kind == "directory":
        prom.mkdir()
    elif kind == "symlink":
        prom.symlink_to(target)  # a link to a file that looks like ours: still not followed
    elif kind == "fifo":
        os.mkfifo(prom)
    elif kind == "foreign file":
        prom.write_text("# HELP node_something else\n")
    elif kind == "no directory":
        prom = tmp_path / "missing" / "inceptionn.prom"
    reason = metrics.remove_stale_textfile(str(prom))
    if kind in ("missing", "no directory"):
        assert reason is None
    else:
        assert reason is not None and "left in place" in reason, reason
        assert os.path.lexists(prom)
    assert target.read_text() == TEXT
    real = tmp_path / "real.prom"
    real.write_text(TEXT)
    assert metrics.remove_stale_textfile(str(real)) is None and not real.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and netfilter")
def test_stop_and_cleanup_with_a_directory_at_the_path(tmp_path, tb_name):
    """A running daemon's metrics file replaced by a directory: the stop exits 0 with one line
    about it, removes every rule, and leaves the directory; so does --cleanup."""
    from test_nicd_lifecycle import INC, one_host, queue_rules, ready, start, stop_all

    sock, log, prom = tmp_path / "nicd.sock", tmp_path / "nicd.log", tmp_path / "inceptionn.prom"
    with one_host(tb_name) as h:
        p = start(h, [INC, "nicd", "-i", h.ifname, "--socket", str(sock), "--metrics-textfile", str(prom)], log)
        try:
            ready(p, log)
            assert prom.read_text().startswith(metrics.SIGNATURE.decode())
            prom.unlink()
            prom.mkdir()
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 0, log.read_text()
        finally:
            stop_all(p)
        text = log.read_text()
        assert "is not the file nicd wrote (a directory); left in place" in text, text
        assert "Traceback" not in text and prom.is_dir() and queue_rules(h) == []
        r = h.run([INC, "nicd", "--cleanup", "--socket", str(sock), "--metrics-textfile", str(prom)],
                  capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "is not a metrics file (a directory); left in place" in r.stderr, r.stderr
        assert prom.is_dir()
