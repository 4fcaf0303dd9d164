"""The Redis client for coordination (cycle requests and lock, watchdog marks, live samples), or None embedded."""

from __future__ import annotations

import functools

import redis
from django.conf import settings


@functools.cache
def _redis_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)


def redis_client() -> redis.Redis | None:
    """The Redis client for coordination, or None in the embedded mode."""
    return _redis_for(settings.REDIS_URL) if settings.REDIS_URL else None


# Beat's periodic cycle request notes its time here (portal.health.beat_note_publish); /readyz and beat's
# container healthcheck read it.
BEAT_TICK_TASK = "scheduling.tasks.cycle_tick"
BEAT_MARK_KEY = "tessera:beat:last_tick"
BEAT_MARK_TTL_S = 24 * 3600
