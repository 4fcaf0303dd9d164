"""GPU history from Prometheus, where the site runs one (`PROMETHEUS_URL`, scraping the portal's /metrics): the
node page asks it for the dcgm-exporter series of the node's GPUs instead of the portal's own 5-minute rollups.
Prometheus keeps what it scraped at its own resolution and retention; the rollups stay the fallback when it is
not set or does not answer."""

from __future__ import annotations

import math
from typing import Any

import requests
from django.conf import settings

# The node page's measures: (key, PromQL selector's metric, scale from its unit to the page's).
MEASURES = (
    ("util_pct", "DCGM_FI_DEV_GPU_UTIL", 1.0),
    ("memory_used_gib", "DCGM_FI_DEV_FB_USED", 1 / 1024),
    ("temperature_c", "DCGM_FI_DEV_GPU_TEMP", 1.0),
    ("power_w", "DCGM_FI_DEV_POWER_USAGE", 1.0),
    ("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", 1.0),
)
TIMEOUT_S = 5.0


class PrometheusUnavailable(Exception):
    pass


def configured() -> bool:
    return bool(settings.PROMETHEUS_URL)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def query_range(query: str, *, start: float, end: float, step_s: int) -> list[dict[str, Any]]:
    url = settings.PROMETHEUS_URL.rstrip("/") + "/api/v1/query_range"
    try:
        response = requests.get(
            url, params={"query": query, "start": start, "end": end, "step": step_s}, timeout=TIMEOUT_S
        )
        body = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise PrometheusUnavailable(
            f"{settings.PROMETHEUS_URL} did not answer: {type(exc).__name__}"
        ) from exc
    if body.get("status") != "success":
        raise PrometheusUnavailable(f"{settings.PROMETHEUS_URL} refused the query: {body.get('error', '?')}")
    return body["data"]["result"]


def gpu_series(*, node_name: str, since: float, until: float, step_s: int) -> list[dict[str, Any]]:
    """Each GPU of the node: `index` and one list per measure over the buckets `t` (None where Prometheus has no
    sample), shaped as scheduling.history.selectors.nodes.gpu_series shapes the rollups."""
    first = math.floor(since / step_s) * step_s
    ts = list(range(first, int(until) + 1, step_s))
    by_gpu: dict[int, dict[str, Any]] = {}
    for key, metric, scale in MEASURES:
        for series in query_range(
            f'{metric}{{Hostname="{_label(node_name)}"}}', start=first, end=until, step_s=step_s
        ):
            try:
                index = int(series["metric"].get("gpu", ""))
            except ValueError:
                continue
            entry = by_gpu.setdefault(
                index, {"index": index, "t": ts, **{k: [None] * len(ts) for k, _, _ in MEASURES}}
            )
            for at, value in series.get("values", []):
                slot = (int(float(at)) - first) // step_s
                if 0 <= slot < len(ts):
                    number = float(value)
                    entry[key][slot] = round(number * scale, 3) if math.isfinite(number) else None
    return [by_gpu[i] for i in sorted(by_gpu)]
