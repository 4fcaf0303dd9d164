"""A note on a job's timeline that moves it nowhere (its server answers, its GPUs sit idle, a gang member ended):
one event, told to whoever follows the job after commit."""

from __future__ import annotations

from typing import Any

from scheduling.jobs.models import Job, JobEvent
from scheduling.realtime import events


def job_note(
    *, job: Job, code: str, message: str, actor_kind: str, data: dict[str, Any] | None = None
) -> JobEvent:
    event = JobEvent.objects.create(
        job=job,
        from_state=job.state,
        to_state=job.state,
        actor_kind=actor_kind,
        code=code,
        message=message,
        data=data or {},
    )
    job_told(job, code, message)
    return event


def job_told(job: Job, code: str, message: str = "") -> None:
    """Whoever follows the job (its page, its team's lists) is told it changed, after commit."""
    events.job_changed(
        job_id=job.pk,
        team_id=job.team_id,
        submitter_id=job.submitter_id,
        state=job.state,
        code=code,
        message=message,
    )
