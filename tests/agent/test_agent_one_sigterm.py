"""A stop sends each process of a job one SIGTERM: the group as a whole, and each descendant that left it once;
SIGKILL after the grace to what is left. A trainer that checkpoints on SIGTERM must not start twice."""

from __future__ import annotations

import collections
import sys

from agent_test_helpers import wait_for

from agent import procfs
from agent.executor import Executor
from agent.jobspec import GpuSlice, JobSpec

GPU = GpuSlice(uuid="GPU-aaaa", index=0)

# Each process counts the SIGTERMs it gets (a line in `terms`) and carries on, so the grace runs out and SIGKILL
# ends it. The leader starts a child in its group, one in a session of its own, and a middle process that starts
# one of each and exits, so those two are re-parented to the supervisor (a child subreaper): one outside the
# job's group, one still in it.
TRAPPING = """
import os, signal, subprocess, sys, time
role = sys.argv[1]
def on_term(signum, frame):
    fd = os.open("terms", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{role} {os.getpid()}\\n".encode())
    os.close(fd)
if role != "middle":
    signal.signal(signal.SIGTERM, on_term)
def spawn(child, **kw):
    return subprocess.Popen([sys.executable, "-c", f"CODE = {CODE!r}\\n" + CODE, child], **kw)
if role == "leader":
    spawn("in-group")
    spawn("own-session", start_new_session=True)
    spawn("middle").wait()
elif role == "middle":
    spawn("orphan-in-group")
    spawn("orphan-own-session", start_new_session=True)
    sys.exit(0)
fd = os.open("ready", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, f"{role} {os.getpid()} {os.getpgrp()}\\n".encode())
os.close(fd)
while True:
    time.sleep(0.05)
"""
ROLES = {"leader", "in-group", "own-session", "orphan-in-group", "orphan-own-session"}


def _command() -> tuple[str, ...]:
    code = f"CODE = {TRAPPING!r}\n" + TRAPPING
    return (sys.executable, "-c", code, "leader")


def test_each_process_of_a_stopped_job_gets_one_sigterm_then_sigkill_after_the_grace(tmp_path):
    ex = Executor(tmp_path)
    h = ex.start(JobSpec(job_id="trapping", attempt=1, command=_command(), gpus=(GPU,), grace_s=30))
    ready_file = h.dir / "ready"

    def all_ready():
        lines = ready_file.read_text().split("\n") if ready_file.exists() else []
        rows = [line.split() for line in lines if line]
        return {r[0]: (int(r[1]), int(r[2])) for r in rows} if len(rows) == len(ROLES) else None

    ready = wait_for("every process of the job to trap SIGTERM", all_ready)
    assert set(ready) == ROLES
    # The scenario is as meant: who is in the job's group, and who was re-parented to the supervisor.
    assert {role for role, (_, pgid) in ready.items() if pgid == h.pgid} == {
        "leader",
        "in-group",
        "orphan-in-group",
    }
    assert _parent(ready["orphan-in-group"][0]) == _parent(ready["orphan-own-session"][0]) == h.pid

    ex.stop(h.key, reason="preempted", grace_s=1.5)
    done = ex.wait(h.key, 30)
    assert done.outcome == "stopped" and done.kill_sent  # they ignored it: SIGKILL once the grace was over
    assert 1.5 <= done.grace_given_s < 30
    terms = collections.Counter(line.split()[0] for line in (h.dir / "terms").read_text().splitlines())
    assert terms == dict.fromkeys(ROLES, 1)
    assert not any(_alive(pid) for pid, _ in ready.values())


def _parent(pid: int) -> int:
    raw = open(f"/proc/{pid}/stat").read()
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def _alive(pid: int) -> bool:
    st = procfs.read_stat(pid)
    return st is not None and st.state not in ("Z", "X")
