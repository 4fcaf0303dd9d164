"""Jobs isolated from each other and from the agent when it runs as root: their own uid, a private working
directory, the agent's state and token out of reach, and cgroup limits on host memory and CPU. Real users and
cgroups: these run as root (CI does) and skip with the reason elsewhere."""

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
from agent.isolation import Isolation, IsolationError, detect_cgroups
from agent.jobspec import GpuSlice, JobSpec

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="isolation needs root (jobs get their own uids and cgroups); CI runs these as root",
)

GPU = GpuSlice(uuid="GPU-aaaa", index=0)
POOL = (61000, 61009)
# The jobs' Python: one every user may run (the test's own may sit in a directory only root can enter).
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def spec(job_id: str, code: str, **kw) -> JobSpec:
    return JobSpec(job_id=job_id, attempt=1, command=(PYTHON, "-c", code), gpus=(GPU,), **kw)


@pytest.fixture
def work_dir():
    """A work dir the jobs' users can pass through (pytest's own tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="tessera-isolation-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def isolated(work_dir):
    tmp_path = work_dir
    os.chmod(tmp_path, 0o711)  # as the agent leaves its work dir: others may pass through, not list it
    token = tmp_path / "node.token"
    token.write_text("secret")
    os.chmod(token, 0o600)
    ex = Executor(tmp_path, isolation=Isolation(mode="pool", uid_pool=POOL))
    os.chmod(ex.jobs_dir, 0o711)
    yield ex
    for h in ex.active():
        ex.stop(h.key, reason="not_desired", grace_s=0)
        ex.wait(h.key, 10)


def _first_line(ex, handle) -> str:
    try:
        return wait_for("the condition", lambda: ex.tail_log(handle.key, "stdout"))[0]
    except AssertionError:
        raise AssertionError(f"no output; stderr: {ex.tail_log(handle.key, 'stderr')}") from None


PROBE = """
import json, os, sys
def can_read(path):
    try:
        open(path).read(1)
        return True
    except OSError:
        return False
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "groups": os.getgroups(), "cwd": os.getcwd(),
    "home": os.environ.get("HOME"), "token": can_read(sys.argv[1]), "lease": can_read(sys.argv[2]),
    "other_run": can_read(sys.argv[3]) if len(sys.argv) > 3 else None,
    "other_environ": can_read(f"/proc/{sys.argv[4]}/environ") if len(sys.argv) > 4 else None,
}), flush=True)
import time; time.sleep(float(os.environ.get("HOLD", "0")))
"""


def test_each_job_runs_as_its_own_user_in_a_private_directory_and_cannot_read_the_agent_or_other_jobs(
    isolated,
):
    ex = isolated
    token, lease = ex.work_dir / "node.token", ex.lease_path
    first = ex.start(
        JobSpec(
            job_id="first",
            attempt=1,
            gpus=(GPU,),
            env={"HOLD": "30", "SECRET": "first's"},
            command=(PYTHON, "-c", PROBE, str(token), str(lease)),
        )
    )
    one = json.loads(_first_line(ex, first))
    second = ex.start(
        JobSpec(
            job_id="second",
            attempt=1,
            gpus=(GPU,),
            command=(
                PYTHON,
                "-c",
                PROBE,
                str(token),
                str(lease),
                str(first.dir / "run.json"),
                str(first.job_pid),
            ),
        )
    )
    two = json.loads(_first_line(ex, second))
    assert POOL[0] <= one["uid"] <= POOL[1] and POOL[0] <= two["uid"] <= POOL[1]
    assert one["uid"] != two["uid"] and one["uid"] == one["euid"] and one["groups"] == []
    for seen, handle in ((one, first), (two, second)):
        work = handle.dir / "work"
        assert seen["cwd"] == seen["home"] == str(work)
        info = os.stat(work)
        assert info.st_uid == seen["uid"] and stat.S_IMODE(info.st_mode) == 0o700
        assert seen["token"] is False and seen["lease"] is False
    assert two["other_run"] is False  # the other job's command and environment
    assert two["other_environ"] is False  # nor its process's environment
    assert ex.wait(second.key, 10).outcome == "exited"


def test_a_job_past_its_host_memory_is_killed_and_reported_so(isolated):
    if detect_cgroups() is None:
        pytest.skip("no usable cgroup hierarchy on this host (neither v2 with memory+cpu nor v1 memory)")
    ex = isolated
    greedy = ex.start(
        spec("greedy", "x = bytearray(400 * 1024 * 1024); print('survived')", memory_mib=128, cpu_milli=500)
    )
    done = ex.wait(greedy.key, 30)
    assert done.outcome == "killed" and done.stop_reason == "host_memory_exceeded"
    assert "survived" not in ex.tail_log(greedy.key, "stdout")
    modest = ex.wait(
        ex.start(spec("modest", "x = bytearray(32 * 1024 * 1024); print('fine')", memory_mib=128)).key, 30
    )
    assert modest.outcome == "exited" and modest.exit_code == 0
    # Its cgroups are gone with it.
    run = json.loads((greedy.dir / "run.json").read_text())
    assert run["cgroup"]["dirs"] and not any(os.path.exists(d) for d in run["cgroup"]["dirs"])


def test_cpu_and_memory_requests_become_the_jobs_cgroup_limits(isolated):
    cgroups = detect_cgroups()
    if cgroups is None:
        pytest.skip("no usable cgroup hierarchy on this host (neither v2 with memory+cpu nor v1 memory)")
    ex = isolated
    h = ex.start(
        spec(
            "limited",
            "import time; print('ready', flush=True); time.sleep(30)",
            memory_mib=256,
            cpu_milli=1500,
        )
    )
    wait_for("the condition", lambda: ex.tail_log(h.key, "stdout") == ["ready"])
    run = json.loads((h.dir / "run.json").read_text())
    files = {}
    for d in run["cgroup"]["dirs"]:
        for name in ("memory.max", "cpu.max", "memory.limit_in_bytes", "cpu.cfs_quota_us", "cgroup.procs"):
            path = os.path.join(d, name)
            if os.path.exists(path):
                files[name] = open(path).read().split()
    if cgroups.version == 2:
        assert files["memory.max"] == [str(256 * 1024 * 1024)] and files["cpu.max"] == ["150000", "100000"]
    else:
        assert files["memory.limit_in_bytes"] == [str(256 * 1024 * 1024)]
        if cgroups.cpu is not None:
            assert files["cpu.cfs_quota_us"] == ["150000"]
    assert str(h.job_pid) in files["cgroup.procs"]


def test_a_job_named_for_a_missing_account_is_refused_not_run_as_root(work_dir):
    ex = Executor(work_dir, isolation=Isolation(mode="account"))
    h = ex.start(spec("nobody-here", "print('ran')", user="no-such-account-here"))
    assert h.outcome == "launch_failed" and "no Unix account 'no-such-account-here'" in h.detail
    with pytest.raises(IsolationError, match="must be one of"):
        Isolation(mode="everyone")
