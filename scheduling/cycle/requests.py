"""Asking for a scheduling cycle, and the Redis lock that lets one run at a time.

Cycles are requested, not run, by writers (`cycle_request_after_commit`): a "wanted" flag plus one queued task
coalesce a burst of submits into one or two cycles. One cycle runs at a time under a Redis lock; the lock is
not trusted for correctness, the database lease's fencing epoch is. The lock is short and its holder keeps it
alive (`LockKeeper`), so a holder killed mid-cycle holds up scheduling for at most one lock TTL. Without Redis (the embedded demo) the same
requests wake an in-process loop instead (`demo.management.commands.run_demo`).

Writers call this module; it names the cycle task rather than importing it (the task runs the cycle, whose
modules write through the services that call here).
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time

from celery import current_app
from django.conf import settings
from django.db import transaction
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

from scheduling.coordination import redis_client

log = logging.getLogger(__name__)

RUN_CYCLE_TASK = "scheduling.tasks.run_cycle_task"

KEY_WANTED = "tessera:cycle:wanted"
KEY_QUEUED = "tessera:cycle:queued"
KEY_LOCK = "tessera:cycle:lock"
KEY_RETRY = "tessera:cycle:retry"
KEYS = (KEY_WANTED, KEY_QUEUED, KEY_LOCK, KEY_RETRY)
# A queued-task marker older than this is presumed lost (a broker restart) and no longer blocks new requests.
QUEUED_TTL_S = 10

# In-process mode: the demo's loop waits on this.
local_cycle_wanted = threading.Event()
local_lock = threading.Lock()

# Set "wanted"; set "queued" only if absent (with its expiry) and say whether we did: then the caller queues a task.
_REQUEST = (
    "redis.call('set', KEYS[1], 1) "
    "if redis.call('set', KEYS[2], 1, 'NX', 'EX', ARGV[1]) then return 1 else return 0 end"
)


@functools.cache
def _request_script(r):
    """The script bound to this client; it reloads itself if Redis lost it (a restart)."""
    return r.register_script(_REQUEST)


def _debounce_s() -> float:
    return float(getattr(settings, "TESSERA_CYCLE_DEBOUNCE_S", 0.05))


def lock_ttl_ms() -> int:
    return int(float(getattr(settings, "TESSERA_CYCLE_LOCK_TTL_S", 10.0)) * 1000)


def cycle_request() -> None:
    """Ask for a scheduling cycle soon. Cheap and safe to call any number of times."""
    r = redis_client()
    if r is None:
        local_cycle_wanted.set()
        return
    try:
        # Every submit asks, so both flags go in one command (a script: one round trip, no pipeline objects).
        if _request_script(r)(keys=[KEY_WANTED, KEY_QUEUED], args=[QUEUED_TTL_S]):
            current_app.tasks[RUN_CYCLE_TASK].apply_async(countdown=_debounce_s(), retry=False)
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


def cycle_request_when_lock_frees(r) -> None:
    """The lock is busy: run a cycle task again once it would have expired, in case its holder is dead (a live
    holder sees the request itself). One such retry is pending at a time, however many tasks found it busy."""
    remaining_ms = r.pttl(KEY_LOCK)
    delay_s = (remaining_ms if remaining_ms > 0 else 0) / 1000 + 0.1
    if r.set(KEY_RETRY, 1, nx=True, px=math.ceil(delay_s * 1000)):
        current_app.tasks[RUN_CYCLE_TASK].apply_async(countdown=delay_s, retry=False)


def lock_acquire(r, *, holder: str) -> Lock | None:
    """Take the cycle lock for one TTL if it is free: redis-py's Lock (its extend and release compare the token
    first), the token being the holder's name. None when someone holds it."""
    lock = Lock(
        r,
        KEY_LOCK,
        timeout=lock_ttl_ms() / 1000,
        blocking=False,
        thread_local=False,  # the keeper renews it from its own thread
    )
    return lock if lock.acquire(token=holder) else None


def lock_release(lock: Lock) -> None:
    """Give the lock back if it is still ours; one that lapsed (or was taken since) is left alone."""
    try:
        lock.release()
    except LockNotOwnedError:
        log.info("the cycle lock had lapsed before its holder released it")


class LockKeeper:
    """Keeps the cycle lock alive from a thread while its holder runs cycles: renewed every third of its TTL,
    so cycles may take as long as they take, yet a holder that dies (kill -9, OOM) frees it within one TTL.

    `lost` is set when a renewal finds the lock no longer ours (the holder stalled past a whole TTL, and another
    worker may be running cycles now): the holder then starts no further cycle. A cycle already running is
    refused by the fencing epoch if a newer one started, so losing the lock never lets two cycles both write.
    """

    def __init__(self, lock: Lock, *, holder: str) -> None:
        self.lock, self.holder = lock, holder
        self.interval_s = lock_ttl_ms() / 3000
        # A holder alive but stuck (a cycle waiting on a lock that never comes) must not hold scheduling up
        # for ever: past this without finishing a cycle, the lock is left to lapse (the epoch fences the rest).
        self.max_cycle_s = float(settings.TESSERA_CYCLE_MAX_S)
        self._progress_at = time.monotonic()
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cycle-lock-keeper", daemon=True)

    def __enter__(self) -> LockKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def progress(self) -> None:
        """The holder finished a cycle: it is not stuck."""
        self._progress_at = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            stuck_s = time.monotonic() - self._progress_at
            if stuck_s > self.max_cycle_s:
                log.warning(
                    "a cycle of %s has run %.0f s (TESSERA_CYCLE_MAX_S %.0f): its lock is left to lapse",
                    self.holder,
                    stuck_s,
                    self.max_cycle_s,
                )
                self.lost.set()
                return
            try:
                self.lock.extend(lock_ttl_ms() / 1000, replace_ttl=True)  # a full TTL again, if still ours
            except LockNotOwnedError:
                log.warning(
                    "the cycle lock expired under its holder %s: no further cycle from it", self.holder
                )
                self.lost.set()
                return
            except Exception:  # Redis is away: the lock lapses on its own; try again next interval
                log.warning("could not renew the cycle lock", exc_info=True)
