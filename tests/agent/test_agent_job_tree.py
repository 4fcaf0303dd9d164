"""An isolated job's own tree, tried as the job's uid: a home it can write and enter, a TMPDIR, its gang's
hostfile, and nothing of another job or of the agent. The agent runs as root with umask 077; these run as root
(CI does) and skip with the reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from agent_test_helpers import wait_for

from agent.executor import Executor
from agent.isolation import Isolation
from agent.jobspec import Gang, GangMember, GpuSlice, JobSpec

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="a job's own uid needs root (setuid to a pool uid); CI runs these as root",
)

GPU = GpuSlice(uuid="GPU-aaaa", index=0)
POOL = (61100, 61109)
# The jobs' Python: one every user may run (the test's own may sit in a directory only root can enter).
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
GANG = Gang(
    rank=0,
    master_port=29600,
    members=(
        GangMember(node="gpu-01", address="10.0.0.1", slots=1),
        GangMember(node="gpu-02", address="10.0.0.2", slots=1),
    ),
)

# A shell job uses its home, its TMPDIR and its hostfile by their absolute paths, then holds until told to end.
USES_ITS_TREE = """
set -e
touch "$HOME/x" && echo home-written
echo scratch > "$TMPDIR/t" && echo tmp-written
cat "$TESSERA_HOSTFILE"
cd "$HOME" && echo "cd $(pwd)"
ls "$HOME"
echo done
while [ ! -e "$HOME/x.end" ]; do sleep 0.05; done
"""

# Tries, as another job's uid, what must be out of its reach; prints one JSON object of what it could do.
PRYING = """
import json, os, sys
def can(fn, path):
    try:
        fn(path)
        return True
    except OSError:
        return False
read = lambda p: open(p, "rb").read(1)
paths = dict(arg.split("=", 1) for arg in sys.argv[1:])
print(json.dumps({
    "uid": os.getuid(),
    "read": {name: can(read, p) for name, p in paths.items() if not name.startswith("dir:")},
    "list": {name: can(os.listdir, p) for name, p in paths.items() if name.startswith("dir:")},
    "enter": {name: can(os.chdir, p) for name, p in paths.items() if name.startswith("dir:")},
}), flush=True)
"""


@pytest.fixture(params=[0o077, 0o022], ids=["umask077", "umask022"])
def agent(request):
    """An isolating executor in a fresh work dir (mode 700, as mkdtemp leaves it) under the agent's umask (077
    as `tessera-agent run` sets it; 022 to show nothing depends on it)."""
    old = os.umask(request.param)
    work_dir = Path(tempfile.mkdtemp(prefix="tessera-tree-", dir="/tmp"))
    ex = Executor(work_dir, isolation=Isolation(mode="pool", uid_pool=POOL))
    try:
        yield ex
    finally:
        for h in ex.active():
            ex.stop(h.key, reason="not_desired", grace_s=0)
            ex.wait(h.key, 10)
        os.umask(old)
        shutil.rmtree(work_dir, ignore_errors=True)


def _stdout(ex: Executor, handle, last: str) -> list[str]:
    try:
        return wait_for(
            f"{handle.key} to print {last!r}",
            lambda: last in ex.tail_log(handle.key, "stdout") and ex.tail_log(handle.key, "stdout"),
        )
    except AssertionError:
        raise AssertionError(
            f"stdout {ex.tail_log(handle.key, 'stdout')}, stderr {ex.tail_log(handle.key, 'stderr')}"
        ) from None


def _pry(ex: Executor, job_id: str, **paths: Path) -> dict:
    handle = ex.start(
        JobSpec(
            job_id=job_id,
            attempt=1,
            gpus=(GPU,),
            command=(PYTHON, "-c", PRYING, *(f"{name}={path}" for name, path in paths.items())),
        )
    )
    done = ex.wait(handle.key, 20)
    assert done.outcome == "exited" and done.exit_code == 0, ex.tail_log(handle.key, "stderr")
    return json.loads(ex.tail_log(handle.key, "stdout")[0])


def test_an_isolated_job_writes_its_home_and_tmpdir_reads_its_hostfile_and_reaches_nothing_else(agent):
    ex = agent
    first = ex.start(JobSpec(job_id="first", attempt=1, gpus=(GPU,), command=USES_ITS_TREE, gang=GANG))
    out = _stdout(ex, first, "done")
    home, tmp = first.dir / "work", first.dir / "tmp"
    assert out == [
        "home-written",
        "tmp-written",
        "10.0.0.1 slots=1",
        "10.0.0.2 slots=1",
        f"cd {home}",
        "x",
        "done",
    ]
    assert (home / "x").stat().st_uid == first.uid and (tmp / "t").read_text() == "scratch\n"
    for d in (home, tmp):
        info = os.stat(d)
        assert info.st_uid == first.uid and stat.S_IMODE(info.st_mode) == 0o700
    # The placement's directory: the job's group may pass through it, nobody may list it.
    info = os.stat(first.dir)
    assert info.st_uid == 0 and info.st_gid == first.uid and stat.S_IMODE(info.st_mode) == 0o710

    seen = _pry(
        ex,
        "second",
        home_file=home / "x",
        tmp_file=tmp / "t",
        hostfile=first.dir / "hostfile",
        run=first.dir / "run.json",
        stdout=first.dir / "stdout.log",
        lease=ex.lease_path,
        **{"dir:home": home, "dir:placement": first.dir, "dir:jobs": ex.jobs_dir},
    )
    assert POOL[0] <= seen["uid"] <= POOL[1] and seen["uid"] != first.uid
    assert seen["read"] == dict.fromkeys(
        ("home_file", "tmp_file", "hostfile", "run", "stdout", "lease"), False
    )
    assert seen["list"] == {"dir:home": False, "dir:placement": False, "dir:jobs": False}
    assert seen["enter"] == {"dir:home": False, "dir:placement": False, "dir:jobs": True}

    (home / "x.end").touch()
    done = ex.wait(first.key, 20)
    assert done.outcome == "exited" and done.exit_code == 0
    # Ended: its TMPDIR is gone and its directory is closed to its uid, which the pool hands to the next job.
    assert not tmp.exists() and stat.S_IMODE(os.stat(first.dir).st_mode) == 0o700
    later = _pry(ex, "third", home_file=home / "x", **{"dir:home": home})
    assert later["uid"] == first.uid
    assert later["read"] == {"home_file": False} and later["enter"] == {"dir:home": False}


def test_a_job_that_names_its_own_tmpdir_keeps_it(agent):
    ex = agent
    h = ex.start(
        JobSpec(
            job_id="own-tmp",
            attempt=1,
            gpus=(GPU,),
            env={"TMPDIR": "/tmp"},
            command='echo "$TMPDIR $HOME"',
        )
    )
    done = ex.wait(h.key, 20)
    assert done.exit_code == 0 and ex.tail_log(h.key, "stdout") == [f"/tmp {h.dir / 'work'}"]
