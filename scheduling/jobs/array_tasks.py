"""Cancelling a job array, whole or in part, and what a list's line stands for when it is cancelled.

The array's first row (`Job.array_job_id == Job.pk`) is its line in every list (its reads: `selectors.py`): it
holds the tasks not yet placed (`array_pending`) and, once they are all placed, becomes the last task. The other
tasks are rows of their own from their placement on (`scheduling/cycle/arrays.py`).
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from scheduling.choices import ActorKind, JobState
from scheduling.errors import ServiceError
from scheduling.jobs.array_indexes import ArraySpec, TaskIndexes
from scheduling.jobs.batches import jobs_cancel
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.states import TERMINAL_STATES, IllegalTransition
from scheduling.jobs.transitions import job_cancel, job_transition


@transaction.atomic
def array_cancel(*, job: Job, actor: AbstractBaseUser | None, tasks: TaskIndexes | None = None) -> int:
    """Cancel an array (`job` is any of its rows): all of it, or only these tasks. Tasks not yet placed leave
    the array's row; placed ones are cancelled as jobs (stopped with their grace). Returns how many tasks were
    cancelled; refused when none of those named is still live."""
    if job.array_job_id is None:
        raise ServiceError(
            f"Job {job.pk} is not an array: it has no tasks to name.", field="tasks", code="not_an_array"
        )
    first = Job.objects.select_for_update(of=("self",)).get(pk=job.array_job_id)
    pending = TaskIndexes.parse(first.array_pending, trusted=True) if first.array_pending else TaskIndexes()
    named: set[int] | None = None
    if tasks is not None:  # those of the array's own tasks (however widely `tasks` was written)
        asked = set(tasks)
        named = {i for i in ArraySpec.parse(first.array_spec).indexes if i in asked}
    unplaced = set(pending) if named is None else {i for i in named if i in pending}
    live = Job.objects.filter(array_job_id=first.pk, array_task_id__isnull=False).exclude(
        state__in=TERMINAL_STATES
    )
    if named is not None:
        live = live.filter(array_task_id__in=sorted(named))
    # Locked in one order (as the cycle locks jobs); a task that ended meanwhile is left as it ended.
    rows = list(live.select_for_update(of=("self",)).order_by("id"))
    if not unplaced and not rows:
        raise IllegalTransition(
            first.pk,
            first.state,
            JobState.CANCELLED,
            message=f"Array {first.pk} has no live task {'among ' + tasks.written() if tasks else 'left'}: "
            "there is nothing to cancel.",
        )
    who = actor or ActorKind.USER
    if unplaced:
        left = pending.without(unplaced)
        Job.objects.filter(pk=first.pk).update(array_pending=left.written())
        first.array_pending = left.written()
        message = (
            f"Cancelled by {who}: its {len(unplaced):,} tasks not yet placed."
            if tasks is None
            else f"Tasks {TaskIndexes.of(unplaced).written()} cancelled by {who} before they were placed."
        )
        if not left and first.array_task_id is None and first.state == JobState.PENDING:
            job_transition(
                job=first,
                to_state=JobState.CANCELLED,
                actor_kind=ActorKind.USER,
                actor=actor,
                code="cancelled",
                message=message,
            )
        else:
            JobEvent.objects.create(
                job=first,
                from_state=first.state,
                to_state=first.state,
                actor_kind=ActorKind.USER,
                actor=actor,
                code="array_tasks_cancelled",
                message=message,
            )
    live_rows = [row for row in rows if row.state not in TERMINAL_STATES]
    # The placed tasks in a few statements (thousands of them, in a sweep); a gang's members one by one.
    jobs_cancel(jobs=[r for r in live_rows if r.nodes == 1], actor=actor, message=f"Cancelled by {who}.")
    for row in live_rows:
        if row.nodes > 1:
            job_cancel(job=row, actor=actor)
    return len(unplaced) + len(live_rows)


def job_cancel_as_listed(*, job: Job, actor: AbstractBaseUser | None) -> Job:
    """Cancel what a list's line stands for: an array's line, the whole array; any other row, that job."""
    if job.array_job_id is not None and job.array_job_id == job.pk:
        array_cancel(job=job, actor=actor)
        return Job.objects.get(pk=job.pk)
    return job_cancel(job=job, actor=actor)
