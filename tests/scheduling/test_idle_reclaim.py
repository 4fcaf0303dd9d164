"""Idle GPUs given back (scheduling/cycle/idle.py): a job idle near its class's timeout is warned, a session past it
stopped, a batch job past it requeued while others wait; "still using it" restarts the clock once per timeout;
classes without a timeout never lose their cards; a team's grant may only shorten the timeout."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas.models import TeamPriorityClass
from scheduling.agents import live_metrics
from scheduling.agents.reports.job_status import job_report
from scheduling.cycle import runner
from scheduling.cycle.idle import idle_check, job_idle_reset, jobs_idle_states
from scheduling.errors import ServiceError
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.selectors import pending_reason
from scheduling.jobs.submit import job_submit
from scheduling.notifications.models import Notification

pytestmark = pytest.mark.django_db

MIN = 60


@pytest.fixture
def timeouts(priority_classes):
    """training: sessions 30 min, batch 2 h (the defaults); inference: never."""
    training = priority_classes["training"]
    assert (training.interactive_idle_timeout_s, training.idle_timeout_s) == (30 * MIN, 2 * 3600)
    assert priority_classes["inference"].idle_timeout_s is None
    return priority_classes


def running(user, team, node, **spec) -> Job:
    spec.setdefault("command", "python train.py")
    spec.setdefault("name", "job")
    spec.setdefault("gpus", 1)
    job = job_submit(submitter=user, team=team, spec=JobSpec(**spec))
    runner.cycle_run_once()
    job.refresh_from_db()
    started = {"job_id": str(job.pk), "attempt": job.attempt, "state": "started", "pid": 42}
    assert job_report(node_id=node.pk, payload=started).ok
    job.refresh_from_db()
    assert job.state == "running"
    # Started long ago: the idle clock counts from the later of the cards going idle and the start.
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=5))
    job.refresh_from_db()
    return job


def samples(job: Job, *, idle_for_s: float, util_pct: float = 1.0, memory_mib: int = 1000) -> None:
    """Its cards' samples, anew: idle (util_pct under 5) from idle_for_s ago until now."""
    r = live_metrics.redis_client()
    if r is None:
        live_metrics._local_usage.pop(job.pk, None)
    else:
        r.delete(live_metrics.job_usage_key(job.pk))
    now = time.time()
    for at in (now - idle_for_s, now):
        live_metrics._usage_note(job.pk, at, [{"util_pct": util_pct, "memory_used_mib": memory_mib}], True)


def codes(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("code", flat=True))


def test_a_session_is_warned_then_stopped_and_the_warning_clears_when_used_again(
    alice, teams, node, timeouts
):
    alice.email = "alice@example.org"
    alice.save()
    job = running(alice, teams["training"], node, kind="interactive")
    samples(job, idle_for_s=10 * MIN)
    assert idle_check() == {"warned": [], "stopped": [], "requeued": [], "cleared": []}

    samples(job, idle_for_s=25 * MIN)  # 5 min before its 30: warned (TESSERA_IDLE_WARN_BEFORE_S is 10 min)
    assert idle_check()["warned"] == [job.pk]
    assert idle_check()["warned"] == []  # once per idle spell
    job.refresh_from_db()
    warning = JobEvent.objects.get(job=job, code="idle_warning").message
    assert warning.startswith("Idle for 25 min: every GPU under 5% since ") and "it is stopped" in warning
    assert abs((job.idle_reclaim_at - (timezone.now() + timedelta(minutes=5))).total_seconds()) < 5
    told = Notification.objects.get(job_id=job.pk, kind="idle")
    assert told.target == "alice@example.org" and "is idle" in told.subject

    samples(job, idle_for_s=0, util_pct=60)  # busy again
    assert idle_check()["cleared"] == [job.pk]
    job.refresh_from_db()
    assert job.idle_reclaim_at is None and codes(job)[-1] == "idle_over"

    samples(job, idle_for_s=31 * MIN)
    assert idle_check()["stopped"] == [job.pk]
    job.refresh_from_db()
    assert job.state == "cancelled"
    ended = JobEvent.objects.get(job=job, code="idle_stopped").message
    assert ended.startswith("Idle for 30 min: every GPU under 5% since ")
    assert ended.endswith("stopped to free a100-01/gpu0 for other work.")


def test_a_batch_job_is_requeued_only_while_others_wait_and_the_waiting_one_gets_its_card(
    alice, bob, teams, node, timeouts
):
    job = running(alice, teams["training"], node, gpus=8)  # the whole node
    samples(job, idle_for_s=3 * 3600)
    assert idle_check()["requeued"] == []  # nobody waits: it keeps its cards
    waiting = job_submit(submitter=bob, team=teams["inference"], spec=JobSpec(name="w", command="x", gpus=1))
    runner.cycle_run_once()
    waiting.refresh_from_db()
    assert waiting.state == "pending"
    assert idle_check()["requeued"] == [job.pk]
    job.refresh_from_db()
    assert job.state == "preempted"
    message = JobEvent.objects.get(job=job, code="idle_reclaimed").message
    assert message.startswith("Idle for 2 h: every GPU under 5% since ")
    assert "given back to waiting work (120 s grace before SIGKILL)" in message
    stopped = {"job_id": str(job.pk), "attempt": job.attempt, "state": "stopped", "pid": 42}
    assert job_report(node_id=node.pk, payload=stopped).ok
    runner.cycle_run_once()
    job.refresh_from_db()
    waiting.refresh_from_db()
    # The waiting job took a card; the idle one, of a higher priority, is held back rather than taking them back.
    assert job.state == "pending" and waiting.state == "placed"
    code, reason = pending_reason(job)
    assert code == "idle_hold" and "so the work that waited for them goes first" in reason
    Job.objects.filter(pk=job.pk).update(hold_until=timezone.now() - timedelta(seconds=1))
    assert pending_reason(Job.objects.get(pk=job.pk))[0] != "idle_hold"


def test_still_using_it_restarts_the_clock_once_per_timeout(alice, carol, teams, node, timeouts):
    job = running(alice, teams["training"], node, kind="interactive")
    samples(job, idle_for_s=29 * MIN)
    assert idle_check()["warned"] == [job.pk]
    with pytest.raises(ServiceError, match="Only the job's submitter"):
        job_idle_reset(user=carol, job_id=job.pk)
    job_idle_reset(user=alice, job_id=job.pk)
    job.refresh_from_db()
    assert job.idle_reclaim_at is None and codes(job)[-1] == "idle_reset"
    samples(job, idle_for_s=40 * MIN)  # idle all along: the clock counts from the reset
    assert idle_check() == {"warned": [], "stopped": [], "requeued": [], "cleared": []}
    state = jobs_idle_states(jobs=[job])[job.pk]
    assert state["idle_s"] < 60
    with pytest.raises(ServiceError, match="once per idle timeout \\(30 min\\), again from"):
        job_idle_reset(user=alice, job_id=job.pk)


def test_a_class_without_a_timeout_never_loses_its_cards_and_a_team_may_only_shorten_it(
    alice, bob, teams, node, timeouts
):
    serving = running(bob, teams["inference"], node, kind="interactive", priority="inference")
    samples(serving, idle_for_s=10 * 3600)
    assert idle_check()["stopped"] == [] and jobs_idle_states(jobs=[serving]) == {}

    TeamPriorityClass.objects.create(
        team=teams["training"], priority_class=timeouts["training"], idle_timeout_s=5 * MIN
    )
    session = running(alice, teams["training"], node, kind="interactive")
    samples(session, idle_for_s=6 * MIN)
    assert idle_check()["stopped"] == [session.pk]  # the team's 5 min, not the class's 30
    TeamPriorityClass.objects.filter(team=teams["training"]).update(idle_timeout_s=10 * 3600)
    longer = running(alice, teams["training"], node, kind="interactive")
    samples(longer, idle_for_s=31 * MIN)
    assert idle_check()["stopped"] == [longer.pk]  # a longer one does not lengthen the class's


def test_memory_that_moves_is_not_idle(alice, teams, node, timeouts):
    job = running(alice, teams["training"], node, kind="interactive")
    now = time.time()
    for i, at in enumerate((now - 40 * MIN, now - 20 * MIN, now)):
        live_metrics._usage_note(job.pk, at, [{"util_pct": 0, "memory_used_mib": 1000 + 2000 * i}], True)
    state = jobs_idle_states(jobs=[job])[job.pk]
    assert state["idle_since"] is None  # under 5% all along, but its memory grew: loading data
    assert idle_check()["stopped"] == []
