"""The per-job supervisor: the grace reaches the job whatever runs it, a job ends only when nothing of it is left,
and a job whose agent is gone stops itself at its fence."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time

from agent_test_helpers import py, wait_for

from agent import procfs
from agent.executor import Executor
from agent.jobspec import GpuSlice, JobSpec
from agent.placement import FINISHED, RUNNING
from tests.support import TIMEOUT_SCALE, holds_for

GPU = GpuSlice(uuid="GPU-aaaa", index=0)

# A job that checkpoints for `secs` on SIGTERM, then writes `done` in its directory and exits 0.
CHECKPOINTING = """
import os, signal, sys, time
def on_term(signum, frame):
    print('checkpointing', flush=True)
    time.sleep({secs})
    open('done', 'w').write('saved')
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('ready', flush=True)
while True:
    time.sleep(0.1)
"""


def spec(job_id: str, command, **kw) -> JobSpec:
    return JobSpec(job_id=job_id, attempt=kw.pop("attempt", 1), command=command, gpus=(GPU,), **kw)


def _alive(pid: int) -> bool:
    st = procfs.read_stat(pid)
    return st is not None and st.state not in ("Z", "X")


def test_a_shell_line_job_gets_the_whole_grace_not_the_shell(tmp_path):
    """`/bin/sh -c` exits on SIGTERM at once; the job it started checkpoints for 2 s and is not cut short."""
    ex = Executor(tmp_path)
    line = f"{shlex.quote(sys.executable)} -c {shlex.quote(CHECKPOINTING.format(secs=2))}; echo after"
    h = ex.start(spec("ckpt-shell", line, grace_s=30))
    wait_for("the job to start", lambda: "ready" in ex.tail_log(h.key, "stdout"))
    t0 = time.monotonic()
    ex.stop(h.key, reason="preempted")
    wait_for("the shell to exit on its SIGTERM", lambda: not _alive(h.job_pid))
    ex.poll()
    assert h.state != FINISHED  # the shell has gone, the job's python is still checkpointing
    done = ex.wait(h.key, 15)
    assert time.monotonic() - t0 >= 2.0
    assert done.outcome == "stopped" and not done.kill_sent
    assert (h.dir / "done").read_text() == "saved"  # its checkpoint finished: it was never SIGKILLed
    assert 2.0 <= done.grace_given_s < 30
    assert procfs.group_members(h.pgid) == []


def test_an_argv_job_gets_the_whole_grace_too(tmp_path):
    ex = Executor(tmp_path)
    h = ex.start(spec("ckpt-argv", py(CHECKPOINTING.format(secs=1.5)), grace_s=30))
    wait_for("the condition", lambda: "ready" in ex.tail_log(h.key, "stdout"))
    ex.stop(h.key, reason="preempted")
    done = ex.wait(h.key, 15)
    assert done.outcome == "stopped" and done.exit_code == 0 and (h.dir / "done").exists()
    assert 1.5 <= done.grace_given_s < 30


def test_processes_left_behind_are_stopped_before_the_job_counts_as_ended(tmp_path):
    """The first process exits at once and leaves a background sleep, in its group and out of it (a new
    session): the placement ends only once both are gone, and its exit code is the first process's."""
    ex = Executor(tmp_path)
    code = (
        "import subprocess, sys\n"
        "a = subprocess.Popen(['sleep', '60'])\n"
        "b = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        "print(a.pid, b.pid, flush=True)\n"
        "sys.exit(4)\n"
    )
    h = ex.start(spec("leftover", py(code), grace_s=0.5))
    pids = [int(p) for p in wait_for("the condition", lambda: ex.tail_log(h.key, "stdout"))[0].split()]
    done = ex.wait(h.key, 15)
    assert done.outcome == "exited" and done.exit_code == 4
    assert not any(_alive(p) for p in pids)


def test_a_job_whose_agent_is_gone_stops_itself_at_its_fence(tmp_path):
    """The agent stops renewing its lease (it died, or lost the portal): the supervisor stops the job with its
    grace once the fence has passed; a later agent finds how it ended."""
    gone = Executor(tmp_path, fence_after_s=1.5)
    h = gone.start(spec("fenced", py(CHECKPOINTING.format(secs=0.5)), grace_s=10))
    wait_for("the job to start", lambda: "ready" in gone.tail_log(h.key, "stdout"))
    supervisor = h.pid
    # No agent from here on: nobody polls `gone`, nobody renews its lease.
    wait_for("the supervisor to stop the job", lambda: (h.dir / "exit.json").exists(), timeout_s=15)
    record = json.loads((h.dir / "exit.json").read_text())
    assert record["stop_reason"] == "fenced" and "no word from the agent" in record["stop_detail"]
    # Stopped once the lease was older than the fence (both times from this host's clock, as recorded).
    renewed_at = json.loads(gone.lease_path.read_text())["renewed_at"]
    stopped_at = record["finished_at"] - record["stopped_for_s"]
    assert 1.5 <= stopped_at - renewed_at < 1.5 + 5 * TIMEOUT_SCALE
    assert (h.dir / "done").exists()  # the grace reached it
    wait_for("the supervisor to exit", lambda: not _alive(supervisor))
    later = Executor(tmp_path, fence_after_s=1.5)
    found = later.handle(h.key)
    assert found.state == FINISHED and found.outcome == "stopped"
    assert "no word from the agent" in found.detail


def test_a_renewed_lease_keeps_the_job_running(tmp_path):
    ex = Executor(tmp_path, fence_after_s=1.5)
    h = ex.start(spec("kept", py("import time; print('ready', flush=True); time.sleep(60)"), grace_s=1))
    wait_for("the job to start", lambda: "ready" in ex.tail_log(h.key, "stdout"))

    def renewed_and_running() -> bool:
        ex.renew_lease()
        ex.poll()
        return h.state == RUNNING and _alive(h.job_pid)

    # Twice the fence, renewed every 0.1 s (a late renewal is still well within the fence): the job runs on.
    holds_for("the job runs on while its lease is renewed", renewed_and_running, for_s=3.0)
    ex.stop(h.key, reason="not_desired", grace_s=0)
    assert ex.wait(h.key, 10).outcome == "stopped"


def test_the_supervisor_outlives_its_agent_and_a_new_agent_adopts_it(tmp_path):
    """An agent started in a process of its own is killed with SIGKILL: its job runs on under its supervisor,
    and the next agent adopts it (and never launches it again)."""
    import subprocess

    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(os.getcwd())!r})\n"
        "from agent.executor import Executor\n"
        "from agent.jobspec import JobSpec, GpuSlice\n"
        f"ex = Executor({str(tmp_path)!r})\n"
        "h = ex.start(JobSpec(job_id='orphan', attempt=1, gpus=(GpuSlice(uuid='GPU-aaaa', index=0),),\n"
        "    command=(sys.executable, '-c', 'import time; print(\"ready\", flush=True); time.sleep(60)')))\n"
        "print(h.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    supervisor = int(agent.stdout.readline())
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    later = Executor(tmp_path)
    h = later.handle("orphan:1")
    wait_for("the condition", lambda: later.tail_log(h.key, "stdout") == ["ready"])
    assert h.adopted and h.state == RUNNING and h.pid == supervisor and _alive(h.job_pid)
    later.stop(h.key, reason="not_desired", grace_s=1)
    assert later.wait(h.key, 10).outcome == "stopped"
    assert not _alive(supervisor)
