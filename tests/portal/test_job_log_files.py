"""The job logs the portal keeps are tenant data: each file the portal's alone (0600) in directories no other uid
may enter, so a job running on the portal's host, as any other uid, reads no team's output."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from scheduling.agents import joblogs
from scheduling.agents.reports.log_chunks import _attempt_base

NOBODY = 65534  # a uid that owns nothing here: a job of another team's, as far as the files are concerned


@pytest.fixture
def open_log_dir(settings):
    """A log root whose parents anyone may traverse (pytest's own temporary directories are 0700, which would
    hide the files whatever their modes)."""
    base = Path(tempfile.mkdtemp(prefix="tessera-logs-"))
    base.chmod(0o755)
    settings.TESSERA_LOG_DIR = str(base / "logs")
    yield base / "logs"
    shutil.rmtree(base)


def _read_as(uid: int, path: Path) -> str:
    """Try to read `path` as `uid` in a child process: 'read', or the error's name."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the uid for good, try, say what happened
        os.close(read_end)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            with open(path, "rb") as fh:
                fh.read(1)
            outcome = b"read"
        except OSError as exc:
            outcome = type(exc).__name__.encode()
        os.write(write_end, outcome)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        said = fh.read().decode()
    os.waitpid(pid, 0)
    return said


def test_a_job_log_and_its_directories_are_the_portals_alone(open_log_dir):
    joblogs.log_append(job_id=7, stream="stdout", data=b"team a's secret loss curve\n")
    _attempt_base(7, "stdout", 1)
    log = joblogs.log_path(job_id=7, stream="stdout")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.with_suffix(".attempt1").stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(open_log_dir.stat().st_mode) == 0o700


def test_a_log_file_made_before_logs_were_private_is_made_private_at_the_next_write(open_log_dir):
    log = joblogs.log_path(job_id=8, stream="stderr")
    log.parent.mkdir(parents=True)
    open_log_dir.chmod(0o755)  # as an image made it
    joblogs._private_roots.discard(open_log_dir)  # a portal process starting on it
    log.write_bytes(b"old\n")
    log.chmod(0o644)
    joblogs.log_append(job_id=8, stream="stderr", data=b"new\n")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and log.read_bytes() == b"old\nnew\n"
    assert stat.S_IMODE(open_log_dir.stat().st_mode) == 0o700


def test_another_uid_cannot_read_a_job_log(open_log_dir):
    if os.geteuid() != 0:
        pytest.skip("reading as another uid needs root (CI runs as root)")
    joblogs.log_append(job_id=9, stream="stdout", data=b"team a's secret loss curve\n")
    log = joblogs.log_path(job_id=9, stream="stdout")
    assert _read_as(NOBODY, log) == "PermissionError"
    # The files alone are private too: with the directories opened, still no read.
    log.parent.chmod(0o755)
    open_log_dir.chmod(0o755)
    assert _read_as(NOBODY, log) == "PermissionError"
    assert _read_as(0, log) == "read"
