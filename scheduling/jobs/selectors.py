"""Reads for jobs: what a user may see, the queue in the scheduler's order, and who may cancel what."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, QuerySet

from quotas.selectors import team_ids_administered_by, team_ids_for_user
from scheduling.choices import JobState
from scheduling.jobs.models import Job


def jobs_visible_to(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """Jobs a user may see in full: staff see all, others their teams' jobs."""
    jobs = Job.objects.select_related("team", "submitter", "priority_class")
    if user.is_staff:
        return jobs
    return jobs.filter(team_id__in=team_ids_for_user(user=user))


def queue() -> QuerySet[Job]:
    """Pending jobs in the order the last scheduling cycle saw them."""
    return (
        Job.objects.filter(state=JobState.PENDING)
        .select_related("team", "submitter", "priority_class")
        .order_by(F("queue_position").asc(nulls_last=True), "submitted_at", "id")
    )


def can_cancel_job(*, user: AbstractBaseUser, job: Job) -> bool:
    """Staff: any job; a team admin: any job of the team; a member: their own jobs."""
    if user.is_staff:
        return True
    if job.team_id in team_ids_administered_by(user=user):
        return True
    return job.submitter_id == user.pk and job.team_id in team_ids_for_user(user=user)


def job_team_id(*, job_id: int) -> int | None:
    """The team of a job (None when there is no such job)."""
    return Job.objects.filter(pk=job_id).values_list("team_id", flat=True).first()


def job_in_teams(*, job_id: int, team_ids: set[int]) -> bool:
    return Job.objects.filter(pk=job_id, team_id__in=team_ids).exists()
