"""The latest GPU sample of each node, as its agent last reported it.

Agents push a sample a second over their websocket; the agent consumer relays it to the browsers' streams and
keeps the newest one per node here, in the `live_metrics` cache (Redis in production, process memory when
embedded), never in the database: it is a gauge, not a record. The REST cluster view reads it. A sample older
than LIVE_METRICS_TTL_S is gone, so a silent node shows no metrics rather than stale ones.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from django.core.cache import caches

log = logging.getLogger(__name__)

LIVE_METRICS_TTL_S = 30
# What a sample may carry per GPU, with its type; anything else an agent sends is dropped, and a value of the
# wrong type (or not finite) is kept as None.
GPU_FIELDS: dict[str, type] = {
    "index": int,
    "uuid": str,
    "util_pct": float,
    "mem_util_pct": float,
    "memory_used_mib": int,
    "memory_total_mib": int,
    "power_w": float,
    "temperature_c": int,
    "health": str,
}


def _key(node_name: str) -> str:
    return f"live-metrics:{node_name}"


def _typed(value: Any, kind: type) -> Any:
    if kind is str:
        return value[:64] if isinstance(value, str) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind is int:
        return int(value) if abs(value) < 2**53 else None
    return round(float(value), 2)


def gpu_sample(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: _typed(raw.get(k), kind) for k, kind in GPU_FIELDS.items()}


async def live_metrics_store(*, node_name: str, sampled_at: float | None, gpus: list[dict[str, Any]]) -> None:
    """Keep a node's newest sample. Best effort: a cache outage costs the REST view its metrics, nothing else."""
    try:
        await caches["live_metrics"].aset(
            _key(node_name), {"sampled_at": sampled_at, "gpus": gpus}, timeout=LIVE_METRICS_TTL_S
        )
    except Exception as exc:  # the relay to browsers must not stop because the cache is down
        log.warning("live metrics of %s not kept: %s", node_name, exc)


def live_metrics_for_nodes(*, node_names: Iterable[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """node name -> GPU index -> that GPU's newest sample (with its `sampled_at`, Unix seconds)."""
    names = list(node_names)
    try:
        found = caches["live_metrics"].get_many([_key(n) for n in names])
    except Exception as exc:
        log.warning("live metrics unavailable: %s", exc)
        return {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for name in names:
        sample = found.get(_key(name))
        if not sample:
            continue
        per_gpu = out.setdefault(name, {})
        for g in sample.get("gpus") or []:
            if isinstance(g.get("index"), int):
                per_gpu[g["index"]] = {**g, "sampled_at": sample.get("sampled_at")}
    return out
