"""Nodes and their GPUs over a window: a node's GPUs' series (from Prometheus or the 5-minute rollups) and their
events, the node pools and their utilisation heatmap."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Case, Count, F, IntegerField, Max, Min, Sum, Value, When
from django.db.models.functions import NullIf

from portal.database import plain_rows
from scheduling.history.models import GpuEvent, GpuFiveMinute, NodeHour
from scheduling.history.selectors.windows import MILLI, Window, bucket_start, bucketed, columns
from scheduling.inventory.models import Gpu, Node

GPU_MEASURES = (
    "util_pct",
    "memory_used_gib",
    "memory_allocated_gib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
)


def gpu_series(*, node_id: int, w: Window) -> list[dict[str, Any]]:
    """Each GPU of a node over the window (5-minute windows, coarser for long ranges): the DCGM set."""
    step = max(w.step_s, 300)
    windows = GpuFiveMinute.objects.filter(node_id=node_id, at__gte=w.since, at__lt=w.until, samples__gt=0)
    rows = (
        bucketed(windows, at="at", step_s=step)
        .values("gpu_id", "time_bucket")
        .annotate(
            b=bucket_start(),
            util=Sum("util_pct_sum") / Sum("samples"),
            memory_used=Max("memory_used_mib_max") / 1024.0,
            memory_allocated=Max("memory_allocated_mib") / 1024.0,
            temperature=Max("temperature_c_max"),
            power=Sum("power_w_sum") / Sum("samples"),
            sm_clock=Sum("sm_clock_mhz_sum") / Sum("samples"),
        )
        .values_list(
            "gpu_id", "b", "util", "memory_used", "memory_allocated", "temperature", "power", "sm_clock"
        )
        .order_by()
    )
    index_of = dict(Gpu.objects.filter(node_id=node_id).values_list("pk", "index"))
    stepped = Window(w.name, w.since, w.until, step)
    by_gpu: dict[int, list[tuple]] = {}
    for gpu_id, *rest in rows:
        by_gpu.setdefault(gpu_id, []).append(tuple(rest))
    return sorted(
        (
            {"gpu_id": gpu_id, "index": index_of.get(gpu_id), **columns(r, GPU_MEASURES, w=stepped)}
            for gpu_id, r in by_gpu.items()
        ),
        key=lambda s: (s["index"] is None, s["index"] or 0),
    )


def gpu_events(*, node_id: int, w: Window, limit: int = 100) -> list[GpuEvent]:
    return list(
        GpuEvent.objects.filter(node_id=node_id, at__gte=w.since, at__lt=w.until).order_by("-at", "-id")[
            :limit
        ]
    )


@dataclass(frozen=True)
class GpuHistory:
    source: str  # "prometheus" or "rollups"
    note: str  # what to tell the reader about where the figures come from
    step_s: int
    gpus: list[dict[str, Any]]


def node_gpu_history(*, node_id: int, node_name: str, w: Window) -> GpuHistory:
    """A node's GPUs over the window: from Prometheus where PROMETHEUS_URL is set (at the window's step), else
    (or when it does not answer) from the portal's 5-minute rollups."""
    from scheduling.history import prometheus

    if prometheus.configured():
        try:
            found = prometheus.gpu_series(
                node_name=node_name, since=w.since.timestamp(), until=w.until.timestamp(), step_s=w.step_s
            )
            return GpuHistory(
                "prometheus", "From Prometheus (the dcgm-exporter series of /metrics).", w.step_s, found
            )
        except prometheus.PrometheusUnavailable as exc:
            note = f"{exc}; showing the portal's own 5-minute history instead."
    else:
        note = "The portal's own history: each GPU's mean over 5-minute windows (PROMETHEUS_URL unset)."
    step = max(w.step_s, 300)
    return GpuHistory("rollups", note, step, gpu_series(node_id=node_id, w=w))


# --- pools and the pool heatmap ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pool:
    """Nodes drawn as one row of the heatmap: those labelled `pool=<name>`, else those of one GPU model."""

    name: str
    node_ids: tuple[int, ...]
    gpus: int


def node_pools() -> list[Pool]:
    """The cluster's pools, by name: a node's `pool` label, else its GPU model (nodes without GPUs: "no GPUs")."""
    model_of = dict(
        Gpu.objects.values("node_id").annotate(m=Min("model__name")).values_list("node_id", "m").order_by()
    )
    gpus_of = dict(
        Gpu.objects.values("node_id").annotate(n=Count("id")).values_list("node_id", "n").order_by()
    )
    members: dict[str, list[int]] = {}
    for pk, labels in Node.objects.order_by("name").values_list("pk", "labels"):
        pool = (labels or {}).get("pool") if isinstance(labels, dict) else None
        members.setdefault(str(pool or model_of.get(pk) or "no GPUs"), []).append(pk)
    return sorted(
        (Pool(name, tuple(ids), sum(gpus_of.get(i, 0) for i in ids)) for name, ids in members.items()),
        key=lambda p: p.name,
    )


# Up to this many nodes (one page of a pool) the read names them, so their rows are read by the (node_id, hour)
# key; more are read by the hours alone.
FEW_NODES = 200


def pool_heatmap(*, pools: Sequence[Pool], w: Window) -> dict[str, dict[int, tuple[float | None, float]]]:
    """pool name -> bucket (Unix s, whole hours) -> (mean utilisation %, allocated %) of the pool's cards,
    weighting each node by its GPUs, from the hourly node rows. One aggregating query, grouped by pool: each row's
    pool is the one whose nodes list its node. A pool of one node is that node's row (the per-node heatmap)."""
    node_ids = [node_id for p in pools for node_id in p.node_ids]
    if not node_ids:
        return {}
    step = max(3600, w.step_s)
    since = datetime.fromtimestamp(math.floor(w.since.timestamp() / step) * step, UTC)
    hours = NodeHour.objects.filter(hour__gte=since, hour__lt=w.until)
    if len(node_ids) <= FEW_NODES:
        hours = hours.filter(node_id__in=node_ids)
    if all(len(p.node_ids) == 1 for p in pools):
        # A page of single nodes: grouped by the node itself (a CASE of one branch per node costs more to build
        # and to run than the rows it groups).
        key, pool_of = F("node_id"), {p.node_ids[0]: p for p in pools}
    else:
        key = Case(
            *(When(node_id__in=p.node_ids, then=Value(i)) for i, p in enumerate(pools) if p.node_ids),
            output_field=IntegerField(),
        )
        pool_of = dict(enumerate(pools))
    rows = plain_rows(
        bucketed(hours.annotate(pool=key), at="hour", step_s=step)
        .values("pool", "time_bucket")
        .annotate(
            b=bucket_start(),
            util=Sum(F("util_pct_sum") * F("gpus")) / NullIf(Sum(F("util_minutes") * F("gpus")), 0),
            allocated=Sum("allocated_milli_sum")
            * Value(100 / MILLI)
            / NullIf(Sum(F("minutes") * F("gpus")), 0),
        )
        .values_list("pool", "b", "util", "allocated")
        .order_by()
    )
    out: dict[str, dict[int, tuple[float | None, float]]] = {}
    for key_value, b, util, alloc in rows:
        pool = pool_of.get(key_value)
        if pool is None:  # a node in none of the pools (read by the hours alone)
            continue
        out.setdefault(pool.name, {})[int(b)] = (
            None if util is None else round(float(util), 1),
            round(float(alloc or 0), 1),
        )
    return out
