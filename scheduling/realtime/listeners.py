"""Which browser groups have a socket listening, so a node's samples are published only where someone watches.

At 1,000 nodes the agents' samples are 1,000 messages a second, and each names up to 17 groups (the cluster, and
each job's and team's on the node): a `group_send` is a Redis round trip and a few hundred microseconds of the
portal's CPU whether or not a browser is there to receive it, which was most of the agents' socket's CPU
(bench/cluster_scale.py). Browser streams record the groups they join here; the agents' socket asks
`listened()`, a set each web process re-reads at most every LISTENED_REFRESH_S, so a page opened now gets its
node's samples within that (its first render read the newest sample from the live store anyway).

Someone reading a job's logs through the API (`tessera logs -f` polls it) counts as listening to the job's group
for LOG_READER_TTL_S after each read, so its logs are pulled from the agent as often as for a browser on its page.

With Redis: one sorted set, a member per (group, listener) scored by when it stops counting: a socket's after
LISTEN_RECORD_TTL_S (it leaves sooner when it closes; one whose process died stops counting then), an API reader's
LOG_READER_TTL_S after its last read. Without Redis (embedded, in-memory channel layer), `listened()` is None:
publish everywhere, as cheap as it is there.
"""

from __future__ import annotations

import logging
import time

from asgiref.sync import sync_to_async

from scheduling.coordination import redis_client
from scheduling.realtime.groups import job as job_group

log = logging.getLogger(__name__)

LISTENING_KEY = "tessera:listening"
LISTEN_RECORD_TTL_S = 6 * 3600
LOG_READER_TTL_S = 30.0
LISTENED_REFRESH_S = 2.0

_listened: set[str] | None = None
_listened_at = float("-inf")  # monotonic
_reads = 0  # reads started (and forgets): only the newest read's answer is kept


def _member(group: str, channel: str) -> str:
    return f"{group} {channel}"


def listening_add(*, groups: list[str], channel: str, for_s: float = LISTEN_RECORD_TTL_S) -> None:
    """A listener (a socket's channel, or an API reader) joined these groups for `for_s` seconds at most (best
    effort: a failure means it may miss samples, never its other events)."""
    r = redis_client()
    if r is None or not groups:
        return
    now = time.time()
    pipe = r.pipeline(transaction=False)
    pipe.zadd(LISTENING_KEY, {_member(g, channel): now + for_s for g in groups})
    pipe.zremrangebyscore(LISTENING_KEY, 0, now)
    pipe.expire(LISTENING_KEY, LISTEN_RECORD_TTL_S)
    pipe.execute()


def log_reader_note(*, job_id: int, user_id: int) -> None:
    """Someone read the job's logs through the API just now: pull them from its agent as for a watched job."""
    try:
        listening_add(groups=[job_group(job_id)], channel=f"api-reader-{user_id}", for_s=LOG_READER_TTL_S)
    except Exception as exc:  # an interest mark: its loss only slows the next lines of a quiet job
        log.warning("log reader of job %s not noted: %s", job_id, exc)


def listening_remove(*, groups: list[str], channel: str) -> None:
    r = redis_client()
    if r is None or not groups:
        return
    r.zrem(LISTENING_KEY, *[_member(g, channel) for g in groups])


def _read() -> set[str] | None:
    r = redis_client()
    if r is None:
        return None
    members = r.zrangebyscore(LISTENING_KEY, time.time(), "+inf")
    return {(m.decode() if isinstance(m, bytes) else m).split(" ", 1)[0] for m in members}


async def listened() -> set[str] | None:
    """The groups some browser socket listens to, as of at most LISTENED_REFRESH_S ago; None: unknown (no Redis,
    or it failed to answer): the caller publishes to every group."""
    global _listened, _listened_at, _reads
    now = time.monotonic()
    if now - _listened_at >= LISTENED_REFRESH_S:
        _listened_at = now  # one read per interval per process, however many sockets ask meanwhile
        _reads += 1
        this_read = _reads
        try:
            found = await sync_to_async(_read, thread_sensitive=False)()
        except Exception as exc:
            log.warning("listened groups unknown (%s): publishing samples to every group", exc)
            found = None
        if this_read != _reads:
            # A newer read started meanwhile (after a `forget`): its answer is kept, never this older one.
            return found
        _listened = found
    return _listened


def forget() -> None:
    """Re-read on the next ask (tests, and a process that just joined a group itself); a read under way
    started before this, so its answer is not kept."""
    global _listened_at, _reads
    _listened_at = float("-inf")
    _reads += 1
