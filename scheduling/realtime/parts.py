"""Live parts pushed over the page's socket: a changed part is rendered once per audience and sent to every page
that shows it, instead of each page asking for it again.

A page tells its socket which of its parts it shows (`{"type": "watch", "parts": [{"id", "url", "on"}]}`: the part's
own URL, and the events it changes on). A part can be pushed only when its view says whom its answer depends on:
`@pushed(audience)` on the view, where `audience(request, **kwargs)` returns a key that is equal for two users only
when the view answers them the same (None: not pushed to this user, who keeps asking as before). Each process keeps
one entry per (URL, audience) with the sockets that show it; an event that reaches them (the same event reaches
every socket of a group: it carries one `event_id`) renders the part once, through its view, as one of them, and
the HTML goes to all. Renders of one entry never overlap: events that arrive during one render make one more, at
least RERENDER_GAP_S after it (a burst of a cycle's changes is one or two renders, not one per change).

Tenancy stays the view's: the render is the view's own answer to a user of that audience, and each socket checks
its user's access before it sends anything (streams.py). The render carries no session and a CSRF token of its
own: portal.js puts the page's token in a form before it is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import SyncToAsync
from django.db import close_old_connections
from django.http import Http404, HttpRequest, QueryDict
from django.urls import Resolver404, resolve

log = logging.getLogger(__name__)

MAX_PARTS = 8  # a page shows a handful of live parts; a watch of 8 fits the stream's 4,096-character frame
MAX_URL_CHARS = 256
RERENDER_GAP_S = 0.25
PART_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
# The events a part may change on (the page's stream carries them).
PART_EVENTS = frozenset({"job.changed", "queue.changed", "node.changed", "gpu.health"})

Audience = Callable[..., Hashable | None]
Send = Callable[[str], Awaitable[None]]  # the message's JSON text


def pushed(audience: Audience) -> Callable[[Callable], Callable]:
    """Mark a page view whose parts may be pushed: `audience(request, **kwargs)` (the view's own arguments) returns
    what the answer depends on besides the URL (equal keys, equal answers), or None to leave this user asking."""

    def mark(view: Callable) -> Callable:
        view.push_audience = audience
        return view

    return mark


@dataclass(frozen=True)
class Watch:
    """A part a page shows: its element id, its URL (path and query) and the events it changes on."""

    part_id: str
    url: str
    on: frozenset[str]


def watches_from(content: Any) -> tuple[list[Watch], str | None]:
    """The parts of a watch message, or why it is refused (one line, for the log)."""
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or len(parts) > MAX_PARTS:
        return [], f"parts: a list of at most {MAX_PARTS}"
    out = []
    for part in parts:
        if not isinstance(part, dict):
            return [], "parts: objects"
        part_id, url, on = part.get("id"), part.get("url"), part.get("on")
        if not isinstance(part_id, str) or not PART_ID.match(part_id):
            return [], "parts[].id: a letter then up to 63 letters, digits, - or _"
        if (
            not isinstance(url, str)
            or len(url) > MAX_URL_CHARS
            or not url.startswith("/")
            or url.startswith("//")
        ):
            return [], f"parts[].url: a path on this site, at most {MAX_URL_CHARS} characters"
        if not isinstance(on, list) or not all(isinstance(e, str) for e in on):
            return [], "parts[].on: a list of event names"
        out.append(Watch(part_id=part_id, url=url, on=frozenset(on) & PART_EVENTS))
    return out, None


def part_request(*, url: str, user: Any, host: str) -> tuple[HttpRequest, Callable, dict]:
    """A GET of `url` as `user`, with no session or cookie, and the view that answers it (Resolver404: none)."""
    path, _, query = url.partition("?")
    match = resolve(path)
    request = HttpRequest()
    request.method = "GET"
    request.path = request.path_info = path
    request.GET = QueryDict(query)
    request.META = {
        "REQUEST_METHOD": "GET",
        "QUERY_STRING": query,
        "HTTP_HOST": host,
        "SERVER_NAME": host.rsplit(":", 1)[0] or "localhost",
        "SERVER_PORT": "80",
    }
    # No session and no cookie: a form's CSRF token is the render's own, never a user's (the page puts its own in
    # before the form is sent).
    request.user = user
    return request, match.func, match.kwargs


def audience_of(*, watch: Watch, user: Any, host: str) -> Hashable | None:
    """The key of `user`'s audience for the part (None: the view does not push it, or not to this user)."""
    try:
        request, view, kwargs = part_request(url=watch.url, user=user, host=host)
    except Resolver404:
        return None
    audience = getattr(view, "push_audience", None)
    if audience is None:
        return None
    try:
        key = audience(request, **kwargs)
    except Http404:
        return None
    return None if key is None else (watch.url, key)


def render(*, url: str, user: Any, host: str) -> str | None:
    """The part's HTML as its view answers `user` (None: anything but a 200)."""
    try:
        request, view, kwargs = part_request(url=url, user=user, host=host)
        response = view(request, **kwargs)
    except (Resolver404, Http404):
        return None
    if getattr(response, "render", None) is not None and not getattr(response, "is_rendered", True):
        response.render()
    if response.status_code != 200:
        return None
    return response.content.decode(response.charset or "utf-8")


# Renders run on threads of their own, not behind the sockets' database calls (Channels' one shared thread), and
# keep their database connection between renders as a request thread does (CONN_MAX_AGE): a render that opened a
# connection each time waited for a new PostgreSQL backend on every event.
RENDER_THREADS = 2
_render_pool: ThreadPoolExecutor | None = None


def _render_in_thread(*, url: str, user: Any, host: str) -> str | None:
    close_old_connections()  # spent (past CONN_MAX_AGE) or broken: a fresh one
    try:
        return render(url=url, user=user, host=host)
    finally:
        close_old_connections()


def _render_async(*, url: str, user: Any, host: str) -> Awaitable[str | None]:
    global _render_pool
    if _render_pool is None:
        _render_pool = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="parts-render")
    return SyncToAsync(_render_in_thread, thread_sensitive=False, executor=_render_pool)(
        url=url, user=user, host=host
    )


@dataclass
class Subscriber:
    """A socket showing a part: as whom it renders, on which host, the element's id, and how to send to it."""

    user: Any
    host: str
    part_id: str
    send: Send


@dataclass
class _Entry:
    url: str
    subscribers: dict[str, Subscriber] = field(default_factory=dict)  # by channel name
    seen: deque = field(default_factory=lambda: deque(maxlen=256))  # event ids already rendered for
    task: asyncio.Task | None = None
    again: bool = False


class PartHub:
    """This process's pushed parts, by (URL, audience)."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self.renders = 0  # how many renders this process has made (a test reads it)

    def subscribe(self, *, key: Hashable, channel: str, subscriber: Subscriber) -> None:
        """Follow the part `key` names ((URL, audience), audience_of's answer) on `channel`."""
        entry = self._entries.setdefault(key, _Entry(url=key[0]))  # type: ignore[index]
        entry.subscribers[channel] = subscriber

    def unsubscribe(self, *, channel: str) -> None:
        for key in [k for k, e in self._entries.items() if channel in e.subscribers]:
            entry = self._entries[key]
            del entry.subscribers[channel]
            if not entry.subscribers:
                if entry.task is not None:
                    entry.task.cancel()
                del self._entries[key]

    def changed(self, *, key: Hashable, event_id: str | None) -> None:
        """An event reached a socket that shows the part: render it, unless this event already did."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if event_id:
            if event_id in entry.seen:
                return
            entry.seen.append(event_id)
        if entry.task is not None and not entry.task.done():
            entry.again = True
            return
        entry.task = asyncio.get_running_loop().create_task(self._render(entry))

    async def _render(self, entry: _Entry) -> None:
        while entry.subscribers:
            entry.again = False
            first = next(iter(entry.subscribers.values()))
            try:
                html = await _render_async(url=entry.url, user=first.user, host=first.host)
            except Exception:  # a part that fails to render is left as it is; the page catches up later
                log.warning("could not render the pushed part %s", entry.url, exc_info=True)
                html = None
            self.renders += 1
            if html is not None:
                subscribers = list(entry.subscribers.values())
                texts = {  # one encoding per element id, not one per page
                    part_id: json.dumps({"type": "part", "id": part_id, "html": html})
                    for part_id in {s.part_id for s in subscribers}
                }
                await asyncio.gather(*(s.send(texts[s.part_id]) for s in subscribers), return_exceptions=True)
            if not entry.again:
                return
            await asyncio.sleep(RERENDER_GAP_S)


hub = PartHub()
