"""Job arrays in the apply: each task the engine placed becomes a row of its own, in the apply's transaction and
under its epoch (`array_tasks_split`), and the decisions are about rows again; the array's row gets the reason of
its first waiting entry, or says how many tasks its `%N` holds back, or that they wait task by task; tasks whose
aftercorr can never be met end. The snapshot's side is `arrays.py`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

from django.db import connection

from scheduling.choices import ActorKind, JobState
from scheduling.cycle.arrays import (
    THROTTLED,
    PendingArray,
    pending_arrays,
    task_entry,
    task_entry_id,
)
from scheduling.engine import types as eng
from scheduling.jobs.array_indexes import TaskIndexes
from scheduling.jobs.dependencies import WAITS
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.transitions import job_dependency_never_met

# A task's row is its array's row with its index, nothing placed, nothing held: every other column copied as is
# (the array's submit time is the task's queue age).
_TASK_COLUMNS = {
    "array_task_id": "t.idx",
    "array_pending": "''",
    "pending_reason_code": "'queued'",
    "pending_reason": "''",
    "queue_position": "NULL",
    "estimated_start_at": "NULL",
    "reserved_nodes": "'[]'",
}


def _tasks_insert(array: Job, indexes: list[int], *, at: datetime) -> dict[int, int]:
    """Rows for these tasks of the array, copied from its row by the database in one INSERT ... SELECT (however
    many), with their first event in one more; their ids by index."""
    if not indexes:
        return {}
    quote = connection.ops.quote_name
    fields = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    columns = ", ".join(quote(c) for c in fields)
    values = ", ".join(_TASK_COLUMNS.get(c, f"a.{quote(c)}") for c in fields)
    job_table = quote(Job._meta.db_table)
    if connection.vendor == "postgresql":
        tasks, param = "unnest(%s::integer[]) AS t(idx)", list(indexes)
    else:  # SQLite: the indexes as one JSON parameter, whatever their number
        tasks, param = "(SELECT value AS idx FROM json_each(%s)) AS t", json.dumps(indexes)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {job_table} ({columns}) SELECT {values} FROM {job_table} AS a, {tasks} "
            "WHERE a.id = %s RETURNING id, array_task_id",
            [param, array.pk],
        )
        ids = {index: pk for pk, index in cursor.fetchall()}
        event_table = quote(JobEvent._meta.db_table)
        said = f" of array #{array.pk}, submitted by {array.submitter} to {array.team.slug}."
        cursor.execute(
            f"INSERT INTO {event_table} (job_id, {quote('at')}, from_state, to_state, actor_kind, actor_id, code, "
            f"message, data) SELECT id, %s, '', %s, %s, NULL, 'array_task', 'Task ' || array_task_id || %s, "
            f"'{{}}' FROM {job_table} WHERE array_job_id = %s AND id BETWEEN %s AND %s",
            [at, JobState.PENDING, ActorKind.SCHEDULER, said, array.pk, min(ids.values()), max(ids.values())],
        )
    return ids


def array_tasks_split(decisions: eng.Decisions) -> eng.Decisions:
    """Make rows of the array tasks the engine placed, and return the decisions about rows only (module doc).
    Called inside the apply's transaction: a task whose index was cancelled meanwhile is dropped."""
    taken: dict[int, list[int]] = {}
    for placement in decisions.placements:
        entry = task_entry(placement.job_id)
        if entry is not None:
            taken.setdefault(entry[0], []).append(entry[1])
    waiting = {entry[0] for p in decisions.pending if (entry := task_entry(p.job_id)) is not None}
    arrays = {
        a.pk: a
        for a in Job.objects.select_for_update(of=("self",))
        .select_related("submitter", "team")
        .filter(pk__in=set(taken) | waiting, state=JobState.PENDING)
        .exclude(array_pending="")
        .order_by("id")
    }
    row_of: dict[str, int] = {}  # engine entry -> the task's row
    for array_id, indexes in taken.items():
        array = arrays.get(array_id)
        if array is None:
            continue  # cancelled (or already split) since the snapshot: its entries are dropped
        left = TaskIndexes.parse(array.array_pending, trusted=True)
        indexes = [i for i in indexes if i in left]
        if not indexes:
            continue
        left = left.without(set(indexes))
        new = indexes if left else indexes[:-1]
        # Each task's trail starts when it was submitted (its array's submit): its wait in the queue counts from
        # there (the admission-wait metric reads it).
        for index, pk in _tasks_insert(array, new, at=array.submitted_at).items():
            row_of[task_entry_id(array_id, index)] = pk
        if not left:
            last = indexes[-1]
            Job.objects.filter(pk=array.pk).update(array_pending="", array_task_id=last)
            row_of[task_entry_id(array_id, last)] = array.pk
        else:
            Job.objects.filter(pk=array.pk).update(array_pending=left.written())
    return _about_rows(decisions, row_of, arrays)


def _about_rows(decisions: eng.Decisions, row_of: dict[str, int], arrays: dict[int, Job]) -> eng.Decisions:
    """The decisions with each array entry replaced by its task's row (placed), or by the array's row (the first
    that waits gives the array its reason; a preemptor not yet placed is named by its array)."""

    def row(job_id: str) -> str:
        entry = task_entry(job_id)
        if entry is None:
            return job_id
        return str(row_of.get(job_id, entry[0]))

    placements = tuple(
        replace(p, job_id=str(row_of[p.job_id])) if task_entry(p.job_id) else p
        for p in decisions.placements
        if task_entry(p.job_id) is None or p.job_id in row_of
    )
    pending: list[eng.Pending] = []
    reasoned: set[int] = set()
    for p in decisions.pending:
        entry = task_entry(p.job_id)
        if entry is None:
            pending.append(p)
        elif entry[0] not in reasoned and entry[0] in arrays:
            reasoned.add(entry[0])
            pending.append(replace(p, job_id=str(entry[0])))
    return replace(
        decisions,
        placements=placements,
        pending=(
            *pending,
            *_held_back(arrays_with_entries=reasoned, start=len(pending)),
        ),
        evictions=tuple(replace(e, preemptor_id=row(e.preemptor_id)) for e in decisions.evictions),
        reservations=tuple(r for r in decisions.reservations if task_entry(r.job_id) is None),
        borrowed=frozenset(row(j) for j in decisions.borrowed if task_entry(j) is None or j in row_of),
    )


def _held_back(*, arrays_with_entries: set[int], start: int) -> list[eng.Pending]:
    """For each array with tasks left: its tasks that can never start (aftercorr on a task that did not succeed)
    end now; one whose waiting tasks got no reason from the engine this cycle (none offered, or all offered
    placed) says why: its %N holds them back, or they wait task by task."""
    said = []
    for pk, a in sorted(pending_arrays().items()):
        if a.never:
            _tasks_never(a)
        if pk in arrays_with_entries:
            continue
        if a.room == 0:
            reason = eng.Status(
                THROTTLED,
                f"At most {a.max_running} of its tasks run at once ({a.occupied} are placed, running or about to "
                f"start); the next of its {len(a.pending):,} waiting tasks starts when one of them ends.",
            )
        elif a.ready is not None and not a.ready - a.never:
            arrays = ", ".join(str(on) for on in a.waits_for)
            reason = eng.Status(
                WAITS,
                f"Each of its tasks waits for the same task of array {arrays} to succeed; none of its "
                f"{len(a.pending):,} waiting tasks may start yet.",
            )
        else:
            continue
        said.append(eng.Pending(job_id=str(pk), status=reason, position=start + len(said) + 1))
    return said


# At most this many of an array's tasks whose aftercorr can never be met end in one cycle (the rest in the next
# ones): each is a transition of its own, inside the apply's transaction.
NEVER_PER_CYCLE = 200


def _tasks_never(array: PendingArray) -> None:
    """End the tasks whose aftercorr can never be met: rows of their own, failed as dependency_never_satisfied
    (the last of the array's tasks is its first row itself). Its owner hears of it with the array's end."""
    row = Job.objects.select_for_update(of=("self",)).select_related("submitter", "team").get(pk=array.pk)
    pending = TaskIndexes.parse(row.array_pending, trusted=True)
    gone = sorted(i for i in array.never if i in pending)[:NEVER_PER_CYCLE]
    if not gone:
        return
    left = pending.without(set(gone))
    rows = list(_tasks_insert(row, gone if left else gone[:-1], at=row.submitted_at).values())
    if left:
        Job.objects.filter(pk=row.pk).update(array_pending=left.written())
    else:
        Job.objects.filter(pk=row.pk).update(array_pending="", array_task_id=gone[-1])
        rows.append(row.pk)
    waits = ", ".join(str(on) for on in array.waits_for)
    for job in (
        Job.objects.select_for_update(of=("self",)).filter(pk__in=rows, state=JobState.PENDING).order_by("id")
    ):
        why = f"task {job.array_task_id} of array {waits} did not succeed"
        job_dependency_never_met(job=job, why=why, tell_owner=False)
