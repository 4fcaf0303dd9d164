"""Fractional GPU-hours by team, user and day, derived from job records so that history outlives slices.

A job holds GPUs while it is placed, starting or running; its JobEvents give those intervals (requeues make
several). What it holds is counted in whole-GPU equivalents: whole cards count 1 each, a slice counts
max(memory share, compute share) of its card, so a 10 GiB / 25 % slice of an 80 GiB card counts 0.25.
What a placement held comes from its "placed" event's data (`gpus`: [node, gpu index, memory MiB,
compute milli] per card, as scheduling.cycle.apply records it) with the card sizes from the inventory; failing that
from the job's live slices, else from the smallest card the request allowed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import Q, QuerySet

from scheduling.inventory.models import Gpu, GpuModel
from scheduling.jobs.models import Job, JobEvent
from scheduling.jobs.states import ACTIVE_STATES
from scheduling.jobs.usage import slice_share

GROUPS = ("team", "user", "day", "model", "hour")  # day or hour, not both
MAX_WINDOW = timedelta(days=366)


@dataclass(frozen=True)
class Holding:
    gpu_equivalents: float
    gpu_memory_mib: int
    gpu_model: str = ""  # the model of the cards it held; "" when not known


@dataclass(frozen=True)
class Card:
    memory_mib: int
    model: str


def _card_memory_mib(job: Job, models: list[GpuModel]) -> int | None:
    live = [s.gpu.memory_mib for s in job.slices.all()]
    if live:
        return min(live)
    allowed = [m for m in models if (not job.gpu_models or m.name in job.gpu_models)]
    allowed = [m for m in allowed if m.memory_mib >= job.min_gpu_memory_mib] or allowed
    return min((m.memory_mib for m in allowed), default=None)


def _holding_from_assignments(assignments: list, cards: dict[tuple[str, int], Card]) -> Holding | None:
    total, memory, model = 0.0, 0, ""
    for assignment in assignments:
        try:
            node, index, memory_mib, compute_milli = assignment
            card = cards[(str(node), int(index))]
        except (KeyError, TypeError, ValueError):
            return None
        total += slice_share(
            memory_mib=int(memory_mib), compute_pct=int(compute_milli) / 10, gpu_memory_mib=card.memory_mib
        )
        memory += int(memory_mib)
        model = model or card.model
    return Holding(total, memory, model) if assignments else None


def _model_of(job: Job) -> str:
    """The model of the cards a job holds now, else the one model it asked for ("" when neither tells)."""
    live = [s.gpu.model.name for s in job.slices.all()]
    if live:
        return live[0]
    return job.gpu_models[0] if job.gpu_models and len(job.gpu_models) == 1 else ""


def cards_by_place() -> dict[tuple[str, int], Card]:
    """(node name, GPU index) -> the card there: what a placement event's assignments are read against."""
    return {
        (node, index): Card(mib, model)
        for node, index, mib, model in Gpu.objects.values_list(
            "node__name", "index", "memory_mib", "model__name"
        )
    }


def job_holding(
    job: Job,
    *,
    placement_data: dict | None,
    models: list[GpuModel],
    cards: dict[tuple[str, int], Card] | None = None,
) -> Holding:
    data = placement_data or {}
    if isinstance(data.get("gpus"), list) and cards is not None:
        recorded = _holding_from_assignments(data["gpus"], cards)
        if recorded is not None:
            return recorded
    card_mib = data.get("gpu_memory_mib") or _card_memory_mib(job, models)
    model = _model_of(job)
    if job.gpus:
        count = job.gpus * job.nodes
        equivalents = float(data.get("gpu_equivalents") or count)
        return Holding(equivalents, count * (card_mib or 0), model)
    memory = job.gpu_memory_mib or (card_mib or 0) * job.compute_pct // 100
    if "gpu_equivalents" in data:
        return Holding(float(data["gpu_equivalents"]), memory, model)
    share = slice_share(
        memory_mib=job.gpu_memory_mib, compute_pct=job.compute_pct, gpu_memory_mib=card_mib or 0
    )
    return Holding(share, memory, model)


def _split_by_day(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """(UTC day, seconds) pieces of an interval."""
    pieces = []
    cursor = start
    while cursor < end:
        next_midnight = datetime.combine(cursor.date() + timedelta(days=1), time.min, tzinfo=UTC)
        piece_end = min(end, next_midnight)
        pieces.append((cursor.date(), (piece_end - cursor).total_seconds()))
        cursor = piece_end
    return pieces


def split_by_hour(start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """(UTC hour, seconds) pieces of an interval."""
    pieces = []
    cursor = start.astimezone(UTC)
    end = end.astimezone(UTC)
    while cursor < end:
        hour = cursor.replace(minute=0, second=0, microsecond=0)
        piece_end = min(end, hour + timedelta(hours=1))
        pieces.append((hour, (piece_end - cursor).total_seconds()))
        cursor = piece_end
    return pieces


def usage_rows(
    *, jobs: QuerySet[Job], since: datetime, until: datetime, group_by: tuple[str, ...]
) -> list[dict]:
    """Rows of {group fields..., gpu_hours, gpu_memory_gib_hours, jobs}, sorted by the group fields. Groups:
    team, user, day or hour (UTC), model (of the cards held; "" when not known)."""
    candidates = (
        jobs.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since), submitted_at__lt=until)
        .exclude(placed_at__isnull=True, attempt=0)
        .select_related("team", "submitter")
        .prefetch_related("slices__gpu__model")
    )
    by_id = {job.pk: job for job in candidates}
    if not by_id:
        return []
    models = list(GpuModel.objects.all())
    cards = cards_by_place()
    active = list(ACTIVE_STATES)
    events = (
        JobEvent.objects.filter(job_id__in=by_id.keys(), at__lt=until)
        .filter(Q(to_state__in=active) | Q(from_state__in=active))
        .order_by("job_id", "at", "id")
        .values_list("job_id", "at", "from_state", "to_state", "data")
    )
    totals: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, set()])
    open_since: dict[int, tuple[datetime, dict]] = {}

    def charge(job_id: int, start: datetime, end: datetime, data: dict) -> None:
        start, end = max(start, since), min(end, until)
        if end <= start:
            return
        job = by_id[job_id]
        holding = job_holding(job, placement_data=data, models=models, cards=cards)
        pieces = split_by_hour(start, end) if "hour" in group_by else _split_by_day(start, end)
        for when, seconds in pieces:
            fields = {"team": job.team.slug, "user": job.submitter.username, "model": holding.gpu_model}
            fields["hour" if "hour" in group_by else "day"] = when
            key = tuple(fields[g] for g in group_by)
            entry = totals[key]
            entry[0] += holding.gpu_equivalents * seconds / 3600
            entry[1] += holding.gpu_memory_mib / 1024 * seconds / 3600
            entry[2].add(job_id)

    for job_id, at, from_state, to_state, data in events:
        entering = to_state in ACTIVE_STATES and from_state not in ACTIVE_STATES
        leaving = from_state in ACTIVE_STATES and to_state not in ACTIVE_STATES
        if entering and job_id not in open_since:
            open_since[job_id] = (at, data or {})
        elif leaving and job_id in open_since:
            start, placement = open_since.pop(job_id)
            charge(job_id, start, at, placement)
    # Still holding at `until`: either it holds now, or it let go at or after `until` (its leaving event is not
    # read). Either way it held through `until` (a job that ended without a leaving event, through its end).
    for job_id, (start, placement) in open_since.items():
        finished = by_id[job_id].finished_at
        charge(job_id, start, until if finished is None else min(until, finished), placement)

    rows = []
    for key, (gpu_hours, gib_hours, job_ids) in sorted(
        totals.items(), key=lambda kv: [str(k) for k in kv[0]]
    ):
        row = dict(zip(group_by, key, strict=True))
        row.update(gpu_hours=round(gpu_hours, 4), gpu_memory_gib_hours=round(gib_hours, 4), jobs=len(job_ids))
        rows.append(row)
    return rows
