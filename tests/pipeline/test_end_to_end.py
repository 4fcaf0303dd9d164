"""The whole path with real processes: submit -> cycle (Celery) -> desired state (daphne) -> agent -> report."""

from __future__ import annotations

import json
import time

import pytest

from agent import procfs
from scheduling.agents import joblogs
from scheduling.choices import JobState, NodeState
from scheduling.cycle.models import NodeSync
from scheduling.inventory.models import Node
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.transitions import job_cancel
from tests.pipeline.harness import FENCE_AFTER_S, NODE_LOST_AFTER_S, path_of, submit, wait_for, wait_state


def test_a_job_goes_from_submit_to_succeeded_and_its_logs_are_readable(pipe):
    job = submit(pipe, gpus=1, command="echo hello from $TESSERA_JOB_ID; echo oops >&2; sleep 0.3")
    wait_state(job, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED and job.exit_code == 0
    assert path_of(job) == ["pending", "placed", "running", "succeeded"]
    wait_for(
        "both logs to reach the portal",
        lambda: all(joblogs.log_size(job_id=job.pk, stream=s) > 0 for s in ("stdout", "stderr")),
        timeout_s=10,
    )
    data, _ = joblogs.log_read(job_id=job.pk, stream="stdout")
    assert data.decode() == f"hello from {job.pk}\n"
    tail, _ = joblogs.log_tail(job_id=job.pk, stream="stderr", lines=5)
    assert tail.decode() == "oops\n"
    finished = job.events.get(to_state=JobState.SUCCEEDED)
    assert finished.data["exit_code"] == 0 and finished.data["node"] in pipe.nodes


def test_a_failing_job_reports_its_exit_code(pipe):
    job = submit(pipe, gpus=1, command="exit 3")
    wait_state(job, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.FAILED and job.exit_code == 3


def test_cancelling_a_running_job_stops_its_process_and_frees_its_gpus(pipe):
    job = submit(pipe, gpus=2, command="sleep 120")
    wait_state(job, JobState.RUNNING)
    node = job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"][0]
    job_cancel(job=job, actor=pipe.people["alice"])
    outcome = wait_for(
        "the agent to stop the cancelled job",
        lambda: (pipe.placements_on(node, job.pk).get(1) or {}).get("outcome"),
        timeout_s=15,
    )
    assert outcome["outcome"] == "stopped"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and not job.slices.exists()
    # The stop report arrives after the cancel and changes nothing.
    assert path_of(job)[-1] == JobState.CANCELLED


def test_a_high_priority_job_preempts_a_low_one_which_is_requeued_and_runs_later(pipe):
    lows = [submit(pipe, gpus=2, command="trap '' TERM; sleep 120", name=f"low-{i}") for i in range(2)]
    for low in lows:
        wait_state(low, JobState.RUNNING)
    high = submit(pipe, gpus=2, command="sleep 2", priority="pipe-high", name="high")
    victim = wait_for(
        "one low job to be preempted",
        lambda: next(
            (j for j in Job.objects.filter(pk__in=[x.pk for x in lows], state__in=["preempted", "pending"])),
            None,
        ),
        timeout_s=20,
    )
    preempted = victim.events.get(to_state=JobState.PREEMPTED)
    assert preempted.data["grace_s"] == 2 and preempted.data["preemptor"] == str(high.pk)
    wait_state(high, JobState.RUNNING, JobState.SUCCEEDED)
    node = preempted.data["nodes"][0]
    stopped = pipe.placements_on(node, victim.pk)[1]["outcome"]
    # It ignored SIGTERM, so it ran out its grace and was killed; only then did the preemptor start.
    started = high.events.get(to_state=JobState.RUNNING).at.timestamp()
    assert stopped["finished_at"] - preempted.at.timestamp() >= 2 - 0.2
    assert started >= stopped["finished_at"] - 0.5
    # Back in the queue with its original submit time, and it runs again once the preemptor is done.
    wait_state(high, JobState.SUCCEEDED)
    wait_state(victim, JobState.RUNNING, timeout_s=20)
    assert (
        victim.attempt == 2
        and victim.submitted_at == lows[[j.pk for j in lows].index(victim.pk)].submitted_at
    )
    assert path_of(victim) == ["pending", "placed", "running", "preempted", "pending", "placed", "running"]


@pytest.mark.timeout(150, func_only=True)  # its fence is 20 s; about 30 s in all
def test_a_killed_agent_stops_nothing_until_the_fence_and_its_job_is_placed_again_only_after_it_ended(pipe):
    """kill -9 of an agent: its job runs on under its supervisor; the node is lost after the timeout (nothing is
    placed on it), the supervisor stops the job at its fence, and only then is the job placed elsewhere: it never
    runs in two places."""
    starts = pipe.root / "starts"
    job = submit(pipe, gpus=2, command=f"echo start >> {starts}/$TESSERA_JOB_ID.$TESSERA_ATTEMPT; sleep 120")
    wait_state(job, JobState.RUNNING)
    node = job.events.filter(to_state=JobState.PLACED).latest("at", "id").data["nodes"][0]
    other = next(n for n in pipe.nodes if n != node)
    first = pipe.work_dir(node) / "jobs" / str(job.pk) / "1"
    job_pid = json.loads((first / "job.json").read_text())["pid"]
    pipe.procs[f"agent-{node}"].kill9()
    killed_at = time.time()
    wait_for(
        "the node to be declared lost",
        lambda: Node.objects.get(name=node).state == NodeState.LOST,
        timeout_s=NODE_LOST_AFTER_S * 2,
    )
    # It runs on without its agent, or (on a machine slow to declare the node lost) its supervisor has stopped it
    # at its fence since.
    exit_record = first / "exit.json"
    assert procfs.read_stat(job_pid) is not None or (
        exit_record.exists() and json.loads(exit_record.read_text())["stop_reason"] == "fenced"
    ), "the job died with its agent"
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.attempt == 1, "placed elsewhere before it surely stopped"
    ended = wait_for(
        "the supervisor to stop the job at its fence",
        lambda: json.loads((first / "exit.json").read_text()) if (first / "exit.json").exists() else None,
        timeout_s=FENCE_AFTER_S * 2,
    )
    assert ended["stop_reason"] == "fenced"
    # Counted from the last acknowledged heartbeat, at most one interval (1 s) before the kill.
    assert FENCE_AFTER_S - 1.5 <= ended["finished_at"] - killed_at <= FENCE_AFTER_S + 10
    wait_for("the job to be placed again", lambda: job.refresh_from_db() or job.attempt == 2, timeout_s=30)
    wait_state(job, JobState.RUNNING)
    placed_again = job.events.get(to_state=JobState.PLACED, data__nodes=[other])
    assert placed_again.at.timestamp() >= ended["finished_at"], "two attempts ran at once"
    # The old agent comes back: attempt 1 ended long ago; its report about it changes nothing.
    pipe.start_agent(node)
    outcome = wait_for(
        "the restarted agent to collect the fenced attempt",
        lambda: (pipe.placements_on(node, job.pk).get(1) or {}).get("outcome"),
        timeout_s=30,
    )
    assert outcome["outcome"] == "stopped" and "no word from the agent" in outcome["detail"]
    wait_for(
        "the portal to answer the restarted agent's report of attempt 1",
        lambda: (pipe.placements_on(node, job.pk)[1]["outcome"] or {}).get("reported"),
        timeout_s=30,
    )
    # Refused as stale: expected after a fence, and no error of the node's.
    assert NodeSync.objects.get(node__name=node).last_error == ""
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.attempt == 2
    assert sorted(p.name for p in starts.glob(f"{job.pk}.*")) == [f"{job.pk}.1", f"{job.pk}.2"]
    assert all(p.read_text() == "start\n" for p in starts.glob(f"{job.pk}.*")), (
        "an attempt was launched twice"
    )
    assert not JobEvent.objects.filter(job=job, data__attempt=1, at__gt=job.placed_at).exists()
    wait_for(
        "the node to be ready again",
        lambda: Node.objects.get(name=node).state == NodeState.READY,
        timeout_s=15,
    )
