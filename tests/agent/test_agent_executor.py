"""Executor and supervisor: process groups, GPU environment, logs, exit codes, max runtime, SIGTERM-grace-SIGKILL,
a grace that reaches a shell line's job, the end of the whole job, adoption, and the fence."""

from __future__ import annotations

import json
import os
import signal
import time

from agent_test_helpers import py, wait_for

from agent import procfs
from agent.executor import Executor
from agent.jobspec import GpuSlice, JobSpec
from agent.mps import MpsController
from agent.placement import FINISHED, RUNNING
from agent.reconcile import DesiredState, Reconciler

GPU_A = GpuSlice(uuid="GPU-aaaa", index=0)
GPU_B = GpuSlice(uuid="GPU-bbbb", index=1)

PRINT_ENV = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('CUDA', 'TESSERA'))}))"


def spec(job_id: str, command, **kw) -> JobSpec:
    return JobSpec(
        job_id=job_id, attempt=kw.pop("attempt", 1), command=command, gpus=kw.pop("gpus", (GPU_A,)), **kw
    )


def test_a_job_runs_in_its_own_process_group_with_its_gpu_uuids(tmp_path):
    ex = Executor(tmp_path, base_env={**os.environ, "TESSERA_AGENT_TOKEN": "secret"})
    h = ex.start(
        spec("j1", py(PRINT_ENV + "; import os; print(os.getpgid(0), os.getsid(0))"), gpus=(GPU_A, GPU_B))
    )
    # The job's own group, under its supervisor's own session: signalled as a whole, apart from both.
    assert h.pgid == h.job_pid and h.pgid not in (h.pid, os.getpgid(0))
    done = ex.wait(h.key, 10)
    assert done.state == FINISHED and done.outcome == "exited" and done.exit_code == 0
    out = ex.tail_log(h.key, "stdout", lines=5)
    env = json.loads(out[0])
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"
    assert env["TESSERA_PLACEMENT"] == "j1:1"
    assert "TESSERA_AGENT_TOKEN" not in env  # the node token never reaches a job
    pgid, sid = (int(x) for x in out[1].split())
    assert (pgid, sid) == (h.job_pid, h.pid)  # the job's python: its own group, in its supervisor's session


def test_logs_are_kept_and_readable_as_tail_and_in_full(tmp_path):
    ex = Executor(tmp_path)
    code = "import sys\nfor i in range(200): print(f'line {i}')\nprint('oops', file=sys.stderr)\nsys.exit(3)"
    h = ex.wait(ex.start(spec("logs", py(code))).key, 10)
    assert h.outcome == "exited" and h.exit_code == 3
    assert ex.tail_log(h.key, "stdout", lines=2) == ["line 198", "line 199"]
    assert ex.tail_log(h.key, "stderr") == ["oops"]
    first, size = ex.read_log(h.key, "stdout", offset=0, limit_bytes=14)
    assert first == b"line 0\nline 1\n"
    rest, size2 = ex.read_log(h.key, "stdout", offset=14, limit_bytes=1 << 20)
    assert size == size2 == len(first) + len(rest)
    assert rest.decode().splitlines()[-1] == "line 199"


def test_a_shell_command_and_a_missing_program_report_their_exit_codes(tmp_path):
    ex = Executor(tmp_path)
    shell = ex.wait(ex.start(spec("sh", "echo hi; exit 7")).key, 10)
    assert (shell.outcome, shell.exit_code) == ("exited", 7)
    missing = ex.wait(ex.start(spec("missing", ("/nonexistent/program",))).key, 10)
    assert (missing.outcome, missing.exit_code) == ("exited", 127)
    assert "cannot start" in ex.tail_log(missing.key, "stderr")[0]


def test_max_runtime_is_enforced(tmp_path):
    ex = Executor(tmp_path)
    h = ex.start(spec("long", py("import time; time.sleep(60)"), max_runtime_s=0.5, grace_s=2))
    done = ex.wait(h.key, 10)
    assert done.outcome == "killed" and done.stop_reason == "max_runtime"
    assert done.exit_code == -signal.SIGTERM
    assert done.finished_at - done.started_at < 5


def test_stop_sends_sigterm_waits_the_grace_then_sigkills_a_job_that_ignores_it(tmp_path):
    ex = Executor(tmp_path)
    # It says when it ignores SIGTERM, so the test knows the grace has begun without guessing.
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('ignored', flush=True))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(60)"
    )
    h = ex.start(spec("stubborn", py(code), grace_s=2.0))
    wait_for("the job to start", lambda: ex.tail_log(h.key, "stdout") == ["ready"])
    t0 = time.monotonic()
    ex.stop(h.key, reason="not_desired")
    wait_for("the job to ignore its SIGTERM", lambda: "ignored" in ex.tail_log(h.key, "stdout"))
    ex.poll()
    assert h.state != FINISHED  # SIGTERM was ignored and the grace has not passed
    done = ex.wait(h.key, 10)
    assert time.monotonic() - t0 >= 2.0
    assert done.outcome == "stopped" and done.exit_code == -signal.SIGKILL
    assert procfs.group_members(h.pgid) == []


def test_a_job_that_honours_sigterm_ends_within_its_grace(tmp_path):
    ex = Executor(tmp_path)
    code = "import time; print('ready', flush=True); time.sleep(60)"
    h = ex.start(spec("polite", py(code), grace_s=30))
    wait_for("the condition", lambda: ex.tail_log(h.key, "stdout") == ["ready"])
    ex.stop(h.key, reason="not_desired")
    done = ex.wait(h.key, 10)
    assert done.outcome == "stopped" and done.exit_code == -signal.SIGTERM and not done.kill_sent


def test_mps_jobs_get_thread_percentage_and_pinned_memory_limits(tmp_path):
    control = tmp_path / "nvidia-cuda-mps-control"
    calls = tmp_path / "calls.log"
    control.write_text(
        "#!/bin/sh\n"
        f'echo "$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> {calls}\n'
        'if [ "$1" = "-d" ]; then mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" && touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi\n'
        "cat > /dev/null; exit 0\n"
    )
    control.chmod(0o755)
    mps = MpsController(tmp_path / "work", control_path=str(control))
    ex = Executor(tmp_path / "work", mps=mps)
    gpus = (
        GpuSlice(uuid="GPU-m0", index=2, memory_mib=4096, compute_pct=25, sharing="mps"),
        GpuSlice(uuid="GPU-m1", index=3, memory_mib=8192, compute_pct=50, sharing="mps"),
    )
    h = ex.wait(ex.start(spec("mps", py(PRINT_ENV), gpus=gpus)).key, 10)
    env = json.loads(ex.tail_log(h.key, "stdout")[0])
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=8192M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.pipe_dir) and len(str(mps.pipe_dir)) <= 80
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path.resolve() / "work/mps/log")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-m0,GPU-m1"
    assert (
        calls.read_text().splitlines()[0] == f"-d pipe={mps.pipe_dir} log={tmp_path.resolve()}/work/mps/log"
    )
    assert h.mps == "started"


def test_without_the_mps_binary_the_job_still_starts_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    mps = MpsController(tmp_path, control_path=str(tmp_path / "absent"))
    ex = Executor(tmp_path, mps=mps)
    gslice = GpuSlice(uuid="GPU-m0", index=0, memory_mib=4096, compute_pct=25, sharing="mps")
    h = ex.wait(ex.start(spec("mps", py(PRINT_ENV), gpus=(gslice,))).key, 10)
    assert h.outcome == "exited" and h.exit_code == 0
    assert "not found" in h.mps
    env = json.loads(ex.tail_log(h.key, "stdout")[0])
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def _launchers_for(key: str, work_dir) -> list[int]:
    return [
        p
        for p in procfs.find_by_env(f"TESSERA_PLACEMENT={key}")
        if procfs.read_stat(p).pgrp == p and any(str(work_dir) in arg for arg in procfs.read_cmdline(p))
    ]


def test_a_restarted_executor_adopts_a_running_job_and_never_launches_it_twice(tmp_path):
    first = Executor(tmp_path)
    job = spec("adopt", py("import time; print('ready', flush=True); time.sleep(60)"), grace_s=5)
    h1 = first.start(job)
    wait_for("the condition", lambda: first.tail_log(h1.key, "stdout") == ["ready"])
    # The agent restarts (a new Executor on the same work dir); its job keeps running.

    second = Executor(tmp_path)
    h2 = second.handle(job.key)
    assert h2 is not None and h2.adopted and h2.state == RUNNING and h2.pid == h1.pid
    assert [t.kind for t in second.drain_transitions()] == ["adopted"]
    rec = Reconciler(second)
    for _ in range(2):
        result = rec.converge(DesiredState(version=3, jobs=(job,)))
        assert result.started == [] and result.running == [job.key]
    assert _launchers_for(job.key, tmp_path) == [h1.pid]

    # The adopted job is stopped by a desired state without it; its exit code comes from the launcher.
    result = rec.converge(DesiredState(version=4, jobs=()))
    assert result.stopping == [job.key]
    done = second.wait(job.key, 10)
    assert done.outcome == "stopped" and done.exit_code == -signal.SIGTERM
    h1.popen.wait()  # reap: the first executor's process was its parent


def test_a_finished_placement_is_remembered_across_restarts(tmp_path):
    first = Executor(tmp_path)
    job = spec("once", py("print('ran')"))
    first.wait(first.start(job).key, 10)
    second = Executor(tmp_path)
    result = Reconciler(second).converge(DesiredState(version=1, jobs=(job,)))
    assert result.started == [] and second.handle(job.key).outcome == "exited"
    assert second.tail_log(job.key, "stdout") == ["ran"]


def test_a_launch_record_lost_in_a_crash_is_recovered_from_the_running_process(tmp_path):
    first = Executor(tmp_path)
    job = spec("crash", py("import time; print('ready', flush=True); time.sleep(60)"))
    h1 = first.start(job)
    wait_for("the condition", lambda: first.tail_log(h1.key, "stdout") == ["ready"])
    (h1.dir / "launch.json").unlink()  # the agent died between launching and writing it down
    second = Executor(tmp_path)
    h2 = second.handle(job.key)
    assert h2.adopted and h2.state == RUNNING and h2.pid == h1.pid
    assert Reconciler(second).converge(DesiredState(version=1, jobs=(job,))).started == []
    second.stop(job.key, reason="not_desired", grace_s=0)
    assert second.wait(job.key, 10).outcome == "stopped"
    h1.popen.wait()


def test_a_placement_written_down_but_never_launched_is_launched_after_a_restart(tmp_path):
    job = spec("never", py("print('now')"))
    d = Executor(tmp_path).job_dir(job)
    d.mkdir(parents=True)
    (d / "spec.json").write_text(json.dumps(job.to_dict()))
    ex = Executor(tmp_path)
    assert ex.handle(job.key) is None
    assert Reconciler(ex).converge(DesiredState(version=1, jobs=(job,))).started == [job.key]
    assert ex.wait(job.key, 10).outcome == "exited"


def test_a_job_that_cannot_be_launched_is_reported_not_raised(tmp_path):
    ex = Executor(tmp_path)
    bad_env = ex.start(spec("nul", py("pass"), env={"X": "a\0b"}))
    assert bad_env.outcome == "launch_failed" and "null" in bad_env.detail
    bad_cwd = ex.start(spec("cwd", py("pass"), cwd=str(tmp_path / "missing")))
    assert bad_cwd.outcome == "launch_failed"
    assert [t.kind for t in ex.drain_transitions()] == ["finished", "finished"]


def test_a_deep_work_dir_gets_a_short_mps_pipe_directory(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    mps = MpsController(deep, control_path=None)
    assert len(str(mps.pipe_dir)) <= 80
    assert mps.pipe_dir == MpsController(deep).pipe_dir  # stable: a restarted agent finds its daemon
    assert mps.log_dir == deep.resolve() / "mps/log"
