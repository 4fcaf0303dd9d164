"""Readiness: whether this portal can do its work now, each check's state (/readyz, `python -m portal.health web
--url .../readyz`, and the same checks as gauges on /metrics, so an alert sees what /readyz sees). Liveness is
/healthz: the process answers."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import connection
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduling.coordination import BEAT_MARK_KEY, redis_client
from scheduling.cycle.liveness import scheduler_stall


def check_beat(*, max_age_s: float) -> str | None:
    r = redis_client()
    if r is None:
        return "no REDIS_URL: beat runs only with Redis"
    try:
        raw = r.get(BEAT_MARK_KEY)
    except Exception as exc:  # noqa: BLE001
        return f"cannot reach Redis: {type(exc).__name__}: {exc}"
    if raw is None:
        return "beat has not sent its periodic cycle request yet"
    age_s = time.time() - float(raw)
    if age_s > max_age_s:
        return f"beat last sent its periodic cycle request {age_s:.0f} s ago (more than {max_age_s:g} s)"
    return None


def readiness() -> dict[str, Any]:
    """What /readyz answers: each check's state, and ready when all hold. The database answers; Redis answers
    (where it is used); a scheduling cycle started within three cycle intervals; beat sent its periodic request
    within three intervals (where beat is used: with Redis). Embedded, the cycle loop runs inside the server."""
    checks: dict[str, dict[str, Any]] = {}

    def check(name: str, fn) -> None:
        started = time.monotonic()
        try:
            problem = fn()
        except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check, said plainly
            problem = f"{type(exc).__name__}: {exc}"
        checks[name] = {
            "ok": problem is None,
            "detail": problem or "ok",
            "ms": round((time.monotonic() - started) * 1000, 1),
        }

    def database() -> str | None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return None

    def redis() -> str | None:
        r = redis_client()
        if r is None:
            return None
        r.ping()
        return None

    interval_s = float(settings.TESSERA_CYCLE_INTERVAL_S)
    max_age_s = 3 * interval_s + 10

    def cycle() -> str | None:
        return scheduler_stall(fresh=True)

    check("database", database)
    check("redis", redis)
    check("cycle", cycle)
    if settings.REDIS_URL:
        check("beat", lambda: check_beat(max_age_s=max_age_s))
    return {"ready": all(c["ok"] for c in checks.values()), "checks": checks}


class ReadinessCollector(Collector):
    """/readyz on /metrics: `tessera_ready` and one `tessera_readiness_check` per check, read at each scrape."""

    def collect(self):
        answer = readiness()
        ready = GaugeMetricFamily(
            "tessera_ready", "1 when /readyz answers 200: every tessera_readiness_check holds.", labels=[]
        )
        ready.add_metric([], int(answer["ready"]))
        checks = GaugeMetricFamily(
            "tessera_readiness_check",
            "1 while this /readyz check holds, 0 when it fails: database (answers), redis (answers, where "
            "REDIS_URL is set), cycle (one started within three cycle intervals + 10 s), beat (sent its periodic "
            "cycle request as recently; with Redis).",
            labels=["check"],
        )
        for name, check in answer["checks"].items():
            checks.add_metric([name], int(check["ok"]))
        return iter((ready, checks))
