"""Idle GPUs given back: a running job whose every card has stayed idle (under IDLE_UTIL_PCT, its memory unchanged:
scheduling/agents/live_metrics.py) for its idle timeout is warned, then stopped (a session) or preempted back to
the queue (batch, while other work waits).

The timeout is its priority class's (`interactive_idle_timeout_s` for sessions, `idle_timeout_s` for batch; empty:
never, as for serving), or its team's shorter one at that class (`TeamPriorityClass.idle_timeout_s`). The clock
counts from the latest of: the cards going idle, the job's start, and its owner's "still using it" (once per
timeout). The warning comes `TESSERA_IDLE_WARN_BEFORE_S` before (at half the timeout when that is shorter), on the
job's page, in `tessera ls` and by notification. Run by the beat (`scheduling.tasks.idle_check_task`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from quotas.models import PriorityClass, TeamPriorityClass
from scheduling import lock_objects
from scheduling.agents.live_metrics import IDLE_UTIL_PCT, job_usage
from scheduling.choices import ActorKind, JobKind, JobState
from scheduling.cycle.requests import cycle_request_after_commit
from scheduling.errors import ServiceError
from scheduling.jobs.models import Job
from scheduling.jobs.notes import job_note
from scheduling.jobs.transitions import job_transition
from scheduling.notifications.services import job_idle_notify

log = logging.getLogger(__name__)


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{round(seconds)} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h" + (f" {minutes % 60} min" if minutes % 60 else "")


def _clock(at: datetime) -> str:
    return timezone.localtime(at).strftime("%H:%M")


def idle_timeout_s(*, job: Job, team_timeouts: dict[tuple[int, int], int]) -> int | None:
    """The job's idle timeout: its class's for its kind, or its team's shorter one at that class. None: never."""
    pc: PriorityClass = job.priority_class
    base = pc.interactive_idle_timeout_s if job.kind == JobKind.INTERACTIVE else pc.idle_timeout_s
    team = team_timeouts.get((job.team_id, pc.pk))
    if team is None and job.team.parent_id is not None:  # an organisation's grant holds for its teams
        team = team_timeouts.get((job.team.parent_id, pc.pk))
    given = [t for t in (base, team) if t]
    return min(given) if given else None


def _team_timeouts() -> dict[tuple[int, int], int]:
    return {
        (team_id, class_id): timeout
        for team_id, class_id, timeout in TeamPriorityClass.objects.filter(
            idle_timeout_s__isnull=False
        ).values_list("team_id", "priority_class_id", "idle_timeout_s")
    }


def _warn_before_s(timeout_s: int) -> float:
    return min(settings.TESSERA_IDLE_WARN_BEFORE_S, timeout_s / 2)


def job_idle_state(*, job: Job, usage: dict | None, timeout_s: int | None, now: datetime) -> dict | None:
    """Where the job stands with its idle timeout (for its page, the API and the check): None when it has none or
    is not running; else {"timeout_s", "idle_since" (None: busy, or no samples), "idle_s", "reclaim_at"}."""
    if timeout_s is None or job.state != JobState.RUNNING:
        return None
    idle_since = None
    if usage and usage.get("fresh") and usage.get("idle_s", 0) > 0:
        idle_since = now - timedelta(seconds=usage["idle_s"])
        for later in (job.started_at, job.idle_reset_at):
            if later is not None and later > idle_since:
                idle_since = later
    idle_s = (now - idle_since).total_seconds() if idle_since else 0.0
    return {
        "timeout_s": timeout_s,
        "idle_since": idle_since,
        "idle_s": idle_s,
        "reclaim_at": idle_since + timedelta(seconds=timeout_s) if idle_since else None,
        "warn_at": idle_since + timedelta(seconds=timeout_s - _warn_before_s(timeout_s))
        if idle_since
        else None,
    }


def jobs_idle_states(
    *,
    jobs: list[Job],
    now: datetime | None = None,
    team_timeouts: dict[tuple[int, int], int] | None = None,
    usage: dict[int, dict] | None = None,
) -> dict[int, dict]:
    """job_idle_state for many jobs: one read of the teams' timeouts and of the jobs' usage (unless given: a
    page that shows the usage has read it)."""
    now = now or timezone.now()
    running = [j for j in jobs if j.state == JobState.RUNNING]
    if not running:
        return {}
    if team_timeouts is None:
        team_timeouts = _team_timeouts()
    timeouts = {j.pk: idle_timeout_s(job=j, team_timeouts=team_timeouts) for j in running}
    if usage is None:
        usage = job_usage(job_ids=[pk for pk, t in timeouts.items() if t])
    states = {}
    for job in running:
        state = job_idle_state(job=job, usage=usage.get(job.pk), timeout_s=timeouts[job.pk], now=now)
        if state is not None:
            states[job.pk] = state
    return states


def _tell(job: Job, code: str, message: str) -> None:
    job_note(job=job, code=code, message=message, actor_kind=ActorKind.SYSTEM)


def _held(job: Job) -> str:
    cards = sorted({f"{s.gpu.node.name}/gpu{s.gpu.index}" for s in job.slices.select_related("gpu__node")})
    return ", ".join(cards) or "its GPUs"


def idle_check(*, now: datetime | None = None) -> dict:
    """One round: warn the jobs nearing their idle timeout, give back the GPUs of those past it, and clear the
    warning of those used again. Safe to run twice at once (each job is re-read under its row lock)."""
    now = now or timezone.now()
    team_timeouts = _team_timeouts()
    running = _candidates(team_timeouts)
    states = jobs_idle_states(jobs=running, now=now, team_timeouts=team_timeouts)
    warned, stopped, requeued, cleared = [], [], [], []
    others_wait = None  # read once, and only if a batch job is due
    for job in running:
        state = states.get(job.pk)
        if state is None:
            continue
        if state["idle_since"] is None:
            if job.idle_reclaim_at is not None and _clear(job):
                cleared.append(job.pk)
            continue
        if now >= state["reclaim_at"]:
            if job.kind == JobKind.INTERACTIVE:
                if _give_back(job, state, now, stop=True):
                    stopped.append(job.pk)
            else:
                if others_wait is None:
                    others_wait = Job.objects.filter(state=JobState.PENDING).exists()
                if others_wait and _give_back(job, state, now, stop=False):
                    requeued.append(job.pk)
            continue
        if now >= state["warn_at"] and job.idle_reclaim_at is None and _warn(job, state):
            warned.append(job.pk)
    return {"warned": warned, "stopped": stopped, "requeued": requeued, "cleared": cleared}


def _candidates(team_timeouts: dict[tuple[int, int], int]) -> list[Job]:
    """Running jobs some idle timeout could concern: their class has one, or a team's grant at it does."""
    with_class = PriorityClass.objects.exclude(
        idle_timeout_s__isnull=True, interactive_idle_timeout_s__isnull=True
    )
    class_ids = set(with_class.values_list("pk", flat=True)) | {class_id for _, class_id in team_timeouts}
    if not class_ids:
        return []
    return list(
        Job.objects.filter(state=JobState.RUNNING, priority_class_id__in=class_ids).select_related(
            "priority_class", "team", "submitter"
        )
    )


def _locked_running(job: Job) -> Job | None:
    locked = (
        lock_objects.jobs_for_update(ids=[job.pk])
        .select_related("priority_class", "team", "submitter")
        .first()
    )
    return locked if locked is not None and locked.state == JobState.RUNNING else None


@transaction.atomic
def _warn(job: Job, state: dict) -> bool:
    job = _locked_running(job)
    if job is None or job.idle_reclaim_at is not None:
        return False
    job.idle_reclaim_at = state["reclaim_at"]
    job.save(update_fields=["idle_reclaim_at"])
    what = "stopped" if job.kind == JobKind.INTERACTIVE else "given back (it is requeued) if other work waits"
    message = (
        f"Idle for {_minutes(state['idle_s'])}: every GPU under {IDLE_UTIL_PCT:g}% since "
        f"{_clock(state['idle_since'])}. At {_clock(state['reclaim_at'])} it is {what}, unless its GPUs are used "
        "again or you say you are still using it."
    )
    _tell(job, "idle_warning", message)
    job_idle_notify(job=job, subject=f"job {job.pk} {job.name} is idle", body=message)
    return True


@transaction.atomic
def _clear(job: Job) -> bool:
    job = _locked_running(job)
    if job is None or job.idle_reclaim_at is None:
        return False
    job.idle_reclaim_at = None
    job.save(update_fields=["idle_reclaim_at"])
    _tell(job, "idle_over", "Its GPUs are in use again: nothing will be given back.")
    return True


@transaction.atomic
def _give_back(job: Job, state: dict, now: datetime, *, stop: bool) -> bool:
    job = _locked_running(job)
    if job is None:
        return False
    if job.idle_reset_at is not None and job.idle_reset_at > state["idle_since"]:
        return False  # "still using it" was said meanwhile
    held = _held(job)
    why = (
        f"Idle for {_minutes(state['timeout_s'])}: every GPU under {IDLE_UTIL_PCT:g}% since "
        f"{_clock(state['idle_since'])}"
    )
    if stop:
        message = f"{why}; stopped to free {held} for other work."
        job_transition(
            job=job,
            to_state=JobState.CANCELLED,
            actor_kind=ActorKind.SYSTEM,
            code="idle_stopped",
            message=message,
            data={"idle_since": state["idle_since"].isoformat(), "timeout_s": state["timeout_s"]},
        )
    else:
        grace = job.priority_class.preemption_grace_s
        hold_s = settings.TESSERA_IDLE_REQUEUE_HOLD_S
        job.hold_until = now + timedelta(seconds=grace + hold_s)
        job.save(update_fields=["hold_until"])
        message = (
            f"{why}; {held} given back to waiting work ({grace} s grace before SIGKILL); it is back in the queue "
            f"with its original submit time, held back until {_clock(job.hold_until)} so that work goes first."
        )
        job_transition(
            job=job,
            to_state=JobState.PREEMPTED,
            actor_kind=ActorKind.SYSTEM,
            code="idle_reclaimed",
            message=message,
            data={
                "idle_since": state["idle_since"].isoformat(),
                "timeout_s": state["timeout_s"],
                "grace_s": grace,
            },
        )
    log.info("job %s: %s", job.pk, message, extra={"job_id": job.pk})
    cycle_request_after_commit()
    return True


@transaction.atomic
def job_idle_reset(*, user: AbstractBaseUser, job_id: int, now: datetime | None = None) -> Job:
    """The owner says the job is still in use: its idle clock starts again, once per timeout."""
    now = now or timezone.now()
    job = (
        lock_objects.jobs_for_update(ids=[job_id])
        .select_related("priority_class", "team", "submitter")
        .filter(submitter_id=user.pk)
        .first()
    )
    if job is None:
        raise ServiceError("Only the job's submitter may say it is still in use.", code="not_found")
    if job.state != JobState.RUNNING:
        raise ServiceError(f"Job {job.pk} is {job.state}, not running.", field="job", code="not_running")
    timeout_s = idle_timeout_s(job=job, team_timeouts=_team_timeouts())
    if timeout_s is None:
        raise ServiceError(
            f"Job {job.pk}'s GPUs are never given back when idle.", field="job", code="no_timeout"
        )
    if job.idle_reset_at is not None and now < job.idle_reset_at + timedelta(seconds=timeout_s):
        again = job.idle_reset_at + timedelta(seconds=timeout_s)
        raise ServiceError(
            f"You said so at {_clock(job.idle_reset_at)}; it may be said once per idle timeout "
            f"({_minutes(timeout_s)}), again from {_clock(again)}.",
            field="job",
            code="idle_reset_too_soon",
        )
    job.idle_reset_at, job.idle_reclaim_at = now, None
    job.save(update_fields=["idle_reset_at", "idle_reclaim_at"])
    _tell(job, "idle_reset", f"{user.get_username()} is still using it: its idle clock starts again.")
    return job
