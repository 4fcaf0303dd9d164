"""Celery beat that runs once however many are started: `celery -A portal beat -S portal.beat:SingleBeatScheduler`.

A beat sends its periodic tasks only while it holds the beat lock in Redis (`tessera:beat:lock`, holding its
host and pid; TESSERA_BEAT_LOCK_TTL_S, 30 s). It takes the lock at its first tick and renews it at every tick
(at most a third of the TTL apart); a second beat finds it held, sends nothing and asks again every third of
the TTL: a standby that takes over within one TTL of the first one's death (at once when the first one stops
cleanly and releases it). A beat that cannot renew (the lock expired while it was stalled, another took it, Redis
is away) stops sending until it holds the lock again. The lock is a guard against doubled load, not a fence:
periodic work stays safe to run twice (docs/operations.md, "Failure behaviour").

Without Redis (the embedded demo runs no beat) there is nothing to guard: it schedules as Celery's own does.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from celery.beat import PersistentScheduler
from redis.exceptions import LockError, RedisError

from scheduling.coordination import redis_client

log = logging.getLogger("tessera.beat")

LOCK_KEY = "tessera:beat:lock"


def lock_ttl_s() -> float:
    from django.conf import settings

    return float(settings.TESSERA_BEAT_LOCK_TTL_S)


class SingleBeatScheduler(PersistentScheduler):
    """Celery's PersistentScheduler, sending nothing unless this process holds the beat lock."""

    _lock = None
    _holding = False
    _said_standby = False

    def _guard(self) -> bool:
        """Whether this beat holds the lock now (taking or renewing it as needed)."""
        r = redis_client()
        if r is None:
            return True
        ttl_s = lock_ttl_s()
        if self._lock is None:
            self._lock = r.lock(LOCK_KEY, timeout=ttl_s, thread_local=False)
        try:
            if self._holding:
                self._lock.reacquire()  # resets the TTL, only while the token is still ours
            elif self._lock.acquire(
                blocking=False, token=f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
            ):
                log.info("beat: holding the beat lock (%s); sending periodic tasks", LOCK_KEY)
                self._said_standby = False
            else:
                return self._standby(r)
        except (LockError, RedisError) as exc:
            if self._holding:
                log.warning("beat: lost the beat lock (%s); sending nothing until it holds it again", exc)
            self._holding = False
            return False
        self._holding = True
        return True

    def _standby(self, r) -> bool:
        if self._holding or not self._said_standby:
            holder = r.get(LOCK_KEY)
            log.info(
                "beat: another beat holds the beat lock (%s); standing by",
                holder.decode(errors="replace") if holder else "gone since",
            )
            self._said_standby = True
        self._holding = False
        return False

    def tick(self, *args, **kwargs):
        renew_every_s = lock_ttl_s() / 3
        if not self._guard():
            return renew_every_s
        return min(super().tick(*args, **kwargs), renew_every_s)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._holding and self._lock is not None:
                try:
                    self._lock.release()  # a standby takes over at its next ask, not a TTL later
                except (LockError, RedisError):
                    pass
                self._holding = False
