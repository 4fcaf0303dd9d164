"""Job arrays in the cycle: the array's pending tasks are one row; the engine sees as many of its tasks as could
start now, and the tasks it places become rows of their own as the placement is written (`array_split.py`).

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

from collections import Counter
from dataclasses import dataclass, replace

from django.db.models import Count

from scheduling.choices import JobState
from scheduling.engine import types as eng
from scheduling.jobs.array_indexes import ArraySpec, TaskIndexes
from scheduling.jobs.models import Job, JobDependency
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES

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
    # aftercorr (each task after the same task of these arrays succeeded): the pending tasks that may start now
    # (None: every one), those that never can, and the arrays waited for.
    ready: frozenset[int] | None = None
    never: frozenset[int] = frozenset()
    waits_for: tuple[int, ...] = ()

    @property
    def room(self) -> int:
        """How many more tasks may be split off now."""
        if self.max_running is None:
            return len(self.pending)
        return max(0, min(len(self.pending), self.max_running - self.occupied))

    def startable(self, count: int) -> list[int]:
        """The lowest `count` pending tasks that may start now."""
        if self.ready is None:
            return self.pending.first(count)
        return [i for i in self.pending if i in self.ready][: max(0, count)]


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
    arrays = {
        pk: PendingArray(pk, TaskIndexes.parse(text, trusted=True), limit, occupied.get(pk, 0))
        for pk, text, limit in found
    }
    return _with_task_dependencies(arrays)


def _with_task_dependencies(arrays: dict[int, PendingArray]) -> dict[int, PendingArray]:
    """Each array whose tasks wait task by task for another's (aftercorr), with which may start now and which
    never can: task i may once task i of every array named has succeeded, never once one ended otherwise."""
    each: dict[int, list[int]] = {}
    for job_id, on in JobDependency.objects.filter(
        job_id__in=list(arrays), when=JobDependency.EACH_TASK
    ).values_list("job_id", "on_id"):
        each.setdefault(job_id, []).append(on)
    if not each:
        return arrays
    targets = {on for ons in each.values() for on in ons}
    succeeded: dict[int, set[int]] = {}
    failed: dict[int, set[int]] = {}
    rows: dict[int, set[int]] = {}
    for array_id, index, state in Job.objects.filter(
        array_job_id__in=targets, array_task_id__isnull=False
    ).values_list("array_job_id", "array_task_id", "state"):
        rows.setdefault(array_id, set()).add(index)
        if state == JobState.SUCCEEDED:
            succeeded.setdefault(array_id, set()).add(index)
        elif state in TERMINAL_STATES:
            failed.setdefault(array_id, set()).add(index)
    # A task of theirs that is neither a row nor still pending ended before it was ever placed (cancelled, or
    # failed with its array's row): it never succeeds.
    for on, spec, pending in Job.objects.filter(pk__in=targets).values_list(
        "pk", "array_spec", "array_pending"
    ):
        if spec:
            waiting = set(TaskIndexes.parse(pending, trusted=True)) if pending else set()
            never_placed = set(ArraySpec.parse(spec).indexes) - waiting - rows.get(on, set())
            failed.setdefault(on, set()).update(never_placed)
    out = dict(arrays)
    for pk, ons in each.items():
        array = arrays[pk]
        ready = set(array.pending)
        never: set[int] = set()
        for on in ons:
            never |= ready & failed.get(on, set())
            ready &= succeeded.get(on, set())
        out[pk] = replace(array, ready=frozenset(ready - never), never=frozenset(never), waits_for=tuple(ons))
    return out


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
        for index in array.startable(wanted):
            out.append(replace(job, id=task_entry_id(array.pk, index), reserved_on=()))
    return out
