"""A job array's task indexes, written as Slurm writes them, and kept as compact runs.

`0-999%50` is tasks 0 to 999, at most 50 running at once; `0-100:10` every tenth; `1,3,8-9` a list. The pending
tasks of an array are one row (`Job.array_pending`, these runs written out) until each is placed: taking the
next tasks, or cancelling some, rewrites the runs, never one row per task. Pure Python.
"""

from __future__ import annotations

import bisect
import heapq
import re
from dataclasses import dataclass
from itertools import islice

from scheduling.jobs.fields import MAX_ARRAY_CHARS

# The highest task index (Slurm's MaxArraySize is a site setting too); the number of tasks is bounded separately
# (TESSERA_MAX_ARRAY_TASKS).
MAX_TASK_INDEX = 4_000_000

_RUN = re.compile(r"^([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?$")
# Runs as a pattern (what a schema can say of them): 3-7, 0-99:10, 1,4,9.
_RUN_PATTERN = r"[0-9]{1,7}(-[0-9]{1,7}(:[0-9]{1,7})?)?"
TASKS_PATTERN = rf"^ *{_RUN_PATTERN}( *, *{_RUN_PATTERN})* *$"


# The refusal's code (portal/api_schema.py RULE_CODES) for an array written wrong.
ARRAY_SYNTAX = "array_syntax"


class ArrayError(ValueError):
    """An array written wrong: the message says what and where."""


class ArrayTooLarge(ArrayError):
    """More tasks than an array may have."""


@dataclass(frozen=True, slots=True)
class Run:
    start: int
    stop: int  # inclusive, on the step
    step: int = 1

    def __len__(self) -> int:
        return (self.stop - self.start) // self.step + 1

    def __contains__(self, index: object) -> bool:
        return (
            isinstance(index, int)
            and self.start <= index <= self.stop
            and (index - self.start) % self.step == 0
        )

    def written(self) -> str:
        if self.start == self.stop:
            return str(self.start)
        if self.step == 1:
            return f"{self.start}-{self.stop}"
        return f"{self.start}-{self.stop}:{self.step}"


def _normalized(run: Run) -> Run:
    stop = run.start + (run.stop - run.start) // run.step * run.step
    return Run(run.start, stop, 1 if stop == run.start else run.step)


@dataclass(frozen=True, slots=True)
class TaskIndexes:
    """An ordered set of task indexes as runs (start-stop:step), no index twice."""

    runs: tuple[Run, ...] = ()

    @classmethod
    def parse(cls, text: str, *, max_tasks: int | None = None, trusted: bool = False) -> TaskIndexes:
        """Runs as written: `0-999`, `0-100:10`, `1,3,8-9` (no `%`). Refused: an empty part, a range that runs
        backwards, an index past MAX_TASK_INDEX, more than `max_tasks` tasks, an index given twice. `trusted`:
        runs this code wrote (an array's pending tasks), not checked for an index given twice."""
        runs = []
        for part in text.replace(" ", "").split(","):
            match = _RUN.match(part)
            if match is None:
                raise ArrayError(
                    f"{part!r} is not a task index, a range (0-99) or a stepped range (0-99:10)"
                    if part
                    else "has an empty part (two commas, or a trailing comma)"
                )
            start = int(match.group(1))
            stop = int(match.group(2)) if match.group(2) is not None else start
            step = int(match.group(3)) if match.group(3) is not None else 1
            if stop < start:
                raise ArrayError(f"{part!r} runs backwards ({start} > {stop})")
            if step < 1:
                raise ArrayError(f"{part!r} has a step of 0")
            if stop > MAX_TASK_INDEX:
                raise ArrayError(f"task indexes go up to {MAX_TASK_INDEX} (got {stop})")
            runs.append(_normalized(Run(start, stop, step)))
        indexes = cls(tuple(sorted(runs, key=lambda r: r.start)))
        count = len(indexes)
        if max_tasks is not None and count > max_tasks:
            raise ArrayTooLarge(f"has {count:,} tasks; an array has at most {max_tasks:,}")
        if trusted:
            return indexes
        if count > 1_000_000:
            raise ArrayTooLarge(f"has {count:,} tasks, far more than an array may have")
        seen: set[int] = set()
        for run in indexes.runs:
            for i in range(run.start, run.stop + 1, run.step):
                if i in seen:
                    raise ArrayError(f"task {i} is given twice")
                seen.add(i)
        return indexes

    @classmethod
    def of(cls, indexes: list[int] | set[int]) -> TaskIndexes:
        """These indexes as runs of consecutive ones."""
        runs: list[Run] = []
        for i in sorted(set(indexes)):
            if runs and runs[-1].stop + 1 == i and runs[-1].step == 1:
                runs[-1] = Run(runs[-1].start, i)
            else:
                runs.append(Run(i, i))
        return cls(tuple(runs))

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def __contains__(self, index: object) -> bool:
        return any(index in r for r in self.runs)

    def __iter__(self):
        """In ascending order (runs may interleave: `0-100:10,5`)."""
        return heapq.merge(*(range(r.start, r.stop + 1, r.step) for r in self.runs))

    def written(self) -> str:
        return ",".join(r.written() for r in self.runs)

    def first(self, count: int) -> list[int]:
        """The lowest `count` indexes."""
        return list(islice(iter(self), max(0, count)))

    def without(self, indexes: set[int] | frozenset[int]) -> TaskIndexes:
        """These indexes taken out (those not in the set are ignored)."""
        if not indexes:
            return self
        ordered = sorted(indexes)
        runs: list[Run] = []
        for run in self.runs:
            lo, hi = bisect.bisect_left(ordered, run.start), bisect.bisect_right(ordered, run.stop)
            gone = [i for i in ordered[lo:hi] if (i - run.start) % run.step == 0]
            if not gone:
                runs.append(run)
                continue
            start = run.start
            for i in gone:
                if i > start:
                    runs.append(_normalized(Run(start, i - run.step, run.step)))
                start = i + run.step
            if start <= run.stop:
                runs.append(_normalized(Run(start, run.stop, run.step)))
        return TaskIndexes(tuple(runs))


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """An array as submitted: its tasks and at most how many of them run at once (None: no limit)."""

    indexes: TaskIndexes
    max_running: int | None = None

    @classmethod
    def parse(cls, text: str, *, max_tasks: int | None = None) -> ArraySpec:
        """`0-999%50`: the runs, then optionally `%` and the most tasks running at once."""
        if len(text) > MAX_ARRAY_CHARS:
            raise ArrayError(f"is at most {MAX_ARRAY_CHARS} characters (got {len(text)})")
        text = text.strip()
        runs, percent, limit = text.partition("%")
        if not runs:
            raise ArrayError("names no tasks: write them as 0-99, 0-99:10 or 1,3,8")
        max_running = None
        if percent:
            if not (limit.isascii() and limit.isdigit()) or len(limit) > 7:
                raise ArrayError(f"%{limit} is not a whole number of tasks to run at once")
            max_running = int(limit)
            if max_running < 1:
                raise ArrayError("%0 would never run a task: write %1 or more")
        return cls(TaskIndexes.parse(runs, max_tasks=max_tasks), max_running)

    def written(self) -> str:
        limit = f"%{self.max_running}" if self.max_running is not None else ""
        return self.indexes.written() + limit
