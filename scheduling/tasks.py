"""Celery entry points of the scheduling app: the cycle, the node watchdog and preemption follow-ups. Thin.

Cycles are requested, not run, by writers (`cycle_request_after_commit`): a "wanted" flag plus one queued task
coalesce a burst of submits into one or two cycles. One cycle runs at a time under a Redis lock; the lock is
not trusted for correctness, the database lease's fencing epoch is. Without Redis (the embedded demo) the same
requests wake an in-process loop instead (`scheduling.management.commands.run_demo`).
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid

from celery import shared_task
from django.conf import settings
from django.db import transaction

log = logging.getLogger(__name__)

KEY_WANTED = "tessera:cycle:wanted"
KEY_QUEUED = "tessera:cycle:queued"
KEY_LOCK = "tessera:cycle:lock"
KEYS = (KEY_WANTED, KEY_QUEUED, KEY_LOCK)
# A queued-task marker older than this is presumed lost (a broker restart) and no longer blocks new requests.
QUEUED_TTL_S = 10
# Cycles one task may run back to back while requests keep arriving, before it hands over to a fresh task.
MAX_CYCLES_PER_TASK = 20

# In-process mode: the demo's loop waits on this.
local_cycle_wanted = threading.Event()
_local_lock = threading.Lock()

# Compare-and-delete: release the lock only if we still hold it (it may have expired and moved on).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_EXTEND = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"


# Set "wanted"; set "queued" only if absent (with its expiry) and say whether we did: then the caller queues a task.
_REQUEST = (
    "redis.call('set', KEYS[1], 1) "
    "if redis.call('set', KEYS[2], 1, 'NX', 'EX', ARGV[1]) then return 1 else return 0 end"
)


@functools.cache
def _request_script(r):
    """The script bound to this client; it reloads itself if Redis lost it (a restart)."""
    return r.register_script(_REQUEST)


@functools.cache
def _redis_for(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)


def redis_client():
    """The Redis client for coordination, or None in the embedded mode."""
    return _redis_for(settings.REDIS_URL) if settings.REDIS_URL else None


def _debounce_s() -> float:
    return float(getattr(settings, "TESSERA_CYCLE_DEBOUNCE_S", 0.05))


def _lock_ttl_ms() -> int:
    return int(float(getattr(settings, "TESSERA_CYCLE_LOCK_TTL_S", 30.0)) * 1000)


def cycle_request() -> None:
    """Ask for a scheduling cycle soon. Cheap and safe to call any number of times."""
    r = redis_client()
    if r is None:
        local_cycle_wanted.set()
        return
    try:
        # Every submit asks, so both flags go in one command (a script: one round trip, no pipeline objects).
        if _request_script(r)(keys=[KEY_WANTED, KEY_QUEUED], args=[QUEUED_TTL_S]):
            run_cycle_task.apply_async(countdown=_debounce_s(), retry=False)
    except Exception:  # Redis or the broker is down: the write that asked has committed all the same
        # The periodic cycle (beat) picks the work up once Redis is back; PostgreSQL still holds every job.
        log.warning("could not request a scheduling cycle; the periodic one will run it", exc_info=True)


def cycle_request_after_commit() -> None:
    """Request a cycle once the surrounding transaction commits (so the cycle sees the write).

    Once per transaction: a transaction that submits a hundred jobs asks once. A request registered inside a
    savepoint that rolls back is dropped by Django from this list, so a later write still registers its own.
    """
    conn = transaction.get_connection()
    if conn.in_atomic_block and any(entry[1] is cycle_request for entry in conn.run_on_commit):
        return
    transaction.on_commit(cycle_request)


def run_cycles(*, holder: str) -> list[dict]:
    """Run cycles until no request is outstanding (bounded). The caller holds the cycle lock."""
    from scheduling.cycle import cycle_run_once
    from scheduling.desired_state import desired_state_sync

    reports = []
    r = redis_client()
    for _ in range(MAX_CYCLES_PER_TASK):
        if r is not None:
            r.delete(KEY_WANTED)
        else:
            local_cycle_wanted.clear()
        reports.append(cycle_run_once(holder=holder).as_dict())
        desired_state_sync()
        if r is not None:
            if not r.exists(KEY_WANTED):
                break
            r.eval(_EXTEND, 1, KEY_LOCK, holder, _lock_ttl_ms())
        elif not local_cycle_wanted.is_set():
            break
    return reports


@shared_task(ignore_result=True)
def run_cycle_task() -> dict:
    """Run the scheduling cycle if no one else is; a busy lock means the holder will see our request."""
    r = redis_client()
    holder = f"{uuid.uuid4().hex}"
    if r is None:
        if not _local_lock.acquire(blocking=False):
            return {"ran": 0, "busy": True}
        try:
            return {"ran": len(run_cycles(holder=holder))}
        finally:
            _local_lock.release()
    r.delete(KEY_QUEUED)  # from here on, a new request queues a new task
    if not r.set(KEY_LOCK, holder, nx=True, px=_lock_ttl_ms()):
        return {"ran": 0, "busy": True}
    try:
        reports = run_cycles(holder=holder)
    finally:
        r.eval(_RELEASE, 1, KEY_LOCK, holder)
    if r.exists(KEY_WANTED):  # arrived after our last look: hand over rather than lose it
        cycle_request()
    return {"ran": len(reports), "placed": sum(x["placed"] for x in reports)}


@shared_task(ignore_result=True)
def cycle_tick() -> None:
    """The periodic cycle (beat): requests one like any writer would, so it coalesces with the rest."""
    cycle_request()


@shared_task(ignore_result=True)
def node_watchdog_task() -> dict:
    """Declare silent nodes lost and requeue their jobs; finish preemptions whose agent never answered.

    Safe to run twice at once (two beats): every step re-checks its condition under row locks.
    """
    from scheduling.watchdog import nodes_check, preemptions_check

    lost = nodes_check()
    overdue = preemptions_check()
    if lost or overdue:
        cycle_request()
    return {"lost": lost, "preemptions_requeued": overdue}
