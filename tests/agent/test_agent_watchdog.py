"""The memory-slice watchdog on time-sliced GPUs, reading per-process memory through the NVML backend."""

from __future__ import annotations

from agent_test_helpers import py, wait_for

from agent.backends.nvml import NvmlBackend
from agent.executor import Executor
from agent.jobspec import GpuSlice, JobSpec
from agent.placement import FINISHED, RUNNING
from agent.watchdog import MemoryWatchdog

SLEEPER = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"


def _start(ex: Executor, job_id: str, uuid: str, sharing: str = "timeslice") -> tuple[str, int]:
    gslice = GpuSlice(uuid=uuid, index=0, memory_mib=4096, compute_pct=50, sharing=sharing)
    h = ex.start(JobSpec(job_id=job_id, attempt=1, command=py(SLEEPER), gpus=(gslice,), grace_s=5))
    pid = int(wait_for("the condition", lambda: ex.tail_log(h.key, "stdout"))[0])
    return h.key, pid


def test_the_watchdog_stops_the_job_over_its_slice_and_leaves_its_neighbour_running(fake_nvml, tmp_path):
    backend = NvmlBackend()
    uuid = backend.inventory().gpus[0].uuid
    ex = Executor(tmp_path)
    greedy, greedy_pid = _start(ex, "greedy", uuid)
    modest, modest_pid = _start(ex, "modest", uuid)
    fake_nvml.control.set_time(9.0)  # the recorded load: pid 427 holds 21 GiB, and is no job of ours
    fake_nvml.control.set_process_memory(0, greedy_pid, 6144)
    fake_nvml.control.set_process_memory(0, modest_pid, 3000)
    dog = MemoryWatchdog(ex, grace_s=0.5)

    events = dog.check(backend.sample())

    assert [(e.kind, e.job_id, e.used_mib, e.limit_mib, e.gpu_uuid) for e in events] == [
        ("prevented_neighbour_interference", "greedy", 6144, 4096, uuid)
    ]
    assert events[0].pids == (greedy_pid,)
    done = ex.wait(greedy, 10)
    assert done.state == FINISHED and done.outcome == "killed" and done.stop_reason == "memory_slice_exceeded"
    fake_nvml.control.set_process_memory(0, greedy_pid, None)
    assert dog.check(backend.sample()) == []
    ex.poll()
    assert ex.handle(modest).state == RUNNING
    ex.stop(modest, reason="not_desired", grace_s=0)
    ex.wait(modest, 10)


def test_memory_of_all_a_jobs_processes_counts_against_its_slice(fake_nvml, tmp_path):
    backend = NvmlBackend()
    uuid = backend.inventory().gpus[0].uuid
    ex = Executor(tmp_path)
    key, pid = _start(ex, "two-procs", uuid)
    launcher = ex.handle(key).pid  # another process of the same job's session (its supervisor)
    fake_nvml.control.set_time(0.0)
    fake_nvml.control.set_process_memory(0, pid, 3000)
    fake_nvml.control.set_process_memory(0, launcher, 1500)
    events = MemoryWatchdog(ex, grace_s=0).check(backend.sample())
    assert [(e.job_id, e.used_mib) for e in events] == [("two-procs", 4500)]
    assert ex.wait(key, 10).outcome == "killed"


def test_slices_on_mps_or_exclusive_gpus_are_not_the_watchdogs_business(fake_nvml, tmp_path):
    backend = NvmlBackend()
    uuid = backend.inventory().gpus[0].uuid
    ex = Executor(tmp_path)
    key, pid = _start(ex, "mps-job", uuid, sharing="exclusive")
    fake_nvml.control.set_time(0.0)
    fake_nvml.control.set_process_memory(0, pid, 100_000)
    assert MemoryWatchdog(ex).check(backend.sample()) == []
    ex.poll()
    assert ex.handle(key).state == RUNNING
    ex.stop(key, reason="not_desired", grace_s=0)
    ex.wait(key, 10)


def test_metrics_attribute_gpu_processes_to_their_placement(fake_nvml, tmp_path):
    from agent.runtime import Agent

    agent = Agent(node_name="h200", backend=NvmlBackend(), executor=Executor(tmp_path), metrics_interval_s=0)
    gpu = agent.inventory.gpus[0]
    job = {
        "job_id": "m",
        "attempt": 1,
        "command": list(py(SLEEPER)),
        "gpus": [{"uuid": gpu.uuid, "index": 0, "memory_mib": 8192, "sharing": "timeslice"}],
    }
    agent.apply_desired({"version": 1, "jobs": [job]})
    agent.tick()
    child = int(wait_for("the condition", lambda: agent.executor.tail_log("m:1", "stdout"))[0])
    fake_nvml.control.set_time(9.0)
    fake_nvml.control.set_process_memory(0, child, 2048)
    metrics = [m for m in agent.tick() if m["type"] == "metrics"][-1]["payload"]
    procs = {p["pid"]: (p["used_mib"], p["placement"]) for p in metrics["gpus"][0]["processes"]}
    assert procs[child] == (2048, "m:1")
    assert procs[427] == (21354, None)  # the recorded process belongs to no job here
    assert metrics["gpus"][0]["util_pct"] == 99
    agent.executor.stop("m:1", reason="not_desired", grace_s=0)
    agent.executor.wait("m:1", 10)
