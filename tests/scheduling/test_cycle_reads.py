"""The cycle's two bulk reads give what plain model-instance reads give, on a varied database (the bench's seed
at a small size: whole-GPU jobs, MPS / MIG / time-slice slices, NVLink islands, gangs, one failing, borrowed jobs,
per-model quotas and class limits, cordoned and draining nodes): the snapshot, and each node's desired state; both
in a number of statements that does not grow with the cluster.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.snapshot_read import seed
from scheduling.choices import JobState, LinkKind, SharingMode
from scheduling.cycle import desired_state, node_loss, snapshot
from scheduling.cycle.models import NodeSync
from scheduling.engine import types as eng
from scheduling.inventory.engine_view import engine_gpu, engine_node
from scheduling.inventory.models import Gpu, GpuLink, Node
from scheduling.jobs.models import GangMember, Job, Slice
from scheduling.jobs.selectors import gang_members_of, gangs_failing
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.usage import decayed_usage

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

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


@pytest.mark.postgresql_only("decayed usage's plain path reads each slice job's card on its own")
def test_the_snapshot_reads_the_same_number_of_statements_whatever_the_cluster_size(cluster):
    with CaptureQueriesContext(connection) as large:
        snapshot.snapshot_from_db(now_s=NOW_S)
    shrink_to(nodes=3)
    with CaptureQueriesContext(connection) as small:
        snapshot.snapshot_from_db(now_s=NOW_S)
    assert len(large) == len(small)


def desired_jobs_from_instances(node: Node) -> tuple[dict, ...]:
    """A node's desired jobs as they were built node by node from model instances."""
    by_job: dict[int, list[Slice]] = defaultdict(list)
    for s in Slice.objects.filter(gpu__node=node, job__state__in=ACTIVE_STATES).select_related("gpu"):
        by_job[s.job_id].append(s)
    jobs = Job.objects.filter(pk__in=by_job).select_related("priority_class", "submitter").order_by("pk")
    gangs = [job.pk for job in jobs if job.nodes > 1]
    members: dict[int, list[GangMember]] = gang_members_of(job_ids=gangs) if gangs else {}
    failing = gangs_failing(job_ids=gangs) if gangs else set()
    entries = []
    for job in jobs:
        if job.pk in failing:
            continue
        gpus = []
        for s in sorted(by_job[job.pk], key=lambda s: s.gpu.index):
            whole = s.gpu.sharing_mode == SharingMode.EXCLUSIVE
            gpus.append(
                {
                    "uuid": s.gpu.uuid,
                    "index": s.gpu.index,
                    "memory_mib": None if whole else s.memory_mib,
                    "compute_pct": None if whole else s.compute_pct,
                    "sharing": "timeslice"
                    if s.gpu.sharing_mode == SharingMode.TIMESLICE
                    else s.gpu.sharing_mode,
                }
            )
        entry = {
            "job_id": str(job.pk),
            "attempt": job.attempt,
            "name": job.name,
            "command": job.command,
            "cwd": job.workdir or None,
            "env": {
                **{str(k): str(v) for k, v in job.env.items()},
                "TESSERA_JOB_ID": str(job.pk),
                "TESSERA_ATTEMPT": str(job.attempt),
            },
            "gpus": gpus,
            "max_runtime_s": job.max_runtime_s,
            "grace_s": float(job.priority_class.preemption_grace_s),
            "fence_after_s": node_loss.fence_after_s(),
            "cpu_milli": job.cpu_milli,
            "memory_mib": job.memory_mib,
            "user": job.submitter.get_username(),
        }
        gang = members.get(job.pk, [])
        rank = next((m.rank for m in gang if m.node_id == node.pk), None)
        if rank is not None:
            entry["gang"] = {
                "rank": rank,
                "master_port": gang[0].port,
                "members": [{"node": m.node.name, "address": m.address, "slots": job.gpus} for m in gang],
            }
        entries.append(entry)
    return tuple(entries)


def versions() -> dict[str, tuple[int, str]]:
    return {
        name: (version, digest)
        for name, version, digest in NodeSync.objects.values_list(
            "node__name", "desired_version", "desired_digest"
        )
    }


def test_each_nodes_desired_jobs_are_those_built_node_by_node_from_model_instances(cluster):
    bulk = desired_state._desired_jobs_by_node(node_ids=None)
    for node in Node.objects.all():
        expected = desired_jobs_from_instances(node)
        assert bulk.get(node.pk, ()) == expected, node.name
        assert desired_state.desired_jobs(node=node) == expected, node.name
    entries = [e for jobs in bulk.values() for e in jobs]
    assert sum("gang" in e for e in entries) >= 2 and any(e["gpus"][0]["sharing"] == "mig" for e in entries)
    assert len(bulk) < Node.objects.count(), "some nodes run nothing"


def test_the_sync_of_all_nodes_gives_each_node_the_version_and_digest_the_node_by_node_path_gives(
    cluster, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as pushed:
        changed = desired_state.desired_state_sync()
    assert changed == list(Node.objects.order_by("name").values_list("name", flat=True))
    assert len(pushed) == len(changed)
    bulk = versions()
    for node in Node.objects.all():
        state, moved = desired_state.desired_state_for_node(node=node)
        assert not moved, node.name
        assert (state.version, desired_state._digest(state.jobs)) == bulk[node.name]
    # Node by node first, the whole cluster after: the same again, and nothing moves.
    Job.objects.filter(pk=Job.objects.filter(state=JobState.RUNNING, nodes=1).order_by("id")[0].pk).update(
        state=JobState.SUCCEEDED
    )
    NodeSync.objects.update(desired_version=0, desired_digest="")
    by_node = {n.name: desired_state.desired_state_for_node(node=n)[0] for n in Node.objects.all()}
    assert desired_state.desired_state_sync() == []
    assert versions() == {name: (s.version, desired_state._digest(s.jobs)) for name, s in by_node.items()}


def test_only_the_nodes_whose_jobs_changed_move_and_are_told(cluster, django_capture_on_commit_callbacks):
    desired_state.desired_state_sync()
    before = versions()
    job = Job.objects.filter(state=JobState.RUNNING, nodes=1).order_by("id")[0]
    node = job.slices.first().gpu.node
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    with django_capture_on_commit_callbacks(execute=False) as pushed:
        assert desired_state.desired_state_sync() == [node.name]
    assert len(pushed) == 1
    after = versions()
    assert after[node.name][0] == before[node.name][0] + 1
    assert {k: v for k, v in after.items() if k != node.name} == {
        k: v for k, v in before.items() if k != node.name
    }
    assert desired_state.desired_state_sync(nodes=[node]) == []


@pytest.mark.postgresql_only("set-based writes; SQLite, in process, takes a statement per row")
def test_the_sync_reads_and_writes_the_same_number_of_statements_whatever_the_cluster_size(cluster):
    def counts() -> tuple[int, int, int]:
        NodeSync.objects.all().delete()
        out = []
        for _ in range(2):  # every node created and moved, then none
            with CaptureQueriesContext(connection) as queries:
                desired_state.desired_state_sync()
            out.append(len(queries))
        NodeSync.objects.update(desired_digest="")  # every node moved
        with CaptureQueriesContext(connection) as queries:
            desired_state.desired_state_sync()
        return (*out, len(queries))

    large = counts()
    shrink_to(nodes=3)
    assert counts() == large


def test_a_job_that_ends_between_the_reads_of_its_slices_and_its_row_is_left_out(cluster, monkeypatch):
    """The slices and the jobs are two statements: a job ending in between (its agent's exit report committing)
    was a KeyError that closed the node's agent socket (bench/cluster_scale.py)."""
    node_id, victim = Slice.objects.filter(job__state__in=ACTIVE_STATES, job__nodes=1).values_list(
        "gpu__node_id", "job_id"
    )[0]
    real_card = desired_state.Card
    ended = []

    def card_then_end(*fields):  # called while the slices are read, before the jobs are
        if not ended:
            ended.append(Job.objects.filter(pk=victim).update(state=JobState.SUCCEEDED))
        return real_card(*fields)

    monkeypatch.setattr(desired_state, "Card", card_then_end)
    jobs = desired_state._desired_jobs_by_node(node_ids=[node_id]).get(node_id, ())
    assert ended == [1]
    assert victim not in [int(j["job_id"]) for j in jobs]


def test_a_job_runs_as_its_submitters_unix_account_from_the_directory_else_as_their_username(cluster):
    from django.utils import timezone

    from quotas.models import DirectoryAccount

    running = Job.objects.filter(state=JobState.RUNNING, nodes=1).select_related("submitter").order_by("id")
    job = running[0]
    others = [j for j in running if j.submitter_id != job.submitter_id]
    DirectoryAccount.objects.create(
        user=job.submitter, source="ldap", subject="uid=x", unix_account="ada.l", synced_at=timezone.now()
    )
    entries = {
        int(e["job_id"]): e
        for jobs in desired_state._desired_jobs_by_node(node_ids=None).values()
        for e in jobs
    }
    assert entries[job.pk]["user"] == "ada.l"
    assert others and all(entries[j.pk]["user"] == j.submitter.username for j in others)
    DirectoryAccount.objects.filter(user=job.submitter).update(unix_account="")  # the directory names none
    entries = {
        int(e["job_id"]): e
        for jobs in desired_state._desired_jobs_by_node(node_ids=None).values()
        for e in jobs
    }
    assert entries[job.pk]["user"] == job.submitter.username
