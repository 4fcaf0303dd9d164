"""How many browser sockets each user and each session has open, and the caps on them.

A socket counts while it is open: a sorted set per user and per session in Redis (process memory when embedded),
the socket's channel name scored by when its consumer last said it is open (at open, then every SOCKET_RENEW_S).
A socket whose server died without closing it stops counting SOCKET_STALE_S after its last renewal. One browser
tab opens one socket; the caps are far above what people need and far below what a script opening hundreds would
take.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.conf import settings

from scheduling.coordination import redis_client

SOCKET_RENEW_S = 60.0
SOCKET_STALE_S = 3 * SOCKET_RENEW_S  # two renewals missed: the socket's server is gone
_local: dict[str, dict[str, float]] = {}
_local_lock = threading.Lock()


@dataclass(frozen=True)
class SocketKey:
    user_id: int
    session_key: str
    channel: str

    def sets(self) -> list[tuple[str, int]]:
        out = [(f"tessera:sockets:user:{self.user_id}", int(settings.TESSERA_MAX_SOCKETS_PER_USER))]
        if self.session_key:
            out.append(
                (f"tessera:sockets:session:{self.session_key}", int(settings.TESSERA_MAX_SOCKETS_PER_SESSION))
            )
        return out


def socket_open(key: SocketKey) -> str | None:
    """Count the socket in; None, or why it may not open (a cap reached)."""
    now = time.time()
    r = redis_client()
    if r is None:
        with _local_lock:
            for name, cap in key.sets():
                members = {c: t for c, t in _local.get(name, {}).items() if t > now - SOCKET_STALE_S}
                _local[name] = members
                if len(members) >= cap:
                    return f"{len(members)} sockets open, at most {cap}"
            for name, _ in key.sets():
                _local[name][key.channel] = now
        return None
    pipe = r.pipeline()
    for name, _ in key.sets():
        pipe.zremrangebyscore(name, 0, now - SOCKET_STALE_S)
        pipe.zcard(name)
    counts = pipe.execute()[1::2]
    for (_, cap), count in zip(key.sets(), counts, strict=True):
        if count >= cap:
            return f"{count} sockets open, at most {cap}"
    pipe = r.pipeline()
    for name, _ in key.sets():
        pipe.zadd(name, {key.channel: now})
        pipe.expire(name, int(SOCKET_STALE_S))
    pipe.execute()
    return None


def socket_renewed(key: SocketKey) -> None:
    """The socket is still open: its record counts for another SOCKET_STALE_S."""
    now = time.time()
    r = redis_client()
    if r is None:
        with _local_lock:
            for name, _ in key.sets():
                if key.channel in _local.get(name, {}):
                    _local[name][key.channel] = now
        return
    pipe = r.pipeline()
    for name, _ in key.sets():
        pipe.zadd(name, {key.channel: now}, xx=True)
        pipe.expire(name, int(SOCKET_STALE_S))
    pipe.execute()


def socket_closed(key: SocketKey) -> None:
    r = redis_client()
    if r is None:
        with _local_lock:
            for name, _ in key.sets():
                _local.get(name, {}).pop(key.channel, None)
        return
    pipe = r.pipeline()
    for name, _ in key.sets():
        pipe.zrem(name, key.channel)
    pipe.execute()
