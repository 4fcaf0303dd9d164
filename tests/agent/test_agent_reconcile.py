"""Convergence on the desired state: start missing, stop unwanted, idempotent, no overlap with a leaving job."""

from __future__ import annotations

from agent_test_helpers import py, wait_for

from agent.executor import Executor
from agent.placement import FINISHED, RUNNING, STOPPING
from agent.reconcile import DesiredState, Reconciler

SLEEP = list(py("import time; time.sleep(60)"))


def _job(job_id: str, gpu: str = "GPU-0", attempt: int = 1, command=None, grace_s: float = 5) -> dict:
    return {
        "job_id": job_id,
        "attempt": attempt,
        "command": command or SLEEP,
        "env": {},
        "gpus": [{"uuid": gpu, "index": 0, "memory_mib": 1024, "compute_pct": 50, "sharing": "timeslice"}],
        "max_runtime_s": None,
        "grace_s": grace_s,
    }


def _state(version: int, *jobs: dict) -> DesiredState:
    return DesiredState.from_payload({"version": version, "jobs": list(jobs)})


def _cleanup(ex: Executor) -> None:
    for h in ex.active():
        ex.stop(h.key, reason="not_desired", grace_s=0)
    for h in ex.handles():
        ex.wait(h.key, 10)


def test_the_same_desired_state_twice_changes_nothing_the_second_time(tmp_path):
    ex = Executor(tmp_path)
    rec = Reconciler(ex, known_gpu_uuids={"GPU-0", "GPU-1"})
    desired = _state(1, _job("a"), _job("b", gpu="GPU-1"))
    first = rec.converge(desired)
    assert sorted(first.started) == ["a:1", "b:1"]
    pids = {h.key: h.pid for h in ex.handles()}
    second = rec.converge(desired)
    assert second.started == [] and second.stopping == [] and not second.changed
    assert sorted(second.running) == ["a:1", "b:1"]
    assert {h.key: h.pid for h in ex.handles()} == pids
    _cleanup(ex)


def test_what_is_no_longer_desired_is_stopped_and_what_is_new_is_started(tmp_path):
    ex = Executor(tmp_path)
    rec = Reconciler(ex)
    rec.converge(_state(1, _job("a"), _job("b", gpu="GPU-1")))
    result = rec.converge(_state(2, _job("b", gpu="GPU-1"), _job("c", gpu="GPU-2")))
    assert result.stopping == ["a:1"] and result.started == ["c:1"]
    assert ex.handle("a:1").state in (STOPPING, FINISHED)
    assert ex.wait("a:1", 10).outcome == "stopped"
    _cleanup(ex)


def test_a_preemptor_waits_until_its_victim_has_left_the_gpu(tmp_path):
    ex = Executor(tmp_path)
    rec = Reconciler(ex)
    stubborn = list(
        py(
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
        )
    )
    rec.converge(_state(1, _job("victim", command=stubborn, grace_s=0.5)))
    wait_for("the condition", lambda: ex.tail_log("victim:1", "stdout") == ["ready"])
    result = rec.converge(_state(2, _job("urgent")))
    assert result.stopping == ["victim:1"]
    assert result.waiting == {"urgent:1": "waiting for victim:1 to stop"}
    assert ex.handle("urgent:1") is None
    ex.poll()
    assert rec.converge(_state(2, _job("urgent"))).waiting  # SIGTERM ignored: still inside its grace
    assert ex.wait("victim:1", 10).exit_code == -9
    result = rec.converge(_state(2, _job("urgent")))
    assert result.started == ["urgent:1"]
    _cleanup(ex)


def test_a_finished_placement_is_not_started_again_but_a_new_attempt_is(tmp_path):
    ex = Executor(tmp_path)
    rec = Reconciler(ex)
    rec.converge(_state(1, _job("quick", command=list(py("pass")))))
    assert ex.wait("quick:1", 10).outcome == "exited"
    assert rec.converge(_state(2, _job("quick", command=list(py("pass"))))).started == []
    result = rec.converge(_state(3, _job("quick", attempt=2)))
    assert result.started == ["quick:2"]
    assert ex.handle("quick:2").state == RUNNING
    _cleanup(ex)


def test_a_placement_on_a_gpu_this_node_lacks_is_rejected_once(tmp_path):
    ex = Executor(tmp_path)
    rec = Reconciler(ex, known_gpu_uuids={"GPU-0"})
    result = rec.converge(_state(1, _job("lost", gpu="GPU-9")))
    assert result.rejected == {"lost:1": "GPU(s) not on this node: GPU-9"}
    assert ex.handle("lost:1").outcome == "launch_failed"
    assert [t.kind for t in ex.drain_transitions()] == ["finished"]
    again = rec.converge(_state(1, _job("lost", gpu="GPU-9")))
    assert again.rejected == {} and again.started == [] and ex.drain_transitions() == []


def test_a_desired_state_listing_a_placement_twice_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError):
        _state(1, _job("a"), _job("a"))


def test_a_placement_forgotten_from_memory_is_not_launched_again(tmp_path):
    ex = Executor(tmp_path)
    rec = Reconciler(ex)
    rec.converge(_state(1, _job("done", command=list(py("pass")))))
    ex.wait("done:1", 10)
    ex.mark_reported("done:1")
    ex.forget("done:1")
    assert ex.handle("done:1") is None
    result = rec.converge(_state(1, _job("done", command=list(py("pass")))))
    assert result.started == [] and ex.launches == 1
    assert ex.handle("done:1").outcome == "exited"
