"""Daily partitions of the big history tables on PostgreSQL, and pruning after the retention period.

`NodeMinute` and `GpuFiveMinute` are partitioned by range of `at`, one partition a UTC day, named
`<table>_pYYYYMMDD`. A partition exists before a row of its day is written (`partitions_ensure`), and a day older than the retention period is dropped whole: no row-by-row delete, no vacuum debt. The
small tables (models, teams, the queue, hourly usage and queue times, GPU events) are pruned by an indexed delete. On SQLite
(the embedded demo) every table is plain and pruned by delete.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from django.db import connection, transaction

from portal import database
from scheduling.history.models import (
    ClusterMinute,
    GpuEvent,
    GpuFiveMinute,
    ModelMinute,
    NodeHour,
    NodeMinute,
    TeamMinute,
    UsageHour,
    WaitHour,
)

PARTITIONED = (NodeMinute, GpuFiveMinute)
# Pruned by delete: model -> its time field.
DELETED = (
    (ModelMinute, "at"),
    (NodeHour, "hour"),
    (TeamMinute, "at"),
    (ClusterMinute, "at"),
    (UsageHour, "hour"),
    (WaitHour, "hour"),
    (GpuEvent, "at"),
)
_PARTITION = re.compile(r"_p(\d{8})$")


def partitioned() -> bool:
    return database.postgresql()


def _partition_name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def partitions_ensure(*, days: list[date]) -> None:
    """Create the daily partitions of these days where missing (two cheap statements a day asked for: the
    recorder asks once a minute, and a rolled-back transaction cannot leave a stale answer behind)."""
    if not partitioned():
        return
    with connection.cursor() as cursor:
        for day in sorted(set(days)):
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            for model in PARTITIONED:
                table = model._meta.db_table
                cursor.execute(
                    f"CREATE TABLE IF NOT EXISTS {_partition_name(table, day)} PARTITION OF {table} "
                    "FOR VALUES FROM (%s) TO (%s)",
                    [start, start + timedelta(days=1)],
                )


def partition_days(model) -> list[date]:
    """The days the model's table has partitions for, oldest first."""
    if not partitioned():
        return []
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
            [table],
        )
        names = [row[0] for row in cursor.fetchall()]
    days = []
    for name in names:
        found = _PARTITION.search(name)
        if found:
            days.append(datetime.strptime(found.group(1), "%Y%m%d").date())
    return sorted(days)


def history_prune(*, now: datetime, retention_days: int) -> dict[str, int]:
    """Drop what is older than the retention period: whole partitions of days before the cutoff, rows of the
    small tables before it. Returns what went, by table. Creates the next two days' partitions too."""
    cutoff = now - timedelta(days=retention_days)
    gone: dict[str, int] = {}
    if partitioned():
        today = now.astimezone(UTC).date()
        partitions_ensure(days=[today, today + timedelta(days=1), today + timedelta(days=2)])
        for model in PARTITIONED:
            table = model._meta.db_table
            old = [d for d in partition_days(model) if d + timedelta(days=1) <= cutoff.date()]
            with connection.cursor() as cursor:
                for day in old:
                    cursor.execute(f"DROP TABLE IF EXISTS {_partition_name(table, day)}")
            gone[table] = len(old)
    else:
        for model in PARTITIONED:
            gone[model._meta.db_table] = model.objects.filter(at__lt=cutoff).delete()[0]
    with transaction.atomic():
        for model, field in DELETED:
            gone[model._meta.db_table] = model.objects.filter(**{f"{field}__lt": cutoff}).delete()[0]
    return gone
