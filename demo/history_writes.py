"""Writes the demo's generated past (`demo.history`): the replay's jobs with their events, and the rollups of each
minute, straight into their tables (hundreds of thousands of rows: one statement a batch)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection

from demo.workload import Submission
from quotas.models import PriorityClass
from scheduling.choices import ActorKind, JobState
from scheduling.history.models import (
    ClusterMinute,
    GpuFiveMinute,
    ModelMinute,
    NodeHour,
    NodeMinute,
    TeamMinute,
    UsageHour,
)
from scheduling.inventory.models import Gpu
from scheduling.jobs.chargeback import split_by_hour
from scheduling.jobs.models import Job, JobEvent

GENERATED = "Part of the demo's generated past (load_demo --history-days), not a job that ran here."
MILLI = 1000


@dataclass(eq=False)
class ReplayedJob:
    """A job of the generated past as the replay placed it (demo.history), to be written as a job that ran."""

    sub: Submission
    team_id: int
    user_id: int
    submitted: datetime
    started: datetime | None = None
    ends: datetime | None = None
    cards: list = field(default_factory=list)  # [(card, memory MiB, compute milli)]
    milli: int = 0
    memory_mib: int = 0


def insert_rows(model, columns: tuple[str, ...], rows: list[tuple]) -> None:
    if not rows:
        return
    marks = ", ".join(["%s"] * len(columns))
    sql = f"INSERT INTO {model._meta.db_table} ({', '.join(columns)}) VALUES ({marks})"
    with connection.cursor() as cursor:
        for k in range(0, len(rows), 5000):
            cursor.executemany(sql, rows[k : k + 5000])


def rollups_write(node_rows, node_hours, gpu_windows, model_rows, team_rows, cluster_rows) -> None:
    insert_rows(
        NodeMinute,
        (
            "node_id",
            "at",
            "state",
            "gpus",
            "allocated_milli",
            "util_pct",
            "memory_used_mib",
            "memory_allocated_mib",
            "memory_mib",
            "power_w",
            "temperature_max_c",
        ),
        node_rows,
    )
    insert_rows(
        NodeHour,
        ("node_id", "hour", "minutes", "gpus", "allocated_milli_sum", "util_pct_sum", "util_minutes"),
        [(*key, *v) for key, v in node_hours.items()],
    )
    insert_rows(
        GpuFiveMinute,
        (
            "gpu_id",
            "at",
            "node_id",
            "samples",
            "util_pct_sum",
            "memory_used_mib_max",
            "memory_allocated_mib",
            "temperature_c_max",
            "power_w_sum",
            "sm_clock_mhz_sum",
            "ecc_uncorrected",
        ),
        [(gpu, at, *v[:8], 0) for (gpu, at), v in gpu_windows.items()],
    )
    insert_rows(
        ModelMinute,
        (
            "at",
            "model_id",
            "gpus",
            "ready_gpus",
            "allocated_milli",
            "used_milli",
            "free_gpus",
            "stranded_milli",
        ),
        model_rows,
    )
    insert_rows(
        TeamMinute,
        (
            "at",
            "team_id",
            "guaranteed_milli",
            "limit_milli",
            "held_milli",
            "borrowed_milli",
            "fair_share_milli",
            "pending_jobs",
            "pending_milli",
            "running_jobs",
        ),
        team_rows,
    )
    insert_rows(ClusterMinute, ("at", "pending_jobs", "running_jobs", "ready_nodes", "nodes"), cluster_rows)


def jobs_write(jobs: list[ReplayedJob], *, now: datetime, quotas: dict) -> None:
    """The replay's jobs as finished jobs with their events: those still running when the past ends are stopped
    there, those still waiting are cancelled (the demo's own queue starts afresh)."""
    fallback = PriorityClass.objects.order_by("value").values_list("pk", flat=True).first()
    rows, ends = [], []
    for j in jobs:
        k, q = j.sub.kind, quotas[j.team_id]
        spec = j.sub.spec()
        done = j.started is not None and j.ends <= now
        end = j.ends if done or (j.started is None and j.ends is not None) else now
        rows.append(
            Job(
                team_id=j.team_id,
                submitter_id=j.user_id,
                name=j.sub.name,
                command=k.command,
                gpus=k.gpus,
                gpu_models=list(k.models),
                gpu_memory_mib=spec.gpu_memory_mib,
                compute_pct=k.compute_pct,
                priority_class_id=q.default_priority_class_id or fallback,
                max_runtime_s=spec.max_runtime_s,
                state=JobState.SUCCEEDED if done else JobState.CANCELLED,
                placed_at=j.started,
                started_at=j.started,
                finished_at=end,
                exit_code=0 if done else None,
                attempt=1 if j.started else 0,
            )
        )
        ends.append(end)
    created = Job.objects.bulk_create(rows, batch_size=1000)
    _set_times(Job, "submitted_at", [(j.submitted, job.pk) for job, j in zip(created, jobs, strict=True)])
    events: list[tuple[JobEvent, datetime]] = []
    for job, j, end in zip(created, jobs, ends, strict=True):
        said = {"generated": True}
        events.append(
            _event(job, j.submitted, ("", JobState.PENDING), ActorKind.USER, "submitted", GENERATED)
        )
        if j.started is None:
            waited = f"{GENERATED} Cancelled while it waited."
            events.append(
                _event(
                    job, end, (JobState.PENDING, JobState.CANCELLED), ActorKind.SYSTEM, "cancelled", waited
                )
            )
            continue
        placed = {
            **said,
            "nodes": sorted({c.node for c, _, _ in j.cards}),
            "gpus": [[c.node, c.index, mib, milli] for c, mib, milli in j.cards],
        }
        where = ", ".join(f"{c.node} GPU {c.index}" for c, _, _ in j.cards)
        events += [
            _event(
                job,
                j.started,
                (JobState.PENDING, JobState.PLACED),
                ActorKind.SCHEDULER,
                "placed",
                f"Placed on {where}. {GENERATED}",
                placed,
            ),
            _event(
                job, j.started, (JobState.PLACED, JobState.RUNNING), ActorKind.AGENT, "started", GENERATED
            ),
        ]
        if job.state == JobState.SUCCEEDED:
            exited = f"Exited with code 0. {GENERATED}"
            events.append(
                _event(
                    job,
                    end,
                    (JobState.RUNNING, JobState.SUCCEEDED),
                    ActorKind.AGENT,
                    "exited",
                    exited,
                    {**said, "exit_code": 0},
                )
            )
        else:
            stopped = f"{GENERATED} Stopped where the generated past ends."
            events.append(
                _event(
                    job, end, (JobState.RUNNING, JobState.CANCELLED), ActorKind.SYSTEM, "cancelled", stopped
                )
            )
    made = JobEvent.objects.bulk_create([e for e, _ in events], batch_size=2000)
    _set_times(JobEvent, "at", [(at, event.pk) for event, (_, at) in zip(made, events, strict=True)])


def _event(
    job: Job,
    at: datetime,
    states: tuple[str, str],
    actor_kind: str,
    code: str,
    message: str,
    data: dict | None = None,
) -> tuple[JobEvent, datetime]:
    """One event of a generated job (from, to), with the time it is given once written."""
    from_state, to_state = states
    event = JobEvent(
        job=job,
        from_state=from_state,
        to_state=to_state,
        actor_kind=actor_kind,
        code=code,
        message=message,
        data=data if data is not None else {"generated": True},
    )
    return event, at


def _set_times(model, column: str, values: list[tuple[datetime, int]]) -> None:
    """The generated times of rows just made (their own fields say when they were saved)."""
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {model._meta.db_table} SET {column} = %s WHERE id = %s", values)


def idle_add(jobs: list[ReplayedJob], *, now: datetime) -> None:
    """The idle notebooks' GPU time, hour by hour, as the recorder counts idle-allocated time."""
    model_of = dict(Gpu.objects.values_list("pk", "model_id"))
    idle: dict[tuple, float] = defaultdict(float)
    for j in jobs:
        if not j.sub.kind.idle or j.started is None:
            continue
        for hour, seconds in split_by_hour(j.started, min(j.ends, now)):
            idle[(hour, j.team_id, j.user_id, model_of[j.cards[0][0].pk])] += j.milli / MILLI * seconds
    table = UsageHour._meta.db_table
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET idle_gpu_seconds = idle_gpu_seconds + %s "
            "WHERE hour = %s AND team_id = %s AND user_id = %s AND model_id = %s",
            [(round(seconds, 3), *key) for key, seconds in idle.items()],
        )
