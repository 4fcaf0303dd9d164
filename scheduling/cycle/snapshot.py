"""The cluster and queue as the engine sees them: `snapshot_from_db()`, and the profile a cycle runs.

One of the two functions that cross between the database and the pure-Python engine (the other is
`scheduling.cycle.apply.apply_decisions`).
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

from quotas.models import Quota as QuotaRow
from quotas.selectors import team_allowances
from scheduling.choices import JobState, LinkKind, SharingMode
from scheduling.engine import types as eng
from scheduling.engine.framework import Profile
from scheduling.engine.profiles import get_profile
from scheduling.inventory.engine_view import capability, engine_gpu, engine_node
from scheduling.inventory.models import Gpu, GpuLink, Node
from scheduling.jobs.models import Job, Slice
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


def job_request(job: Job) -> eng.Request:
    """A job row's request in engine units (compute_pct x 10 = milli-GPU)."""
    request = _request_of(job)
    if len(_REQUESTS) >= _MAX_REQUESTS:
        _REQUESTS.clear()
    return _REQUESTS.setdefault(request, request)


def _request_of(job: Job) -> eng.Request:
    return eng.Request(
        gpus=job.gpus,
        nodes=job.nodes,
        gpu_memory_mib=job.gpu_memory_mib,
        gpu_compute_milli=job.compute_pct * 10,
        gpu_models=tuple(job.gpu_models or ()),
        min_gpu_memory_mib=job.min_gpu_memory_mib,
        min_compute_capability=capability(job.min_compute_capability),
        topology=eng.TopologyNeed(job.topology),
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
    )


def _typical_workload() -> tuple[tuple[eng.Request, float], ...]:
    recent = Job.objects.select_related(None).order_by("-submitted_at", "-id")[:WORKLOAD_HISTORY_JOBS]
    shapes = Counter(job_request(job) for job in recent if job.gpus or job.gpu_memory_mib or job.compute_pct)
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
        priority_class=job.priority_class.name,
        preemptible=job.preemptible,
        grace_s=float(job.priority_class.preemption_grace_s),
        submit_time=job.submitted_at.timestamp(),
        max_runtime_s=float(job.max_runtime_s) if job.max_runtime_s else None,
        checkpoint_interval_s=float(job.checkpoint_interval_s) if job.checkpoint_interval_s else None,
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
        ej = engine_job(job, slices_by_job.get(job.pk, []))
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
        engine_job(job)
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
