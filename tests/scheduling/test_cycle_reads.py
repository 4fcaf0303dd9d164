"""The cycle's snapshot, read from rows, is what plain model-instance reads give, on a varied database (the bench's
seed at a small size: whole-GPU jobs, MPS / MIG / time-slice slices, NVLink islands, gangs, borrowed jobs, per-model
quotas and class limits, cordoned and draining nodes), in a number of statements that does not grow with the cluster.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.snapshot_read import seed
from scheduling.choices import JobState, LinkKind
from scheduling.cycle import snapshot
from scheduling.engine import types as eng
from scheduling.inventory.engine_view import engine_gpu, engine_node
from scheduling.inventory.models import Gpu, GpuLink, Node
from scheduling.jobs.models import Job, Slice
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.usage import decayed_usage

pytestmark = pytest.mark.django_db

NOW_S = 1.9e9


@pytest.fixture
def cluster(db):
    seeded = seed(nodes=12, pending=80)
    spare = Node.objects.create(name="spare-01", cpu_milli=64_000, memory_mib=512 * 1024)
    Gpu.objects.create(
        node=spare, index=0, uuid="GPU-spare-0", model_id=Gpu.objects.first().model_id, memory_mib=81920
    )
    return seeded


def snapshot_from_instances(now_s: float) -> eng.Snapshot:
    """The snapshot as the cycle read it before it read rows: model instances through `engine_job`,
    `engine_gpu` and `engine_node` (the converters the what-if and submit validation still use)."""
    active = list(Job.objects.filter(state__in=ACTIVE_STATES).select_related("team", "priority_class"))
    slices_by_job: dict[int, list[Slice]] = defaultdict(list)
    for s in Slice.objects.filter(job__state__in=ACTIVE_STATES).select_related("gpu__node"):
        slices_by_job[s.job_id].append(s)
    holders = Counter(s.gpu_id for ss in slices_by_job.values() for s in ss)
    host_used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    running = []
    for job in active:
        ej = snapshot.engine_job(job, slices_by_job.get(job.pk, []))
        running.append(ej)
        for node_name, (cpu_milli, mem_mib) in ej.cpu_assignments.items():
            host_used[node_name][0] += cpu_milli
            host_used[node_name][1] += mem_mib
    nvlink: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for node_id, a, b in GpuLink.objects.filter(kind=LinkKind.NVLINK).values_list(
        "gpu_a__node_id", "gpu_a__index", "gpu_b__index"
    ):
        nvlink[node_id].add((min(a, b), max(a, b)))
    gpus_by_node: dict[int, list[eng.Gpu]] = defaultdict(list)
    for g in Gpu.objects.select_related("model").order_by("node_id", "index"):
        gpus_by_node[g.node_id].append(engine_gpu(g, holders=holders.get(g.pk, 0)))
    nodes = tuple(
        engine_node(
            n,
            gpus=gpus_by_node.get(n.pk, ()),
            nvlink=nvlink.get(n.pk, ()),
            allocated_cpu_milli=host_used[n.name][0],
            allocated_memory_mib=host_used[n.name][1],
        )
        for n in Node.objects.order_by("name")
    )
    pending = tuple(
        snapshot.engine_job(job)
        for job in Job.objects.filter(state=JobState.PENDING)
        .select_related("team", "priority_class")
        .order_by("submitted_at", "id")
    )
    recent = Job.objects.order_by("-submitted_at", "-id")[: snapshot.WORKLOAD_HISTORY_JOBS]
    shapes = Counter(
        snapshot.job_request(job) for job in recent if job.gpus or job.gpu_memory_mib or job.compute_pct
    )
    total = sum(shapes.values())
    return eng.Snapshot(
        now=now_s,
        nodes=nodes,
        running=tuple(running),
        pending=pending,
        quotas=snapshot.engine_quotas(),
        usage=decayed_usage(now_s=now_s, half_life_s=settings.TESSERA_FAIRSHARE_HALF_LIFE_S),
        workload=tuple((req, count / total) for req, count in shapes.most_common()),
    )


def test_the_snapshot_read_from_rows_equals_the_one_built_from_model_instances(cluster):
    snap = snapshot.snapshot_from_db(now_s=NOW_S)
    assert snap == snapshot_from_instances(NOW_S)
    # The database is as varied as it claims, so the equality above says something.
    assert len(snap.nodes) == 13 and len(snap.pending) == 80
    assert {n.state for n in snap.nodes} >= {eng.NodeState.READY, eng.NodeState.CORDONED}
    cards = [g for n in snap.nodes for g in n.gpus]
    assert {g.sharing for g in cards} == set(eng.Sharing)
    assert any(g.mig_profiles_mib for g in cards) and any(n.nvlink for n in snap.nodes)
    assert any(len({a.node for a in j.assignments}) == 2 for j in snap.running), "a gang"
    assert any(len(j.assignments) == 2 and len(j.cpu_assignments) == 1 for j in snap.running)
    assert any(j.borrowed for j in snap.running) and any(g.holders > 1 for g in cards)
    assert any(q.per_model for q in snap.quotas.values()) and any(
        q.class_limits for q in snap.quotas.values()
    )
    assert snap.workload


def test_equal_requests_are_one_object(cluster):
    snap = snapshot.snapshot_from_db(now_s=NOW_S)
    jobs = snap.running + snap.pending
    by_value = {j.request: j.request for j in jobs}
    assert all(j.request is by_value[j.request] for j in jobs)
    assert len(by_value) < len(jobs) / 4


def shrink_to(*, nodes: int) -> None:
    """Keep the first `nodes` nodes of the seeded cluster, and what runs there only."""
    gone = Node.objects.filter(name__gte=f"node-{nodes:04d}")
    Job.objects.filter(slices__gpu__node__in=gone).delete()
    Job.objects.filter(state=JobState.PENDING, pk__in=Job.objects.order_by("-id").values("id")[:40]).delete()
    gone.delete()


def test_the_snapshot_reads_the_same_number_of_statements_whatever_the_cluster_size(cluster):
    with CaptureQueriesContext(connection) as large:
        snapshot.snapshot_from_db(now_s=NOW_S)
    shrink_to(nodes=3)
    with CaptureQueriesContext(connection) as small:
        snapshot.snapshot_from_db(now_s=NOW_S)
    assert len(large) == len(small)
