"""Which nodes are silent is one rule (scheduling.cycle.node_loss): the filter the watchdog and the API read, and the
same rule for one node in hand, which a job's page uses on the nodes it read with the job. Both give the same
answer, and so does the job's `node_condition` whichever way it is read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.choices import JobState, NodeState
from scheduling.cycle import node_loss
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.selectors import job_for_user, job_node_silence
from scheduling.jobs.submit import job_submit

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def _nodes(settings) -> dict[str, Node]:
    lost_after = timedelta(seconds=settings.TESSERA_NODE_LOST_AFTER_S)
    now = timezone.now()
    made = {
        "fresh": dict(last_heartbeat_at=now - lost_after / 2),
        "stale": dict(last_heartbeat_at=now - lost_after * 2),
        "lost-but-heard": dict(state=NodeState.LOST, last_heartbeat_at=now),
        "never-heard-new": dict(last_heartbeat_at=None),
        "never-heard-old": dict(last_heartbeat_at=None),
    }
    for name, fields in made.items():
        Node.objects.create(name=name, cpu_milli=64_000, memory_mib=512 * 1024, **fields)
    Node.objects.filter(name="never-heard-old").update(created_at=now - lost_after * 3)
    return {n.name: n for n in Node.objects.all()}


def test_the_filter_and_the_rule_for_one_node_agree(settings):
    nodes = _nodes(settings)
    now = timezone.now()
    by_filter = set(Node.objects.filter(node_loss.silent_filter(now=now)).values_list("name", flat=True))
    by_rule = {name for name, n in nodes.items() if node_loss.node_is_silent(node=n, now=now)}
    assert by_filter == by_rule == {"stale", "lost-but-heard", "never-heard-old"}


def test_a_jobs_page_reads_its_node_condition_from_the_nodes_it_has_as_the_query_does(
    settings, alice, teams, a100, node
):
    nodes = _nodes(settings)
    for k, on in enumerate(("fresh", "stale")):
        job = job_submit(
            submitter=alice, team=teams["training"], spec=JobSpec(name=f"on-{on}", command="sleep 60", gpus=2)
        )
        Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=timezone.now())
        for index, on_node in enumerate((nodes["fresh"], nodes[on])):  # two nodes, or two cards of one
            gpu = Gpu.objects.create(
                node=on_node, index=2 * k + index, uuid=f"GPU-{on}-{index}", model=a100, memory_mib=81920
            )
            Slice.objects.create(job=job, gpu=gpu, memory_mib=81920, compute_pct=100)
        read = job_for_user(user=alice, job_id=job.pk)
        with CaptureQueriesContext(connection) as queries:
            in_hand = job_node_silence(job=read)
        assert len(queries) == 0
        queried = job_node_silence(job=Job.objects.get(pk=job.pk))
        if on == "fresh":
            assert in_hand is None and queried is None
        else:
            assert in_hand is not None and in_hand.as_dict() == queried.as_dict()
            assert (in_hand.node, in_hand.code) == ("stale", "node_not_responding")
