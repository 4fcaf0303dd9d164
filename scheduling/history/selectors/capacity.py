"""The cluster's capacity by GPU model, over a window (from the model minutes) and as the inventory stands now, and
the queue's length over a window."""

from __future__ import annotations

from typing import Any

from django.db.models import Avg, Case, Count, F, FloatField, Max, Q, Sum, Value, When
from django.db.models.functions import Cast, Greatest, Least

from portal.database import plain_rows
from scheduling.agents.live_metrics import live_metrics_for_nodes
from scheduling.choices import GpuHealth, NodeState
from scheduling.history.models import ClusterMinute, ModelMinute
from scheduling.history.selectors.windows import MILLI, Window, bucket_start, bucketed, columns
from scheduling.inventory.models import Gpu, GpuModel, Node

CAPACITY_MEASURES = ("ready_gpus", "allocated_gpus", "used_gpus", "free_gpus", "stranded_gpus")


def capacity_series(*, w: Window) -> list[dict[str, Any]]:
    """Per GPU model over the window: ready, allocated, used (utilisation summed), wholly free, and free capacity
    stranded on partly used cards, in GPUs."""
    minutes = ModelMinute.objects.filter(at__gte=w.since, at__lt=w.until)
    rows = plain_rows(
        bucketed(minutes, at="at", step_s=w.step_s)
        .values("model_id", "time_bucket")
        .annotate(
            b=bucket_start(),
            ready=Avg("ready_gpus"),
            allocated=Avg("allocated_milli") / MILLI,
            used=Avg("used_milli") / MILLI,
            free=Avg("free_gpus"),
            stranded=Avg("stranded_milli") / MILLI,
        )
        .values_list("model_id", "b", "ready", "allocated", "used", "free", "stranded")
        .order_by()
    )
    names = dict(GpuModel.objects.values_list("pk", "name"))
    by_model: dict[int, list[tuple]] = {}
    for model_id, *rest in rows:
        by_model.setdefault(model_id, []).append(tuple(rest))
    return sorted(
        (
            {"model": names.get(model_id, f"model {model_id}"), **columns(r, CAPACITY_MEASURES, w=w)}
            for model_id, r in by_model.items()
        ),
        key=lambda s: s["model"],
    )


def queue_series(*, w: Window) -> dict[str, list]:
    minutes = ClusterMinute.objects.filter(at__gte=w.since, at__lt=w.until)
    rows = plain_rows(
        bucketed(minutes, at="at", step_s=w.step_s)
        .values("time_bucket")
        .annotate(
            b=bucket_start(),
            pending=Avg("pending_jobs"),
            pending_max=Max("pending_jobs"),
            running=Avg("running_jobs"),
        )
        .values_list("b", "pending", "pending_max", "running")
        .order_by()
    )
    return columns(rows, ("pending_jobs", "pending_jobs_max", "running_jobs"), w=w)


def capacity_now() -> list[dict[str, Any]]:
    """Per GPU model as the inventory stands: cards, ready, allocated, used (utilisation summed over the cards
    with a live sample; None where none has one), wholly free, and free capacity stranded on partly allocated
    ready cards, in GPUs. One aggregating query, plus the live samples."""
    ready = Q(node__state__in=[NodeState.READY, NodeState.DRAINING]) & ~Q(health=GpuHealth.FAILED)
    unallocated = Q(allocated_memory_mib=0, allocated_compute_pct=0)
    compute = F("allocated_compute_pct") / Value(100.0)
    # The part of a card allocated: the larger of its memory and compute shares, at most the whole card.
    share = Least(
        Value(1.0),
        Case(
            When(
                memory_mib__gt=0,
                then=Greatest(Cast("allocated_memory_mib", FloatField()) / F("memory_mib"), compute),
            ),
            default=compute,
        ),
        output_field=FloatField(),
    )
    rows = (
        Gpu.objects.values("model_id", "model__name")
        .annotate(
            gpus=Count("id"),
            ready_gpus=Sum(Case(When(ready, then=1), default=0)),
            allocated=Sum(share),
            free=Sum(Case(When(ready & unallocated, then=1), default=0)),
            stranded=Sum(Case(When(ready & ~unallocated, then=Value(1.0) - share), default=Value(0.0))),
        )
        .values_list("model_id", "model__name", "gpus", "ready_gpus", "allocated", "free", "stranded")
        .order_by("model__name")
    )
    used = _used_now_by_model()
    return [
        {
            "model": name,
            "gpus": int(gpus),
            "ready_gpus": int(ready_n or 0),
            "allocated_gpus": round(float(alloc or 0), 2),
            "used_gpus": None if model_id not in used else round(used[model_id], 2),
            "free_gpus": int(free or 0),
            "stranded_gpus": round(float(stranded or 0), 2),
        }
        for model_id, name, gpus, ready_n, alloc, free, stranded in rows
    ]


def _used_now_by_model() -> dict[int, float]:
    """GPU model id -> utilisation summed over its cards' newest live samples (2 cards at 50 % = 1.0)."""
    live = live_metrics_for_nodes(node_names=Node.objects.values_list("name", flat=True))
    if not live:
        return {}
    used: dict[int, float] = {}
    for name, index, model_id in Gpu.objects.filter(node__name__in=list(live)).values_list(
        "node__name", "index", "model_id"
    ):
        util = (live.get(name, {}).get(index) or {}).get("util_pct")
        if util is not None:
            used[model_id] = used.get(model_id, 0.0) + min(100.0, max(0.0, float(util))) / 100
    return used
