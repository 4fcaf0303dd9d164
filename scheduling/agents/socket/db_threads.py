"""The agents' database threads: every database call of the agents' socket runs on a small pool of its own.

Channels runs every consumer's database work on one shared thread: one node's report waiting on a row lock (a
cycle committing) would hold up every other node's heartbeats. Pools keep nodes apart, and two kinds of work
never wait behind the reports, on threads of their own: connecting sockets' token checks (daphne drops a
websocket not accepted within 5 s, and behind a storm of hellos, each reconciling a node's inventory, a check
missed that, so the agents backed off and came back, adding to the storm) and heartbeats (the node's liveness:
queued behind a cycle's worth of start reports they arrived later than TESSERA_NODE_LOST_AFTER_S and the
watchdog declared busy nodes lost; both seen in bench/cluster_scale.py at 1,000 nodes).

A node's heartbeats and log pulls run beside its reports, so the writes they share are idempotent and re-check
the job's state under its row lock. SQLite (the embedded default) takes one writer at a time: there, everything
stays on Channels' shared thread, with the embedded scheduling loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections

from portal import database

# Threads per pool; "reports" (everything else) has TESSERA_AGENT_DB_THREADS. The heartbeats of every socket of the
# process are one statement a batch (socket/beats.py, reports.heartbeats.node_heartbeats_checked).
POOL_THREADS = {"connect": 2, "heartbeat": 2}

_pools: dict[str, ThreadPoolExecutor] = {}


def db(fn: Callable[..., Any], *, pool: str = "reports") -> Callable[..., Any]:
    """`fn` made awaitable on the agents' own database threads: `pool` "reports" (everything but), "connect"
    (the token checks of sockets being accepted) or "heartbeat"."""
    if database.single_writer():
        return database_sync_to_async(fn)
    executor = _pools.get(pool)
    if executor is None:
        threads = POOL_THREADS.get(pool, settings.TESSERA_AGENT_DB_THREADS)
        executor = _pools[pool] = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix=f"agent-db-{pool}"
        )
    return SyncToAsync(_closing_connections(fn), thread_sensitive=False, executor=executor)


def _closing_connections(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Close the thread's spent database connections (per CONN_MAX_AGE, as Django does per request) around `fn`,
    inside the context asgiref runs it in. Channels' DatabaseSyncToAsync closes outside it, which left pool
    threads' connections open until garbage collection (idle sessions piling up in PostgreSQL)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return run


def db_pool_shutdown() -> None:
    """Wait for the agents' database calls still running (a closed connection's cancelled work finishes in its
    thread, and closes its database connection), then drop the pools; the next call makes new ones."""
    pools = list(_pools.values())
    _pools.clear()
    for executor in pools:
        executor.shutdown(wait=True)
