"""Job dependencies (sbatch's --dependency): whether what a job waits for has happened, can still happen, or never
will; and Slurm's `singleton`.

A dependency names a job and how it must have ended: `succeeded` (afterok), `ended` (afterany) or `failed`
(afternotok). A job array counts as all its tasks: it has succeeded when every task has, failed once any task
ended otherwise (then `succeeded` can never be met), ended when none is left to run. A singleton waits while an
earlier live job of its owner has its name (its own array's tasks aside). The cycle (`scheduling/cycle/`) keeps
a waiting job out of the engine's queue with its reason, and ends one whose dependency can never be met as
`dependency_never_satisfied`; submit refuses a dependency that already cannot be met.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.choices import JobState
from scheduling.errors import ServiceError
from scheduling.jobs.array_indexes import ArraySpec, TaskIndexes
from scheduling.jobs.fields import BAD_DEPENDENCY
from scheduling.jobs.models import Job, JobDependency
from scheduling.jobs.selectors import array_summaries
from scheduling.jobs.states import TERMINAL_STATES

MET, WAITING, NEVER = "met", "waiting", "never"
WAITS = "dependency"  # the pending reason's code while it waits
SINGLETON = "singleton"
_VERB = {"succeeded": "succeed", "ended": "end", "failed": "fail"}


@dataclass(frozen=True)
class Outcome:
    """How far a job (an array: all its tasks) has got, as its dependents read it."""

    job_id: int
    is_array: bool
    ended: bool  # nothing of it is left to run
    all_succeeded: bool
    any_failed: bool  # failed, cancelled or lost (an array: any task)
    words: str  # "it is running", "40 of its 100 tasks have ended"


def outcomes(*, job_ids: Iterable[int]) -> dict[int, Outcome]:
    """These jobs' outcomes (those that exist), in two statements: an array's from its tasks counted by state
    (`selectors.array_summaries`)."""
    jobs = list(
        Job.objects.filter(pk__in=list(job_ids)).only(
            "state", "array_job_id", "array_task_id", "array_pending", "array_task_count", "array_spec"
        )
    )
    summaries = array_summaries(jobs=jobs)
    out = {}
    for job in jobs:
        summary = summaries.get(job.pk)
        if summary is None:
            failed = job.state in (JobState.FAILED, JobState.CANCELLED)
            ended = job.state in TERMINAL_STATES
            out[job.pk] = Outcome(
                job.pk, False, ended, job.state == JobState.SUCCEEDED, failed, f"it is {job.state}"
            )
            continue
        counts = summary.counts
        live = sum(n for state, n in counts.items() if state not in TERMINAL_STATES)
        failed = counts.get(JobState.FAILED, 0) + counts.get(JobState.CANCELLED, 0)
        ended_tasks = summary.task_count - live
        out[job.pk] = Outcome(
            job.pk,
            True,
            live == 0,
            live == 0 and failed == 0,
            failed > 0,
            f"{ended_tasks:,} of its {summary.task_count:,} tasks have ended",
        )
    return out


def verdict(when: str, outcome: Outcome | None) -> str:
    """Whether a dependency is met, may still be, or never will be (a job that no longer exists: never)."""
    if outcome is None:
        return NEVER
    if when == JobDependency.ENDED:
        return MET if outcome.ended else WAITING
    if when == JobDependency.SUCCEEDED:
        return MET if outcome.all_succeeded else NEVER if outcome.any_failed else WAITING
    # failed: an array has failed once all of it has ended with some task not succeeding
    if outcome.ended:
        return MET if outcome.any_failed else NEVER
    return WAITING


def reason_words(when: str, outcome: Outcome | None, job_id: int) -> str:
    what = f"{'array' if outcome and outcome.is_array else 'job'} {job_id}"
    if outcome is None:
        return f"job {job_id} no longer exists"
    return f"waits for {what} to {_VERB[when]} ({outcome.words})"


def never_words(when: str, outcome: Outcome | None, job_id: int) -> str:
    if outcome is None:
        return f"job {job_id} no longer exists"
    what = f"{'array' if outcome.is_array else 'job'} {job_id}"
    if when == JobDependency.SUCCEEDED:
        some = "; some failed or were cancelled" if outcome.is_array else ""
        return f"{what} did not succeed ({outcome.words}{some})"
    return f"{what} succeeded, and this job was to start only if it failed"


@dataclass
class Holds:
    """The pending jobs that may not start now: why (code, reason), and those that never will (reason)."""

    waiting: dict[int, tuple[str, str]]
    never: dict[int, str]

    def __contains__(self, job_id: int) -> bool:
        return job_id in self.waiting or job_id in self.never


def dependency_holds() -> Holds:
    """For every pending job with a dependency or a singleton: whether it waits, or never can start. A few
    statements whatever the queue's size (none beyond two cheap checks when no pending job has either)."""
    holds = Holds({}, {})
    deps = list(
        JobDependency.objects.filter(job__state=JobState.PENDING)
        .exclude(when=JobDependency.EACH_TASK)  # held task by task (scheduling/cycle/arrays.py)
        .order_by("job_id", "id")
        .values_list("job_id", "on_id", "when")
    )
    if deps:
        known = outcomes(job_ids={on for _, on, _ in deps})
        for job_id, on, when in deps:
            outcome = known.get(on)
            said = verdict(when, outcome)
            if said == NEVER and job_id not in holds.never:
                holds.never[job_id] = never_words(when, outcome, on)
                holds.waiting.pop(job_id, None)
            elif said == WAITING and job_id not in holds.never and job_id not in holds.waiting:
                words = reason_words(when, outcome, on)
                holds.waiting[job_id] = (WAITS, f"{words[0].upper()}{words[1:]}.")
    for job_id, reason in _singletons_waiting().items():
        if job_id not in holds:
            holds.waiting[job_id] = (SINGLETON, reason)
    return holds


def _singletons_waiting() -> dict[int, str]:
    """Pending singletons with an earlier live job of their owner and name (not of their own array)."""
    singles = list(
        Job.objects.filter(state=JobState.PENDING, singleton=True).values_list(
            "pk", "submitter_id", "name", "array_job_id"
        )
    )
    if not singles:
        return {}
    live = defaultdict(list)
    for pk, submitter_id, name, array_id in (
        Job.objects.filter(
            submitter_id__in={s for _, s, _, _ in singles}, name__in={n for _, _, n, _ in singles}
        )
        .exclude(state__in=TERMINAL_STATES)
        .values_list("pk", "submitter_id", "name", "array_job_id")
    ):
        live[(submitter_id, name)].append((pk, array_id))
    waiting = {}
    for pk, submitter_id, name, array_id in singles:
        # An array's tasks are as old as the array (their rows are newer): compared by the array's id.
        mine = array_id or pk
        earlier = sorted(
            other_array or other
            for other, other_array in live[(submitter_id, name)]
            if (other_array or other) < mine and (array_id is None or other_array != array_id)
        )
        if earlier:
            waiting[pk] = (
                f"A singleton: waits for your job {earlier[0]} of the same name ({name}) to end"
                + (f", and {len(earlier) - 1} more" if len(earlier) > 1 else "")
                + "."
            )
    return waiting


def dependencies_check(
    *, depends_on: tuple[tuple[int, str], ...], visible: Iterable[int], tasks: TaskIndexes | None
) -> None:
    """Refuse, at submit, a dependency on a job the submitter cannot see (or that does not exist), or one that
    already can never be met (field `depends_on`, code `bad_dependency`). `visible`: of the named jobs, those the
    submitter may see; `tasks`: the submitted array's (None: not an array), each of which an `aftercorr` needs in
    the array it names."""
    seen = set(visible)
    for job_id, _ in depends_on:
        if job_id not in seen:
            raise ServiceError(
                f"depends_on: there is no job {job_id} that you may see.",
                field="depends_on",
                code=BAD_DEPENDENCY,
            )
    each = [job_id for job_id, when in depends_on if when == JobDependency.EACH_TASK]
    for job_id, array_spec, array_id in Job.objects.filter(pk__in=each).values_list(
        "pk", "array_spec", "array_job_id"
    ):
        if tasks is None:
            said = "aftercorr makes each task of an array wait for the same task of another: this job is no array"
        elif not array_spec:
            said = f"job {job_id} is not an array"
        elif array_id != job_id:
            said = f"job {job_id} is a task of array {array_id}: name the array"
        else:
            theirs = ArraySpec.parse(array_spec).indexes
            missing = next((i for i in tasks if i not in theirs), None)
            said = f"array {job_id} has no task {missing}" if missing is not None else ""
        if said:
            raise ServiceError(f"depends_on: {said}.", field="depends_on", code=BAD_DEPENDENCY)
    known = outcomes(job_ids=[job_id for job_id, when in depends_on if when != JobDependency.EACH_TASK])
    for job_id, when in depends_on:
        if when == JobDependency.EACH_TASK:
            continue
        if verdict(when, known.get(job_id)) == NEVER:
            raise ServiceError(
                f"depends_on: {never_words(when, known.get(job_id), job_id)}: this job could never start.",
                field="depends_on",
                code=BAD_DEPENDENCY,
            )
