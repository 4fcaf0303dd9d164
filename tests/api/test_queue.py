"""The queue listing: positions are places in the whole queue, whatever the filter or page."""

from __future__ import annotations

import pytest

from scheduling.jobs.models import Job

pytestmark = pytest.mark.django_db


def _positions(client, query: str = "") -> list[tuple[str, int]]:
    results = client.get(f"/api/v1/queue/?{query}").json()["results"]
    return [(entry["team"], entry["position"]) for entry in results]


def test_a_filtered_queue_shows_the_positions_the_scheduling_cycle_wrote(as_admin, alice, bob, teams, submit):
    jobs = [
        submit(alice, teams["training"]),
        submit(bob, teams["inference"]),
        submit(alice, teams["training"]),
        submit(bob, teams["inference"]),
    ]
    for position, job in enumerate(jobs, start=1):
        Job.objects.filter(pk=job.pk).update(queue_position=position)

    assert _positions(as_admin, "team=ai-lab/inference") == [("ai-lab/inference", 2), ("ai-lab/inference", 4)]
    assert _positions(as_admin, "page_size=1&page=3") == [("ai-lab/training", 3)]


def test_before_the_first_cycle_positions_rank_every_pending_job_in_submit_order(
    as_admin, alice, bob, teams, submit
):
    submit(alice, teams["training"])
    submit(bob, teams["inference"])
    submit(alice, teams["training"])
    submit(bob, teams["inference"])

    assert _positions(as_admin) == [
        ("ai-lab/training", 1),
        ("ai-lab/inference", 2),
        ("ai-lab/training", 3),
        ("ai-lab/inference", 4),
    ]
    assert _positions(as_admin, "team=ai-lab/inference") == [("ai-lab/inference", 2), ("ai-lab/inference", 4)]


def test_a_job_submitted_since_the_last_cycle_ranks_after_the_positioned_ones(
    as_admin, alice, bob, teams, submit
):
    first = submit(alice, teams["training"])
    second = submit(alice, teams["training"])
    Job.objects.filter(pk=first.pk).update(queue_position=2)
    Job.objects.filter(pk=second.pk).update(queue_position=1)
    submit(bob, teams["inference"])

    assert _positions(as_admin, "team=ai-lab/inference") == [("ai-lab/inference", 3)]
    assert _positions(as_admin) == [("ai-lab/training", 1), ("ai-lab/training", 2), ("ai-lab/inference", 3)]
