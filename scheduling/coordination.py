"""The Redis client for coordination (cycle requests and lock, watchdog marks, live samples), or None embedded."""

from __future__ import annotations

import functools
import time
from typing import Any

import redis
from django.conf import settings


@functools.cache
def _redis_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)


def redis_client() -> redis.Redis | None:
    """The Redis client for coordination, or None in the embedded mode."""
    return _redis_for(settings.REDIS_URL) if settings.REDIS_URL else None


# Beat's periodic cycle request notes its time here (beat_note_publish); /readyz and beat's container
# healthcheck (portal.health) read it.
BEAT_TICK_TASK = "scheduling.tasks.cycle_tick"
BEAT_MARK_KEY = "tessera:beat:last_tick"
BEAT_MARK_TTL_S = 24 * 3600


def beat_note_publish(sender: str | None = None, **_: Any) -> None:
    """Celery's before_task_publish (connected in portal.celery): when the periodic cycle request leaves (from
    beat), note the time."""
    if sender != BEAT_TICK_TASK:
        return
    try:
        r = redis_client()
        if r is not None:
            r.set(BEAT_MARK_KEY, repr(time.time()), ex=BEAT_MARK_TTL_S)
    except Exception:  # noqa: BLE001 - a failed note must never stop beat from publishing
        pass
