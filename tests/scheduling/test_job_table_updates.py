"""Each cycle rewrites the waiting jobs' reasons and positions: on PostgreSQL those rows are rewritten in place
(heap-only updates, migration 0021) where the page has room, not moved to another page with a new entry in every
index of the table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from scheduling.cycle.apply import _update_pending_rows
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgresql_only("PostgreSQL's fill factor and heap-only updates"),
]


def _updates() -> tuple[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
            [Job._meta.db_table],
        )
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, 0)


def test_a_cycles_reasons_and_positions_are_rewritten_in_place(alice, teams, node):
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [Job._meta.db_table])
        assert "fillfactor=60" in (cursor.fetchone()[0] or [])
    jobs = [
        job_submit(
            submitter=alice, team=teams["training"], spec=JobSpec(name=f"w{k}", command="sleep 1", gpus=1)
        )
        for k in range(40)
    ]
    before = _updates()
    eta = datetime.now(tz=UTC) + timedelta(hours=1)
    _update_pending_rows(
        [
            (job.pk, "waits_capacity", f"Waiting for 1 card: {k} jobs ahead of it.", k + 1, eta)
            for k, job in enumerate(jobs)
        ]
    )
    updated, in_place = (after - was for after, was in zip(_updates(), before, strict=True))
    assert updated == len(jobs)
    assert in_place >= len(jobs) // 2, in_place  # at the default fill factor (100 %), hardly any
    assert Job.objects.get(pk=jobs[7].pk).queue_position == 8
