"""The cluster and queue as the engine sees them: `snapshot_from_db()`, and the profile a cycle runs.

One of the two functions that cross between the database and the pure-Python engine (the other is
`scheduling.cycle.apply.apply_decisions`).
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, TextField
from django.db.models.functions import Cast

from portal import database
from quotas.models import PriorityClass, Team
from quotas.models import Quota as QuotaRow
from quotas.selectors import team_allowances
from scheduling.choices import JobState, LinkKind, SharingMode
from scheduling.cycle.arrays import array_entries, pending_arrays
from scheduling.engine import types as eng
from scheduling.engine.framework import Profile
from scheduling.engine.profiles import get_profile
from scheduling.inventory.engine_view import capability, gpu_of, model_of, node_of
from scheduling.inventory.models import Gpu, GpuLink, GpuModel, Node
from scheduling.jobs.dependencies import dependency_holds
from scheduling.jobs.models import Job, JobEvent, Slice
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.usage import decayed_usage

# Recent history that shapes the "typical workload" FGD-style scorers plan for.
WORKLOAD_HISTORY_JOBS = 500


def _seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


# Equal requests as one object: the engine keys its per-cycle caches by request, and a lookup that finds the
# very object it was given skips comparing ten fields (most of a 10,000-job queue asks a few shapes).
_REQUESTS: dict[eng.Request, eng.Request] = {}
_MAX_REQUESTS = 50_000


# A job row's fields as the snapshot reads them (`values_list` rows, not model instances): the request's last.
_JOB_FIELDS = (
    "id",
    "team_id",
    "priority_class_id",
    "preemptible",
    "submitted_at",
    "max_runtime_s",
    "checkpoint_interval_s",
    "started_at",
    "placed_at",
    "borrowed",
    "gpus",
    "nodes",
    "gpu_memory_mib",
    "compute_pct",
    "gpu_models",
    "min_gpu_memory_mib",
    "min_compute_capability",
    "topology",
    "cpu_milli",
    "memory_mib",
)
_REQUEST_AT = _JOB_FIELDS.index("gpus")
_MOMENTS = frozenset({"submitted_at", "started_at", "placed_at"})
# What the reads select: `gpu_models` as its JSON text, decoded only for a shape not seen before (decoding it
# for every row of a 20,000-job queue was a fifth of the read); moments as Unix seconds, which is what the engine
# takes (timestamps read as datetimes were another third).
_JOB_COLUMNS = tuple(
    Cast(f, TextField()) if f == "gpu_models" else database.UnixSeconds(f) if f in _MOMENTS else f
    for f in _JOB_FIELDS
)


def _request_fields(row: tuple) -> tuple:
    """A row's request fields as `_request_of` keys them: `gpu_models` as a tuple, or as the JSON text read."""
    gpus, nodes, memory_mib, compute_pct, models, *rest = row
    if not isinstance(models, str):
        models = tuple(models or ())
    return (gpus, nodes, memory_mib, compute_pct, models, *rest)


def job_request(job: Job) -> eng.Request:
    """A job row's request in engine units (compute_pct x 10 = milli-GPU)."""
    return _request_of(_request_fields(tuple(getattr(job, f) for f in _JOB_FIELDS[_REQUEST_AT:])))


# A request's fields as the job row holds them (`_request_fields`) -> the request: a queue of 20,000 jobs asks a
# few shapes, so most jobs skip building one (and parsing its compute capability).
_REQUESTS_BY_FIELDS: dict[tuple, eng.Request] = {}


def _request_of(fields: tuple) -> eng.Request:
    request = _REQUESTS_BY_FIELDS.get(fields)
    if request is not None:
        return request
    gpus, nodes, memory_mib, compute_pct, models, min_memory_mib, min_capability, topology, cpu, host_mib = (
        fields
    )
    if isinstance(models, str):
        models = tuple(json.loads(models) or ())
    request = eng.Request(
        gpus=gpus,
        nodes=nodes,
        gpu_memory_mib=memory_mib,
        gpu_compute_milli=compute_pct * 10,
        gpu_models=models,
        min_gpu_memory_mib=min_memory_mib,
        min_compute_capability=capability(min_capability),
        topology=eng.TopologyNeed(topology),
        cpu_milli=cpu,
        memory_mib=host_mib,
    )
    if len(_REQUESTS_BY_FIELDS) >= _MAX_REQUESTS:
        _REQUESTS.clear()
        _REQUESTS_BY_FIELDS.clear()
    request = _REQUESTS.setdefault(request, request)
    _REQUESTS_BY_FIELDS[fields] = request
    return request


def _typical_workload() -> tuple[tuple[eng.Request, float], ...]:
    recent = Job.objects.order_by("-submitted_at", "-id").values_list(*_JOB_COLUMNS[_REQUEST_AT:])
    shapes: Counter[eng.Request] = Counter()
    for row in recent[:WORKLOAD_HISTORY_JOBS]:
        gpus, _, gpu_memory_mib, compute_pct = row[:4]
        if gpus or gpu_memory_mib or compute_pct:
            shapes[_request_of(_request_fields(row))] += 1
    total = sum(shapes.values())
    if not total:
        return ()
    return tuple((req, count / total) for req, count in shapes.most_common())


def _class_limits() -> dict[str, tuple[eng.ClassLimit, ...]]:
    """Per team, the most compute it may hold at each priority class whose grant sets a limit (its own grant's,
    else its organisation's: `quotas.selectors.team_allowances`)."""
    out = {}
    for allowance in team_allowances().values():
        limits = tuple(
            eng.ClassLimit(g.priority_class.name, int(g.limit_gpus * eng.WHOLE_GPU_MILLI))
            for g in allowance.classes
            if g.limit_gpus is not None
        )
        if limits:
            out[allowance.team_slug] = limits
    return out


def engine_shares(q: QuotaRow) -> dict[str, int | None]:
    """A quota row's guarantee and limit in engine units (MiB; GPUs x 1000 = milli-GPU)."""
    return {
        "guaranteed_gpu_memory_mib": int(q.guaranteed_gpu_memory_mib),
        "limit_gpu_memory_mib": None if q.limit_gpu_memory_mib is None else int(q.limit_gpu_memory_mib),
        "guaranteed_compute_milli": int(q.guaranteed_gpus * eng.WHOLE_GPU_MILLI),
        "limit_compute_milli": None if q.limit_gpus is None else int(q.limit_gpus * eng.WHOLE_GPU_MILLI),
    }


def engine_quotas() -> dict[str, eng.Quota]:
    """Per team, its all-models quota with its per-GPU-model rows attached (`Quota.per_model`) and its per-class
    limits (`Quota.class_limits`); the engine enforces all three. A team with only per-model rows or per-class
    limits gets the all-models defaults (no guarantee, no limit)."""
    shares = engine_shares
    all_models: dict[str, QuotaRow] = {}
    per_model: dict[str, list[eng.ModelQuota]] = {}
    for q in QuotaRow.objects.select_related("team", "gpu_model").order_by("team__slug", "gpu_model__name"):
        if q.gpu_model is None:
            all_models[q.team.slug] = q
        else:
            per_model.setdefault(q.team.slug, []).append(eng.ModelQuota(model=q.gpu_model.name, **shares(q)))
    class_limits = _class_limits()
    out = {}
    for slug in sorted(all_models.keys() | per_model.keys() | class_limits.keys()):
        rows = tuple(per_model.get(slug, ()))
        limits = class_limits.get(slug, ())
        q = all_models.get(slug)
        if q is None:
            out[slug] = eng.Quota(team=slug, per_model=rows, class_limits=limits)
        else:
            out[slug] = eng.Quota(
                team=slug, weight=float(q.fair_share_weight), per_model=rows, class_limits=limits, **shares(q)
            )
    return out


def engine_job(job: Job, slices: list[Slice] | None = None) -> eng.Job:
    """A job row (its team and priority class loaded) as the engine sees it; `slices` what it holds now."""
    pc = job.priority_class
    return _job_of(
        pk=job.pk,
        team=job.team.slug,
        request=job_request(job),
        priority_class=(pc.name, pc.value, float(pc.preemption_grace_s)),
        preemptible=job.preemptible,
        submit_time=job.submitted_at.timestamp(),
        max_runtime_s=job.max_runtime_s,
        checkpoint_interval_s=job.checkpoint_interval_s,
        start_time=_seconds(job.started_at or job.placed_at),
        borrowed=job.borrowed,
        held=[(s.gpu.node.name, s.gpu.index, s.memory_mib, s.compute_pct) for s in slices or ()],
    )


def _job_of(
    *,
    pk: int | None,
    team: str,
    request: eng.Request,
    priority_class: tuple[str, int, float],
    preemptible: bool,
    submit_time: float,
    max_runtime_s: int | None,
    checkpoint_interval_s: int | None,
    start_time: float | None,
    borrowed: bool,
    held: list[tuple[str, int, int, int]],
) -> eng.Job:
    """A job from its row's fields, whether read as a model instance or as a `values_list` row (the cycle's
    snapshot reads 20,000 of those); moments in Unix seconds; `held`: (node name, GPU index, memory MiB, compute %)
    of its slices."""
    assignments: tuple[eng.Assignment, ...] = ()
    cpu: dict[str, tuple[int, int]] = {}
    if held:
        assignments = tuple(
            eng.Assignment(node, index, mib, pct * 10) for node, index, mib, pct in sorted(held)
        )
        cpu = {a.node: (request.cpu_milli, request.memory_mib) for a in assignments}
    class_name, priority, grace_s = priority_class
    return eng.Job(
        id=str(pk),
        team=team,
        request=request,
        priority=priority,
        priority_class=class_name,
        preemptible=preemptible,
        grace_s=grace_s,
        submit_time=submit_time,
        max_runtime_s=float(max_runtime_s) if max_runtime_s else None,
        checkpoint_interval_s=float(checkpoint_interval_s) if checkpoint_interval_s else None,
        assignments=assignments,
        start_time=start_time,
        borrowed=borrowed,
        cpu_assignments=cpu,
    )


def _jobs_from_rows(
    rows: Iterable[tuple],
    *,
    slugs: dict[int, str],
    classes: dict[int, tuple[str, int, float]],
    held_by_job: dict[int, list[tuple[str, int, int, int]]],
) -> list[eng.Job]:
    """Engine jobs from `_JOB_FIELDS` rows, given the team slugs and priority classes (name, value, grace) by id:
    a few rows read once rather than joined to every job."""
    out = []
    for row in rows:
        pk, team_id, pc_id, preemptible, submitted, max_runtime, checkpoint, started, placed, borrowed = row[
            :_REQUEST_AT
        ]
        out.append(
            _job_of(
                pk=pk,
                team=slugs[team_id],
                request=_request_of(_request_fields(row[_REQUEST_AT:])),
                priority_class=classes[pc_id],
                preemptible=preemptible,
                submit_time=submitted,
                max_runtime_s=max_runtime,
                checkpoint_interval_s=checkpoint,
                start_time=started if started is not None else placed,
                borrowed=borrowed,
                held=held_by_job.get(pk, []),
            )
        )
    return out


# Evictions within this window count against a running job's "evicted in the last hour" (no thrash).
RECENT_EVICTIONS_S = 3600.0


def _with_recent_evictions(running: list[eng.Job], *, now_s: float) -> list[eng.Job]:
    """Running jobs with how often each was evicted (preempted, reclaimed, moved) in the last hour."""
    since = datetime.fromtimestamp(now_s - RECENT_EVICTIONS_S, tz=UTC)
    counts = dict(
        JobEvent.objects.filter(job__state__in=ACTIVE_STATES, to_state=JobState.PREEMPTED, at__gte=since)
        .values_list("job_id")
        .annotate(n=Count("id"))
        .values_list("job_id", "n")
    )
    if not counts:
        return running
    return [replace(j, recent_evictions=counts[int(j.id)]) if int(j.id) in counts else j for j in running]


def _with_reservations(pending: list[eng.Job]) -> list[eng.Job]:
    """Pending jobs with the nodes their reservation held at the last cycle (kept while it makes sense)."""
    held = dict(
        Job.objects.filter(state=JobState.PENDING)
        .exclude(reserved_nodes=[])
        .values_list("id", "reserved_nodes")
    )
    if not held:
        return pending
    return [
        replace(j, reserved_on=tuple(sorted(held[int(j.id)]))) if held.get(int(j.id)) else j for j in pending
    ]


def _moving(now_s: float, *, slugs: dict, classes: dict) -> list[eng.Job]:
    """Jobs being moved (preempted to make room, still stopping where they ran): listed pending, not to start before
    their grace ends (and never while they are still preempted), so the engine holds their new place."""
    rows = list(
        Job.objects.filter(state=JobState.PREEMPTED, moving_until__isnull=False)
        .order_by("submitted_at", "id")
        .values_list(*_JOB_COLUMNS, "moving_until")
    )
    jobs = _jobs_from_rows([row[:-1] for row in rows], slugs=slugs, classes=classes, held_by_job={})
    return [
        replace(job, ready_at=max(row[-1].timestamp(), now_s + 1.0))
        for job, row in zip(jobs, rows, strict=True)
    ]


def _read_snapshot(now_s: float, queue_depth: int | None) -> eng.Snapshot:
    # Plain rows, not model instances: at 1,000 nodes and 20,000 queued jobs, building instances was most of the
    # read's 8-10 s (bench/snapshot_read.py).
    slugs = dict(Team.objects.values_list("id", "slug"))
    classes = {
        pk: (name, value, float(grace_s))
        for pk, name, value, grace_s in PriorityClass.objects.values_list(
            "id", "name", "value", "preemption_grace_s"
        )
    }
    node_rows = list(
        Node.objects.order_by("name").values_list("id", "name", "cpu_milli", "memory_mib", "state", "labels")
    )
    node_names = {pk: name for pk, name, *_ in node_rows}
    models = {
        pk: model_of(name=name, compute_capability=cc, mig_profiles=mig)
        for pk, name, cc, mig in GpuModel.objects.values_list(
            "id", "name", "compute_capability", "mig_profiles"
        )
    }
    gpu_rows = list(
        Gpu.objects.order_by("node_id", "index").values_list(
            "id",
            "node_id",
            "index",
            "uuid",
            "model_id",
            "memory_mib",
            "numa_node",
            "sharing_mode",
            "health",
            "allocated_memory_mib",
            "allocated_compute_pct",
        )
    )
    gpu_place = {pk: (node_id, index) for pk, node_id, index, *_ in gpu_rows}

    held_by_job: dict[int, list[tuple[str, int, int, int]]] = defaultdict(list)
    holders: Counter[int] = Counter()
    for job_id, gpu_id, memory_mib, compute_pct in Slice.objects.filter(
        job__state__in=ACTIVE_STATES
    ).values_list("job_id", "gpu_id", "memory_mib", "compute_pct"):
        node_id, index = gpu_place[gpu_id]
        held_by_job[job_id].append((node_names[node_id], index, memory_mib, compute_pct))
        holders[gpu_id] += 1
    active = (
        Job.objects.filter(state__in=ACTIVE_STATES)
        .order_by("-submitted_at", "-id")
        .values_list(*_JOB_COLUMNS)
    )
    running = _with_recent_evictions(
        _jobs_from_rows(active, slugs=slugs, classes=classes, held_by_job=held_by_job), now_s=now_s
    )
    # Host CPU and memory are accounted from the jobs that hold GPUs there (the GPU ledger is the guarded one).
    host_used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ej in running:
        for node_name, (cpu_milli, mem_mib) in ej.cpu_assignments.items():
            host_used[node_name][0] += cpu_milli
            host_used[node_name][1] += mem_mib

    nvlink: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for a_id, b_id in GpuLink.objects.filter(kind=LinkKind.NVLINK).values_list("gpu_a_id", "gpu_b_id"):
        (node_id, a), (_, b) = gpu_place[a_id], gpu_place[b_id]
        nvlink[node_id].add((min(a, b), max(a, b)))

    gpus_by_node: dict[int, list[eng.Gpu]] = defaultdict(list)
    for row in gpu_rows:
        pk, node_id, index, uuid, model_id, memory_mib, numa, sharing, health, alloc_mib, alloc_pct = row
        gpus_by_node[node_id].append(
            gpu_of(
                index=index,
                uuid=uuid,
                model=models[model_id],
                memory_mib=memory_mib,
                numa_node=numa,
                sharing_mode=sharing,
                health=health,
                allocated_memory_mib=alloc_mib,
                allocated_compute_pct=alloc_pct,
                holders=holders.get(pk, 0),
            )
        )
    nodes = tuple(
        node_of(
            name=name,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            state=state,
            labels=labels,
            gpus=gpus_by_node.get(pk, ()),
            nvlink=nvlink.get(pk, ()),
            allocated_cpu_milli=host_used[name][0],
            allocated_memory_mib=host_used[name][1],
        )
        for pk, name, cpu_milli, memory_mib, state, labels in node_rows
    )
    # A job held back (requeued for idleness: scheduling/cycle/idle.py) waits out of the engine's queue until then.
    held_until = datetime.fromtimestamp(now_s, tz=UTC)
    queued = Job.objects.filter(state=JobState.PENDING).filter(
        Q(hold_until__isnull=True) | Q(hold_until__lte=held_until)
    )
    if queue_depth is not None:  # incremental: the queue's head, what no cycle has ranked, reservations
        # An array's line too, wherever it ranks: one held back by its %N is ranked last, and a task of it ending
        # must let the next start without waiting for a full cycle.
        queued = queued.filter(
            Q(queue_position__isnull=True)
            | Q(queue_position__lte=queue_depth)
            | ~Q(reserved_nodes=[])
            | Q(array_job_id=F("pk"))
        )
    queued = queued.order_by("submitted_at", "id").values_list(*_JOB_COLUMNS)
    pending = _jobs_from_rows(queued, slugs=slugs, classes=classes, held_by_job={})
    held = dependency_holds()  # waiting for other jobs (or a singleton): not in the engine's queue
    if held.waiting or held.never:
        pending = [j for j in pending if int(j.id) not in held]
    return eng.Snapshot(
        now=now_s,
        nodes=nodes,
        running=tuple(running),
        pending=(
            *array_entries(_with_reservations(pending), pending_arrays(), nodes),
            *_moving(now_s, slugs=slugs, classes=classes),
        ),
        quotas=engine_quotas(),
        usage=decayed_usage(now_s=now_s, half_life_s=settings.TESSERA_FAIRSHARE_HALF_LIFE_S),
        workload=_typical_workload(),
    )


def snapshot_from_db(*, now_s: float | None = None, queue_depth: int | None = None) -> eng.Snapshot:
    """The cluster and queue as one consistent picture (one REPEATABLE READ transaction on PostgreSQL).

    `queue_depth`, for an incremental pass (runner.py): of the waiting jobs, only the first `queue_depth` of the
    last full cycle's order, those no cycle has ranked yet (just submitted or requeued) and those holding a
    reservation; the cluster and the running jobs whole, as always."""
    now_s = time.time() if now_s is None else now_s
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if database.postgresql() and outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return _read_snapshot(now_s, queue_depth)


@functools.lru_cache(maxsize=16)
def _profile_with(
    name: str, timeslice_factor: float | None, half_life_s: float, overrides_json: str
) -> Profile:
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
