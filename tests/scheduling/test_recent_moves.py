"""The cluster page's "Moved to make room": from where, to where and why, another team's job named by its team
only (as its slices are on the map)."""

from __future__ import annotations

import pytest

from scheduling.choices import ActorKind, JobState
from scheduling.inventory.cluster_map import recent_moves
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import JobEvent
from scheduling.jobs.submit import job_submit


@pytest.mark.django_db
def test_a_move_says_where_and_why_and_names_only_the_viewer_s_own_jobs(alice, bob, teams, node):
    job = job_submit(
        submitter=alice, team=teams["training"], spec=JobSpec(name="small", command="sleep 60", gpus=1)
    )
    JobEvent.objects.create(
        job=job,
        from_state=JobState.RUNNING,
        to_state=JobState.PREEMPTED,
        actor_kind=ActorKind.SCHEDULER,
        code="moved",
        data={
            "nodes": ["h100-01"],
            "to_nodes": ["l4-02"],
            "why": "moved to l4-02 to free an NVLink node for team llm's guaranteed 8-GPU job 41",
        },
    )
    (mine,) = recent_moves(user=alice)
    assert (mine.job_id, mine.job_name, mine.team) == (job.pk, "small", teams["training"].slug)
    assert (mine.from_nodes, mine.to_nodes) == (("h100-01",), ("l4-02",))
    assert mine.why == "to free an NVLink node for team llm's guaranteed 8-GPU job #41"
    (theirs,) = recent_moves(user=bob)  # bob is not in the training team
    assert (theirs.job_id, theirs.job_name, theirs.team) == (None, None, teams["training"].slug)
