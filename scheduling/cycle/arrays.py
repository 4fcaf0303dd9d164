"""Job arrays in the cycle: the array's pending tasks are one row; the engine sees as many of its tasks as could
start now, and the tasks it places become rows of their own as the placement is written.

- The snapshot (`array_entries`): an array's row stands for all its tasks not yet placed (`Job.array_pending`).
  The engine gets entries `<array>_<index>` (Slurm's `123_7`) for its lowest pending indexes: no more than its
  `%N` leaves room for (tasks placed, running or split off and still pending count), and no more than the free
  cards could take plus one (that one gets the engine's reason why the rest wait). Each is an ordinary queue entry
  with the array's submit time, so fair share ranks a sweep's tasks one by one against other teams' work (the
  team's earlier tasks count as started: `plugins/fairshare.py`), and one team's 10,000 tasks do not jump the
  queue.
- The apply (`array_tasks_split`, in the apply's transaction, under its epoch): each placed entry becomes a task
  row (a copy of the array's row, with its index) and the index leaves `array_pending`; the last one placed turns
  the array's row itself into that task. The array's row gets the reason of its first waiting entry, or says
  how many tasks its `%N` holds back.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import connection
from django.db.models import Count

from scheduling.choices import ActorKind, JobState
from scheduling.engine import types as eng
from scheduling.jobs.array_indexes import TaskIndexes
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.states import ACTIVE_STATES

SEPARATOR = "_"
THROTTLED = "array_throttled"
# The tasks that count against an array's %N: split off and not yet ended.
_OCCUPYING = (*ACTIVE_STATES, JobState.PENDING, JobState.PREEMPTED)


def task_entry_id(array_id: int, index: int) -> str:
    return f"{array_id}{SEPARATOR}{index}"


def task_entry(job_id: str) -> tuple[int, int] | None:
    """(array, index) of an engine entry standing for an array's task, None for any other job."""
    array, sep, index = job_id.partition(SEPARATOR)
    return (int(array), int(index)) if sep else None


def row_id(job_id: str) -> int:
    """The job row an engine entry stands for: an array's task not yet split off stands for its array."""
    entry = task_entry(job_id)
    return entry[0] if entry is not None else int(job_id)


@dataclass(frozen=True, slots=True)
class PendingArray:
    pk: int
    pending: TaskIndexes
    max_running: int | None
    occupied: int  # tasks split off and not ended

    @property
    def room(self) -> int:
        """How many more tasks may be split off now."""
        if self.max_running is None:
            return len(self.pending)
        return max(0, min(len(self.pending), self.max_running - self.occupied))


def pending_arrays(*, pks: list[int] | None = None) -> dict[int, PendingArray]:
    """The arrays with tasks not yet placed (these, or all), with how many of their tasks hold a %N's room."""
    rows = Job.objects.filter(state=JobState.PENDING).exclude(array_pending="")
    if pks is not None:
        rows = rows.filter(pk__in=pks)
    found = list(rows.values_list("pk", "array_pending", "array_max_running"))
    if not found:
        return {}
    throttled = [pk for pk, _, limit in found if limit is not None]
    occupied = Counter(
        dict(
            Job.objects.filter(array_job_id__in=throttled, state__in=_OCCUPYING, array_task_id__isnull=False)
            .values_list("array_job_id")
            .annotate(n=Count("id"))
            .values_list("array_job_id", "n")
        )
        if throttled
        else {}
    )
    return {
        pk: PendingArray(pk, TaskIndexes.parse(text), limit, occupied.get(pk, 0)) for pk, text, limit in found
    }


def _fits_on_free_cards(request: eng.Request, nodes: tuple[eng.Node, ...]) -> int:
    """About how many jobs of this shape the free cards could take now (an estimate that errs high: it ignores
    host CPU, topology and MIG profiles): whole cards on idle ones, slices on the room left on shared ones."""
    models = set(request.gpu_models)
    count = 0
    for node in nodes:
        if not node.schedulable:
            continue
        idle = 0
        for gpu in node.gpus:
            if gpu.health is eng.Health.FAILED or (models and gpu.model not in models):
                continue
            if gpu.memory_mib < request.min_gpu_memory_mib:
                continue
            if request.gpus:
                idle += gpu.is_idle
            elif gpu.sharing is not eng.Sharing.EXCLUSIVE:  # slices go on shared cards only
                count += _slices_on(request, gpu.free_memory_mib, gpu.free_compute_milli, gpu.sharing)
        if request.gpus:
            count += idle // request.gpus
    return count // max(1, request.nodes)


def _slices_on(request: eng.Request, memory_mib: int, compute_milli: int, sharing: eng.Sharing) -> int:
    by_memory = memory_mib // request.gpu_memory_mib if request.gpu_memory_mib else 1
    if sharing is eng.Sharing.TIMESLICE or not request.gpu_compute_milli:
        return max(0, by_memory)
    return max(0, min(by_memory, compute_milli // request.gpu_compute_milli))


def array_entries(
    pending: list[eng.Job], arrays: dict[int, PendingArray], nodes: tuple[eng.Node, ...]
) -> list[eng.Job]:
    """The queue with each array's row replaced by entries for the tasks that could start now (module doc)."""
    if not arrays:
        return pending
    fits: dict[eng.Request, int] = {}
    out: list[eng.Job] = []
    for job in pending:
        array = arrays.get(int(job.id)) if SEPARATOR not in job.id else None
        if array is None:
            out.append(job)
            continue
        if job.request not in fits:
            fits[job.request] = _fits_on_free_cards(job.request, nodes)
        wanted = min(array.room, fits[job.request] + 1)
        for index in array.pending.first(wanted):
            out.append(replace(job, id=task_entry_id(array.pk, index), reserved_on=()))
    return out


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
        for a in Job.objects.select_for_update()
        .select_related("submitter", "team")
        .filter(pk__in=set(taken) | waiting, state=JobState.PENDING)
        .exclude(array_pending="")
    }
    row_of: dict[str, int] = {}  # engine entry -> the task's row
    for array_id, indexes in taken.items():
        array = arrays.get(array_id)
        if array is None:
            continue  # cancelled (or already split) since the snapshot: its entries are dropped
        left = TaskIndexes.parse(array.array_pending)
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
            *_throttled(arrays_with_entries=reasoned | _placed_arrays(decisions), start=len(pending)),
        ),
        evictions=tuple(replace(e, preemptor_id=row(e.preemptor_id)) for e in decisions.evictions),
        reservations=tuple(r for r in decisions.reservations if task_entry(r.job_id) is None),
        borrowed=frozenset(row(j) for j in decisions.borrowed if task_entry(j) is None or j in row_of),
    )


def _placed_arrays(decisions: eng.Decisions) -> set[int]:
    return {entry[0] for p in decisions.placements if (entry := task_entry(p.job_id)) is not None}


def _throttled(*, arrays_with_entries: set[int], start: int) -> list[eng.Pending]:
    """A reason for each array with tasks left that had no entry this cycle: its %N holds them back."""
    held = {pk: a for pk, a in pending_arrays().items() if pk not in arrays_with_entries and a.room == 0}
    return [
        eng.Pending(
            job_id=str(pk),
            status=eng.Status(
                THROTTLED,
                f"At most {a.max_running} of its tasks run at once ({a.occupied} are placed, running or about to "
                f"start); the next of its {len(a.pending):,} waiting tasks starts when one of them ends.",
            ),
            position=start + k + 1,
        )
        for k, (pk, a) in enumerate(sorted(held.items()))
    ]
