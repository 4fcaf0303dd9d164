"""The production scheduling cycle: `snapshot_from_db()` -> engine `run_cycle()` -> `apply_decisions()`.

These two functions are the only crossing between the database and the pure-Python engine. `apply_decisions`
writes a whole cycle in one transaction guarded by the scheduler lease's fencing epoch, row locks and the GPU
ledger's guarded UPDATEs, so a stale or racing cycle can never double-book a GPU; agents hear of it after commit.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import socket
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from quotas.models import Quota as QuotaRow
from scheduling import events, lock_objects
from scheduling.choices import ActorKind, JobState, LinkKind, NodeState, SharingMode
from scheduling.engine import types as eng
from scheduling.engine.framework import Profile
from scheduling.models import Gpu, GpuLink, Job, JobEvent, Node, SchedulerLease, Slice
from scheduling.services import SliceDoesNotFit, job_transition, slice_allocate
from scheduling.states import ACTIVE_STATES

log = logging.getLogger(__name__)

# Recent history that shapes the "typical workload" FGD-style scorers plan for.
WORKLOAD_HISTORY_JOBS = 500
# Usage older than this many half-lives weighs under 2 % and is not read at all.
USAGE_HISTORY_HALF_LIVES = 6


class StaleEpoch(Exception):
    """A cycle tried to write with an epoch a later cycle has superseded (or that was already applied)."""


# --- Epochs -----------------------------------------------------------------------------------------------


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def epoch_issue(*, holder: str | None = None) -> int:
    """Start a cycle: take the next fencing epoch. Every later epoch makes this one stale."""
    with transaction.atomic():
        SchedulerLease.objects.get_or_create(pk=1)
        lease = lock_objects.scheduler_lease_for_update().get(pk=1)
        lease.issued_epoch += 1
        lease.holder = (holder or holder_name())[:200]
        lease.issued_at = timezone.now()
        lease.save(update_fields=["issued_epoch", "holder", "issued_at"])
        return lease.issued_epoch


def _epoch_claim(epoch: int) -> None:
    """Inside the apply transaction: lock the lease row and refuse unless `epoch` is the newest, unapplied one."""
    lease = lock_objects.scheduler_lease_for_update().filter(pk=1).first()
    if lease is None or lease.issued_epoch != epoch or lease.applied_epoch >= epoch:
        newest = lease.issued_epoch if lease else 0
        applied = lease.applied_epoch if lease else 0
        raise StaleEpoch(
            f"cycle epoch {epoch} is stale: the newest issued epoch is {newest}, the last applied {applied}"
        )
    lease.applied_epoch = epoch
    lease.applied_at = timezone.now()
    lease.save(update_fields=["applied_epoch", "applied_at"])


# --- Snapshot ---------------------------------------------------------------------------------------------


def _capability(value: Decimal | str | float) -> tuple[int, int]:
    major, _, minor = str(value).partition(".")
    return int(major or 0), int((minor or "0")[:1])


def _seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def job_request(job: Job) -> eng.Request:
    """A job row's request in engine units (compute_pct x 10 = milli-GPU)."""
    return eng.Request(
        gpus=job.gpus,
        nodes=job.nodes,
        gpu_memory_mib=job.gpu_memory_mib,
        gpu_compute_milli=job.compute_pct * 10,
        gpu_models=tuple(job.gpu_models or ()),
        min_gpu_memory_mib=job.min_gpu_memory_mib,
        min_compute_capability=_capability(job.min_compute_capability),
        topology=eng.TopologyNeed(job.topology),
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
    )


def job_held_milli(
    *, gpus: int, nodes: int, compute_pct: int, gpu_memory_mib: int, card_memory_mib: int
) -> int:
    """Milli-GPU a job holds while it runs (the fair-share unit): whole GPUs count 1000 each; a slice counts the
    larger of its compute share and its memory share of the card it was placed on (a memory-only slice holds its
    proportional compute share, as the engine charges it), at most one card. The SQL twin: _HELD_MILLI_SQL."""
    if gpus:
        return gpus * nodes * eng.WHOLE_GPU_MILLI
    memory_milli = -(-gpu_memory_mib * eng.WHOLE_GPU_MILLI // card_memory_mib) if card_memory_mib else 0
    return min(eng.WHOLE_GPU_MILLI, max(compute_pct * 10, memory_milli))


# job_held_milli in SQL, over the spans' columns (gpus, nodes, compute_pct, gpu_memory_mib, card_mib).
_HELD_MILLI_SQL = f"""CASE WHEN gpus > 0 THEN gpus * nodes * {eng.WHOLE_GPU_MILLI}
    ELSE LEAST({eng.WHOLE_GPU_MILLI}, GREATEST(compute_pct * 10,
         COALESCE(CEIL(gpu_memory_mib * {eng.WHOLE_GPU_MILLI}.0 / NULLIF(card_mib, 0)), 0))) END"""


def _card_memory_mib(job_id: int) -> int:
    """Memory of the card the job's current slice was placed on (from its placement event; 0 if unknown)."""
    placed = JobEvent.objects.filter(job_id=job_id, to_state=JobState.PLACED).order_by("-at", "-id").first()
    try:
        node_name, gpu_index = placed.data["gpus"][0][:2]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return 0
    gpu = Gpu.objects.filter(node__name=node_name, index=gpu_index).values_list("memory_mib", flat=True)
    return gpu.first() or 0


def decayed_usage(*, now_s: float, half_life_s: float) -> dict[str, float]:
    """Past GPU usage per team (milli-GPU-seconds), each second weighted 2^-(age / half-life).

    Summed by PostgreSQL where it can be (history grows without bound); the same sum in Python otherwise.
    """
    if connection.vendor == "postgresql":
        return _decayed_usage_sql(now_s=now_s, half_life_s=half_life_s)
    return _decayed_usage_python(now_s=now_s, half_life_s=half_life_s)


def _decayed_usage_python(*, now_s: float, half_life_s: float) -> dict[str, float]:
    since = datetime.fromtimestamp(now_s - USAGE_HISTORY_HALF_LIVES * half_life_s, tz=UTC)
    rows = Job.objects.filter(started_at__isnull=False).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gte=since)
    )
    rate = math.log(2) / half_life_s
    usage: dict[str, float] = defaultdict(float)
    for job_id, slug, gpus, nodes, pct, memory_mib, started, finished in rows.values_list(
        "pk", "team__slug", "gpus", "nodes", "compute_pct", "gpu_memory_mib", "started_at", "finished_at"
    ).iterator():
        milli = job_held_milli(
            gpus=gpus,
            nodes=nodes,
            compute_pct=pct,
            gpu_memory_mib=memory_mib,
            card_memory_mib=0 if gpus or not memory_mib else _card_memory_mib(job_id),
        )
        t0, t1 = started.timestamp(), min(finished.timestamp() if finished else now_s, now_s)
        if t1 <= t0 or not milli:
            continue
        # The integral of milli * 2^-((now - t) / h) over [t0, t1].
        usage[slug] += milli * (math.exp(-rate * (now_s - t1)) - math.exp(-rate * (now_s - t0))) / rate
    return dict(usage)


def _decayed_usage_sql(*, now_s: float, half_life_s: float) -> dict[str, float]:
    from quotas.models import Team

    job, team, event = Job._meta.db_table, Team._meta.db_table, JobEvent._meta.db_table
    node, gpu = Node._meta.db_table, Gpu._meta.db_table
    sql = f"""
        WITH rows AS (
          SELECT t.slug AS slug, j.gpus AS gpus, j.nodes AS nodes, j.compute_pct AS compute_pct,
                 j.gpu_memory_mib AS gpu_memory_mib,
                 CASE WHEN j.gpus = 0 AND j.gpu_memory_mib > 0 THEN (
                   SELECT g.memory_mib FROM {event} e
                     JOIN {node} n ON n.name = e.data->'gpus'->0->>0
                     JOIN {gpu} g ON g.node_id = n.id AND g.index = (e.data->'gpus'->0->>1)::int
                   WHERE e.job_id = j.id AND e.to_state = '{JobState.PLACED.value}'
                   ORDER BY e.at DESC, e.id DESC LIMIT 1) END AS card_mib,
                 EXTRACT(EPOCH FROM j.started_at)::float8 AS t0,
                 LEAST(COALESCE(EXTRACT(EPOCH FROM j.finished_at)::float8, %(now)s), %(now)s) AS t1
          FROM {job} j JOIN {team} t ON t.id = j.team_id
          WHERE j.started_at IS NOT NULL AND (j.finished_at IS NULL OR j.finished_at >= %(since)s)
        ),
        spans AS (SELECT slug, t0, t1, {_HELD_MILLI_SQL} AS milli FROM rows)
        SELECT slug, SUM(milli * (exp(-%(rate)s * (%(now)s - t1)) - exp(-%(rate)s * (%(now)s - t0))) / %(rate)s)
        FROM spans WHERE t1 > t0 AND milli > 0 GROUP BY slug
    """
    params = {
        "now": now_s,
        "rate": math.log(2) / half_life_s,
        "since": datetime.fromtimestamp(now_s - USAGE_HISTORY_HALF_LIVES * half_life_s, tz=UTC),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {slug: float(total) for slug, total in cursor.fetchall()}


def _typical_workload() -> tuple[tuple[eng.Request, float], ...]:
    recent = Job.objects.select_related(None).order_by("-submitted_at", "-id")[:WORKLOAD_HISTORY_JOBS]
    shapes = Counter(job_request(job) for job in recent if job.gpus or job.gpu_memory_mib or job.compute_pct)
    total = sum(shapes.values())
    if not total:
        return ()
    return tuple((req, count / total) for req, count in shapes.most_common())


def engine_quotas() -> dict[str, eng.Quota]:
    """Per team, its all-models quota with its per-GPU-model rows attached (`Quota.per_model`); the engine enforces
    both. A team with only per-model rows gets the all-models defaults (no guarantee, no limit)."""

    def shares(q: QuotaRow) -> dict[str, int | None]:
        return {
            "guaranteed_gpu_memory_mib": int(q.guaranteed_gpu_memory_mib),
            "limit_gpu_memory_mib": None if q.limit_gpu_memory_mib is None else int(q.limit_gpu_memory_mib),
            "guaranteed_compute_milli": int(q.guaranteed_gpus * eng.WHOLE_GPU_MILLI),
            "limit_compute_milli": None if q.limit_gpus is None else int(q.limit_gpus * eng.WHOLE_GPU_MILLI),
        }

    all_models: dict[str, QuotaRow] = {}
    per_model: dict[str, list[eng.ModelQuota]] = {}
    for q in QuotaRow.objects.select_related("team", "gpu_model").order_by("team__slug", "gpu_model__name"):
        if q.gpu_model is None:
            all_models[q.team.slug] = q
        else:
            per_model.setdefault(q.team.slug, []).append(eng.ModelQuota(model=q.gpu_model.name, **shares(q)))
    out = {}
    for slug in sorted(all_models.keys() | per_model.keys()):
        rows = tuple(per_model.get(slug, ()))
        q = all_models.get(slug)
        if q is None:
            out[slug] = eng.Quota(team=slug, per_model=rows)
        else:
            out[slug] = eng.Quota(team=slug, weight=float(q.fair_share_weight), per_model=rows, **shares(q))
    return out


def _engine_job(job: Job, slices: list[Slice] | None = None) -> eng.Job:
    assignments: tuple[eng.Assignment, ...] = ()
    cpu: dict[str, tuple[int, int]] = {}
    if slices:
        assignments = tuple(
            eng.Assignment(
                node=s.gpu.node.name,
                gpu_index=s.gpu.index,
                memory_mib=s.memory_mib,
                compute_milli=s.compute_pct * 10,
            )
            for s in sorted(slices, key=lambda s: (s.gpu.node.name, s.gpu.index))
        )
        cpu = {a.node: (job.cpu_milli, job.memory_mib) for a in assignments}
    return eng.Job(
        id=str(job.pk),
        team=job.team.slug,
        request=job_request(job),
        priority=job.priority_class.value,
        preemptible=job.preemptible,
        grace_s=float(job.priority_class.preemption_grace_s),
        submit_time=job.submitted_at.timestamp(),
        max_runtime_s=float(job.max_runtime_s) if job.max_runtime_s else None,
        assignments=assignments,
        start_time=_seconds(job.started_at or job.placed_at),
        borrowed=job.borrowed,
        cpu_assignments=cpu,
    )


def _read_snapshot(now_s: float) -> eng.Snapshot:
    active = list(Job.objects.filter(state__in=ACTIVE_STATES).select_related("team", "priority_class"))
    slices_by_job: dict[int, list[Slice]] = defaultdict(list)
    for s in Slice.objects.filter(job__state__in=ACTIVE_STATES).select_related("gpu__node"):
        slices_by_job[s.job_id].append(s)
    holders: Counter[int] = Counter(s.gpu_id for ss in slices_by_job.values() for s in ss)
    # Host CPU and memory are accounted from the jobs that hold GPUs there (the GPU ledger is the guarded one).
    host_used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    running = []
    for job in active:
        ej = _engine_job(job, slices_by_job.get(job.pk, []))
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
        gpus_by_node[g.node_id].append(
            eng.Gpu(
                index=g.index,
                uuid=g.uuid,
                model=g.model.name,
                memory_mib=g.memory_mib,
                compute_capability=_capability(g.model.compute_capability),
                numa_node=g.numa_node,
                sharing=eng.Sharing(g.sharing_mode),
                health=eng.Health(g.health),
                mig_profiles_mib=tuple(int(p["memory_mib"]) for p in g.model.mig_profiles or ()),
                allocated_memory_mib=g.allocated_memory_mib,
                allocated_compute_milli=g.allocated_compute_pct * 10,
                holders=holders.get(g.pk, 0),
            )
        )
    nodes = tuple(
        eng.Node(
            name=n.name,
            cpu_milli=n.cpu_milli,
            memory_mib=n.memory_mib,
            gpus=tuple(gpus_by_node.get(n.pk, ())),
            state=eng.NodeState(n.state),
            allocated_cpu_milli=min(n.cpu_milli, host_used[n.name][0]),
            allocated_memory_mib=min(n.memory_mib, host_used[n.name][1]),
            nvlink=frozenset(nvlink.get(n.pk, ())),
            labels={str(k): str(v) for k, v in (n.labels or {}).items()},
        )
        for n in Node.objects.order_by("name")
    )
    pending = tuple(
        _engine_job(job)
        for job in Job.objects.filter(state=JobState.PENDING)
        .select_related("team", "priority_class")
        .order_by("submitted_at", "id")
    )
    return eng.Snapshot(
        now=now_s,
        nodes=nodes,
        running=tuple(running),
        pending=pending,
        quotas=engine_quotas(),
        usage=decayed_usage(now_s=now_s, half_life_s=settings.TESSERA_FAIRSHARE_HALF_LIFE_S),
        workload=_typical_workload(),
    )


def snapshot_from_db(*, now_s: float | None = None) -> eng.Snapshot:
    """The cluster and queue as one consistent picture (one REPEATABLE READ transaction on PostgreSQL)."""
    now_s = time.time() if now_s is None else now_s
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return _read_snapshot(now_s)


@functools.lru_cache(maxsize=16)
def _profile_with(
    name: str, timeslice_factor: float | None, half_life_s: float, overrides_json: str
) -> Profile:
    from scheduling.engine.profiles import get_profile

    profile = get_profile(name)
    params = dict(profile.params)
    params["fairshare_half_life_s"] = half_life_s
    if timeslice_factor is not None:
        params["timeslice_oversubscription"] = timeslice_factor
    params.update(json.loads(overrides_json))
    return replace(profile, params=params)


def cycle_profile() -> Profile:
    """The configured engine profile, told the database's time-slice capacity so it never plans past it,
    with TESSERA_SCHEDULER_PARAMS applied. Cached: the engine keeps per-profile state between cycles."""
    capacities = Gpu.objects.filter(sharing_mode=SharingMode.TIMESLICE).values_list(
        "compute_capacity_pct", flat=True
    )
    factor = min(capacities) / 100 if capacities else None
    return _profile_with(
        settings.TESSERA_SCHEDULER_PROFILE,
        factor,
        float(settings.TESSERA_FAIRSHARE_HALF_LIFE_S),
        json.dumps(getattr(settings, "TESSERA_SCHEDULER_PARAMS", {}) or {}, sort_keys=True),
    )


# --- Apply ------------------------------------------------------------------------------------------------


@dataclass
class ApplyResult:
    epoch: int
    placed: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    conflicts: dict[int, str] = field(default_factory=dict)  # job id -> why its placement was refused
    pending_updated: int = 0
    nodes_changed: set[str] = field(default_factory=set)


def _job_nodes(job_id: int) -> set[str]:
    return set(Slice.objects.filter(job_id=job_id).values_list("gpu__node__name", flat=True))


def _fault_point(name: str, detail: str = "") -> None:
    """Fault injection for the failure tests: TESSERA_FAULT_<NAME>_DELAY_S pauses the cycle here, inside its
    transaction, so a test can kill the worker mid-write. Unset (always, in production) it does nothing."""
    delay = float(os.environ.get(f"TESSERA_FAULT_{name.upper()}_DELAY_S", "0") or 0)
    if delay > 0:
        log.warning("fault injection: pausing %.1f s at %s %s", delay, name, detail)
        time.sleep(delay)


def _place(job: Job, placement: eng.Placement, gpus: dict[tuple[str, int], Gpu], epoch: int) -> set[str]:
    """Place one job (inside its own savepoint). Raises SliceDoesNotFit when the ledger refuses."""
    where = ", ".join(f"{a.node}/gpu{a.gpu_index}" for a in placement.assignments)
    kind = "borrowed capacity" if placement.borrowed else "its team's guarantee"
    job_transition(
        job=job,
        to_state=JobState.PLACED,
        actor_kind=ActorKind.SCHEDULER,
        code="placed",
        message=f"Placed on {where} (within {kind}).",
        data={
            "epoch": epoch,
            "nodes": sorted({a.node for a in placement.assignments}),
            "gpus": [[a.node, a.gpu_index, a.memory_mib, a.compute_milli] for a in placement.assignments],
            "borrowed": placement.borrowed,
        },
    )
    if placement.borrowed != job.borrowed:
        job.borrowed = placement.borrowed
        job.save(update_fields=["borrowed"])
    for a in placement.assignments:
        gpu = gpus.get((a.node, a.gpu_index))
        if gpu is None:
            raise SliceDoesNotFit(f"{a.node}/gpu{a.gpu_index} no longer exists.", code="gone")
        slice_allocate(job=job, gpu=gpu, memory_mib=a.memory_mib, compute_pct=math.ceil(a.compute_milli / 10))
    return {a.node for a in placement.assignments}


def apply_decisions(*, decisions: eng.Decisions, epoch: int) -> ApplyResult:
    """Write one cycle's decisions in one transaction, or nothing at all.

    Refused whole (StaleEpoch) unless `epoch` is the newest issued and not yet applied. Within it, a placement
    whose job is no longer pending, whose node is no longer ready, or that the GPU ledger refuses is skipped
    (recorded in `conflicts`; the job stays pending for the next cycle). Agents are told after commit.
    """
    result = ApplyResult(epoch=epoch)
    with transaction.atomic():
        _epoch_claim(epoch)

        placement_nodes = {a.node for p in decisions.placements for a in p.assignments}
        eviction_ids = [int(e.job_id) for e in decisions.evictions]
        placement_ids = [int(p.job_id) for p in decisions.placements]
        victim_nodes = set(
            Slice.objects.filter(job_id__in=eviction_ids).values_list("gpu__node__name", flat=True)
        )
        nodes = {n.name: n for n in lock_objects.nodes_for_update(names=placement_nodes | victim_nodes)}
        jobs = {j.pk: j for j in lock_objects.jobs_for_update(ids=eviction_ids + placement_ids)}

        for ev in decisions.evictions:
            job = jobs.get(int(ev.job_id))
            if job is None or job.state not in ACTIVE_STATES:
                continue
            on_nodes = _job_nodes(job.pk)
            verb = "Reclaimed for" if ev.code == "reclaimed" else "Preempted by"
            job_transition(
                job=job,
                to_state=JobState.PREEMPTED,
                actor_kind=ActorKind.SCHEDULER,
                code=ev.code or "preempted",
                message=f"{verb} job #{ev.preemptor_id}; {ev.grace_s:g} s grace before SIGKILL.",
                data={
                    "preemptor": ev.preemptor_id,
                    "grace_s": ev.grace_s,
                    "nodes": sorted(on_nodes),
                    "epoch": epoch,
                },
            )
            result.evicted.append(job.pk)
            result.nodes_changed |= on_nodes

        gpus = {
            (g.node.name, g.index): g
            for g in Gpu.objects.select_related("node").filter(node__name__in=placement_nodes)
        }
        for placement in decisions.placements:
            job = jobs.get(int(placement.job_id))
            if job is None or job.state != JobState.PENDING:
                result.conflicts[int(placement.job_id)] = "no longer pending"
                continue
            unready = sorted(
                {a.node for a in placement.assignments}
                - {n for n, node in nodes.items() if node.state == NodeState.READY}
            )
            if unready:
                result.conflicts[job.pk] = f"node {', '.join(unready)} is no longer ready"
                continue
            try:
                with transaction.atomic():
                    result.nodes_changed |= _place(job, placement, gpus, epoch)
            except SliceDoesNotFit as exc:
                job.refresh_from_db()
                result.conflicts[job.pk] = exc.message
                continue
            result.placed.append(job.pk)

        result.pending_updated = _write_pending(
            decisions, placed=set(result.placed), conflicts=result.conflicts
        )
        if result.placed or result.evicted:
            _fault_point("commit", f"with placements {result.placed} and evictions {result.evicted} written")
        for name in sorted(result.nodes_changed):
            events.node_desired_state_changed(node_name=name)
    return result


def _write_pending(decisions: eng.Decisions, *, placed: set[int], conflicts: dict[int, str]) -> int:
    """Pending reasons, queue positions and estimated starts, written only where they changed."""
    wanted: dict[int, tuple[str, str, int | None, datetime | None]] = {}
    for p in decisions.pending:
        eta = datetime.fromtimestamp(p.estimated_start, tz=UTC) if p.estimated_start is not None else None
        wanted[int(p.job_id)] = (p.status.code[:50], p.status.reason, p.position, eta)
    for job_id, why in conflicts.items():
        if job_id not in wanted:
            wanted[job_id] = (
                "conflict",
                f"Its placement was refused ({why}); retrying next cycle.",
                None,
                None,
            )
    wanted = {k: v for k, v in wanted.items() if k not in placed}
    if not wanted:
        return 0
    changed = []
    # skip_locked: a job being cancelled right now keeps its row; its reason can wait for the next cycle.
    for job in lock_objects.jobs_for_update(ids=wanted, skip_locked=True).filter(state=JobState.PENDING):
        code, reason, position, eta = wanted[job.pk]
        if eta is not None:
            eta = eta.replace(microsecond=0)
        current = (job.pending_reason_code, job.pending_reason, job.queue_position, job.estimated_start_at)
        if current == (code, reason, position, eta):
            continue
        reason_changed = job.pending_reason_code != code
        job.pending_reason_code, job.pending_reason, job.queue_position, job.estimated_start_at = (
            code,
            reason,
            position,
            eta,
        )
        changed.append(job)
        if reason_changed:
            events.job_changed(job_id=job.pk, team_id=job.team_id, state=job.state, code=code, message=reason)
    Job.objects.bulk_update(
        changed,
        ["pending_reason_code", "pending_reason", "queue_position", "estimated_start_at"],
        batch_size=500,
    )
    return len(changed)


# --- One whole cycle --------------------------------------------------------------------------------------


@dataclass
class CycleReport:
    epoch: int
    pending: int
    running: int
    placed: int
    evicted: int
    conflicts: int
    snapshot_s: float
    engine_s: float
    apply_s: float
    stale: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def cycle_run_once(*, holder: str | None = None) -> CycleReport:
    """One scheduling cycle under a fresh fencing epoch. The caller provides mutual exclusion (a lock);
    the epoch makes the database refuse this cycle's writes if a newer one started meanwhile."""
    from scheduling.engine.cycle import run_cycle

    epoch = epoch_issue(holder=holder)
    t0 = time.perf_counter()
    snapshot = snapshot_from_db()
    t1 = time.perf_counter()
    decisions = run_cycle(snapshot, cycle_profile())
    t2 = time.perf_counter()
    stale = False
    try:
        result = apply_decisions(decisions=decisions, epoch=epoch)
    except StaleEpoch as exc:
        log.warning("%s; its decisions were discarded", exc)
        result, stale = ApplyResult(epoch=epoch), True
    t3 = time.perf_counter()
    report = CycleReport(
        epoch=epoch,
        pending=len(snapshot.pending),
        running=len(snapshot.running),
        placed=len(result.placed),
        evicted=len(result.evicted),
        conflicts=len(result.conflicts),
        snapshot_s=round(t1 - t0, 4),
        engine_s=round(t2 - t1, 4),
        apply_s=round(t3 - t2, 4),
        stale=stale,
    )
    if report.placed or report.evicted or report.conflicts or stale:
        log.info("cycle %s", report.as_dict())
    return report
