"""The session proxy: /jobs/<id>/open/<name>/... to the job's web port on its node, for HTTP and WebSocket alike,
with the signed-in user's session (who may open what: scheduling.jobs.sessions).

Straight to the node's address (docs/architecture.md, "Sessions"): any daphne of the portal can serve any session,
with no hop through the agent's socket. The job gets the request's path whole (its server is told its base URL),
none of the portal's cookies and no Authorization of the user's: the proxy sends the job's own secret instead
(`Authorization: token ...`, the job's JUPYTER_TOKEN), which other jobs on the node do not have. Nothing the job
answers can set a cookie on the portal's site.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import websockets
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.template.loader import render_to_string
from django.urls import path
from websockets.asyncio.client import connect

from scheduling.jobs.sessions import SessionTarget, session_job_for, session_target
from scheduling.realtime.streams import origin_allowed

log = logging.getLogger(__name__)
access_log = logging.getLogger("tessera.access")

SESSION_PATH = re.compile(r"^/jobs/(?P<job_id>[0-9]{1,10})/open/(?P<name>[a-z][a-z0-9-]{0,30})/")
CONNECT_TIMEOUT_S = 10
HEAD_TIMEOUT_S = 300  # a long poll may answer late; the body then streams as it comes
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024  # an upload to a notebook
MAX_FRAME_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 64 * 1024
# Headers never passed on, either way: hop-by-hop (RFC 9110 7.6.1), what would carry the portal's sign-in to the
# job, and what would let the job set cookies or rules on the portal's site.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_TO_JOB_DROPPED = _HOP | {
    "expect",  # the proxy sends the body whole: no interim answer to wait for
    "cookie",
    "authorization",
    "x-csrftoken",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-tessera-user",
}
_FROM_JOB_DROPPED = _HOP | {
    "set-cookie",
    "set-cookie2",
    "strict-transport-security",
    "clear-site-data",
    "service-worker-allowed",
}


class UpstreamError(Exception):
    pass


def _page(
    status: int, title: str, message: str, *, job_id: int, retry: bool = False
) -> tuple[int, bytes, list]:
    body = render_to_string(
        "frontend/session_unavailable.html",
        {"status": status, "title": title, "message": message, "job_id": job_id, "retry": retry},
    ).encode()
    headers = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    if retry:
        headers.append((b"retry-after", b"2"))
    return status, body, headers


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _full_path(scope: dict[str, Any]) -> str:
    raw = scope.get("raw_path") or quote(scope["path"]).encode()
    query = scope.get("query_string") or b""
    return (raw + (b"?" + query if query else b"")).decode("latin-1")


_TOKEN = re.compile(r"^[!#$%&'*+.^`|~0-9A-Za-z-]+$")  # a header name as RFC 9110 writes one


def _passed_on(name: str, dropped: frozenset[str] | set[str]) -> bool:
    """A header goes through only if it is a plain HTTP token, with no '_' (which some servers read as '-', so
    X_Tessera_User would pass for X-Tessera-User), and not one dropped that way."""
    return bool(_TOKEN.match(name)) and "_" not in name and name.lower() not in dropped


def _request_head(
    scope: dict[str, Any], target: SessionTarget, *, host: str, user: str, body: bytes
) -> bytes:
    lines = [f"{scope['method']} {_full_path(scope)} HTTP/1.1", f"Host: {host}"]
    for key, value in scope.get("headers", ()):
        name, text = key.decode("latin-1"), value.decode("latin-1")
        if _passed_on(name, _TO_JOB_DROPPED) and not any(c in text for c in "\r\n\0"):
            lines.append(f"{name}: {text}")
    client = scope.get("client") or ("", 0)
    lines += [
        f"Authorization: token {target.token}",
        f"X-Forwarded-For: {client[0]}",
        f"X-Forwarded-Host: {host}",
        f"X-Forwarded-Proto: {scope.get('scheme', 'http')}",
        f"X-Tessera-User: {user}",
        "Connection: close",
    ]
    if body or scope["method"] not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")


def _digits(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]]]:
    """The job's answer's status and headers; interim answers (1xx) are skipped."""
    while True:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError) as exc:
            raise UpstreamError(f"no answer ({type(exc).__name__})") from None
        status_line, *header_lines = raw.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        status = _digits(parts[1]) if len(parts) >= 2 and parts[0].startswith("HTTP/1.") else None
        if status is None or not 100 <= status <= 599:
            raise UpstreamError(f"not an HTTP answer: {status_line[:80]!r}")
        if status >= 200:
            break
    headers = []
    for line in header_lines:
        if ":" in line:
            key, value = line.split(":", 1)
            headers.append((key.strip(), value.strip()))
    return status, headers


async def _body(reader: asyncio.StreamReader, *, chunked: bool, length: int | None) -> AsyncIterator[bytes]:
    """The answer's body as it comes, in pieces of at most CHUNK_BYTES: chunked, of a Content-Length, or until the
    job closes the connection. A chunked body cut short ends where it was cut."""
    if chunked:
        while True:
            size_line = await reader.readline()
            if not size_line.endswith(b"\n"):
                return  # the job went away mid-answer
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                return
            while size > 0:
                data = await reader.read(min(CHUNK_BYTES, size))
                if not data:
                    return
                size -= len(data)
                yield data
            await reader.readexactly(2)
    elif length is not None:
        left = length
        while left > 0:
            data = await reader.read(min(CHUNK_BYTES, left))
            if not data:
                return
            left -= len(data)
            yield data
    else:
        while data := await reader.read(CHUNK_BYTES):
            yield data


async def _request_body(receive: Any) -> bytes | None:
    """The browser's request body, whole (at most MAX_BODY_BYTES); None if the browser went away."""
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise UpstreamError(f"the request's body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


class SessionHttpProxy:
    """HTTP to the job's port, served before Django's stack (its middleware runs in one shared thread, which a
    slow job must never hold): sign-in from the session cookie (Channels' stack), who may open it from
    scheduling.jobs.sessions, the answer streamed as the job sends it."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        started = time.perf_counter()
        status = await self._serve(scope, receive, send)
        level = (
            logging.ERROR
            if status >= 500 and status != 503
            else logging.WARNING
            if status >= 400
            else logging.INFO
        )
        access_log.log(
            level,
            "%s %s %s %.0f ms",
            scope["method"],
            scope["path"][:500],
            status,
            (time.perf_counter() - started) * 1000,
        )

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> int:
        match = SESSION_PATH.match(scope["path"])
        job_id, name = int(match["job_id"]), match["name"]
        host = _header(scope, b"host") or ""
        if not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
            return await _answer(send, 400, b"Bad Request: this site is not served under that name.", _TEXT)
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            login = f"{settings.LOGIN_URL}?{urlencode({'next': _full_path(scope)}, safe='/')}"
            await _answer(send, 302, b"", [(b"location", login.encode("latin-1"))])
            return 302
        job = await database_sync_to_async(session_job_for)(user=user, job_id=job_id, name=name)
        if job is None:
            return await _answer(send, *_page(404, "Not found", "There is no such session.", job_id=job_id))
        if _header(scope, b"service-worker") is not None:
            # A job's script would control every page of the portal's site for whoever opened it.
            return await _answer(send, 403, b"Refused: a job may not install a service worker.", _TEXT)
        if scope["method"] not in ("GET", "HEAD", "OPTIONS") and not _from_this_site(scope):
            return await _answer(send, 403, b"Refused: a request from another site.", _TEXT)
        target = await database_sync_to_async(session_target)(job=job, name=name)
        if target.unavailable:
            if target.ended:
                return await _answer(send, *_page(410, "Session ended", target.unavailable, job_id=job_id))
            if target.unreachable:
                return await _answer(
                    send, *_page(502, "Cannot reach the node", target.unavailable, job_id=job_id)
                )
            return await _answer(send, *_page(503, "Starting", target.unavailable, job_id=job_id, retry=True))
        try:
            body = await _request_body(receive)
        except UpstreamError as exc:
            return await _answer(send, 413, str(exc).encode(), _TEXT)
        if body is None:
            return 499
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(target.address, target.port, limit=MAX_HEAD_BYTES), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError, ValueError) as exc:
            if target.ready:
                message = f"{name} stopped answering on its node ({type(exc).__name__})."
                return await _answer(send, *_page(502, "Not answering", message, job_id=job_id))
            message = f"{name} does not answer yet: its server is starting."
            return await _answer(send, *_page(503, "Starting", message, job_id=job_id, retry=True))
        started = False
        try:
            writer.write(_request_head(scope, target, host=host, user=user.get_username(), body=body) + body)
            await writer.drain()
            status, headers = await _read_head(reader)
            codings = [
                c.strip().lower()
                for k, v in headers
                if k.lower() == "transfer-encoding"
                for c in v.split(",")
            ]
            chunked = bool(codings) and codings[-1] == "chunked"
            lengths = {_digits(v) for k, v in headers if k.lower() == "content-length"}
            length = lengths.pop() if len(lengths) == 1 and not chunked else None
            if codings and not chunked:
                raise UpstreamError(f"a transfer coding the proxy does not take: {', '.join(codings)}")
            out = [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in headers
                if _passed_on(k, _FROM_JOB_DROPPED) and not any(c in v for c in "\r\n\0")
            ]
            if length is not None:
                out.append((b"content-length", str(length).encode()))
            await send({"type": "http.response.start", "status": status, "headers": out})
            started = True
            if scope["method"] != "HEAD" and status not in (204, 304):
                async for data in _body(reader, chunked=chunked, length=length):
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return status
        except (UpstreamError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
            if started:
                # The job went away mid-answer: the browser sees the answer cut, as it would from the job itself.
                await send({"type": "http.response.body", "body": b""})
                return 502
            message = f"{name} answered nothing usable: {exc}"
            return await _answer(send, *_page(502, "Not answering", message, job_id=job_id))
        finally:
            writer.close()


def _from_this_site(scope: dict[str, Any]) -> bool:
    """A request that changes something comes from the portal's own pages: its Origin (else its Referer) is this
    site's, scheme included (streams.origin_allowed's rule, as for the portal's sockets)."""
    if _header(scope, b"origin") is not None:
        return origin_allowed(scope)
    referer = _header(scope, b"referer")
    if referer is None:
        return False
    parts = urlsplit(referer)
    return origin_allowed(scope, origin=f"{parts.scheme}://{parts.netloc}")


_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]


async def _answer(send: Any, status: int, body: bytes, headers: list) -> int:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


def http_app(django_app: Any) -> Any:
    """The portal's HTTP: sessions' paths to the proxy, everything else to Django."""
    sessions = AuthMiddlewareStack(SessionHttpProxy())

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and SESSION_PATH.match(scope["path"]):
            await sessions(scope, receive, send)
        else:
            await django_app(scope, receive, send)

    return app


class SessionSocketProxy:
    """A WebSocket to the job's port (Jupyter's kernels): accepted once the job's server accepted it, then every
    frame passed on both ways until either side closes."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        match = SESSION_PATH.match(scope["path"])
        job_id, name = int(match["job_id"]), match["name"]
        user = scope.get("user")
        job = (
            await database_sync_to_async(session_job_for)(user=user, job_id=job_id, name=name)
            if user
            else None
        )
        if job is None:
            return await _refuse(send, 4004)
        target = await database_sync_to_async(session_target)(job=job, name=name)
        if target.unavailable:
            return await _refuse(send, 4010 if target.ended else 4502 if target.unreachable else 4503)
        query = scope.get("query_string", b"").decode("latin-1")
        where = f"[{target.address}]" if ":" in target.address else target.address  # an IPv6 address
        url = f"ws://{where}:{target.port}{quote(scope['path'])}" + (f"?{query}" if query else "")
        try:
            upstream = await connect(
                url,
                additional_headers={
                    "Authorization": f"token {target.token}",
                    "X-Tessera-User": user.get_username(),
                },
                # The job's server sees its own address as the page's origin (Jupyter refuses a foreign one).
                origin=f"http://{where}:{target.port}",
                subprotocols=scope.get("subprotocols") or None,
                max_size=MAX_FRAME_BYTES,
                open_timeout=CONNECT_TIMEOUT_S,
                proxy=None,  # straight to the node, never through a proxy the environment names
            )
        except (OSError, TimeoutError, ValueError, websockets.WebSocketException) as exc:
            log.info("session %s/%s: the job did not take the socket: %s", job_id, name, exc)
            return await _refuse(send, 4502)
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

        async def to_job() -> None:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("bytes") is not None:
                    await upstream.send(message["bytes"])
                elif message.get("text") is not None:
                    await upstream.send(message["text"])

        async def from_job() -> None:
            try:
                async for frame in upstream:
                    key = "bytes" if isinstance(frame, bytes) else "text"
                    await send({"type": "websocket.send", key: frame})
            except websockets.WebSocketException:
                pass

        tasks = [asyncio.ensure_future(to_job()), asyncio.ensure_future(from_job())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await upstream.close()
        if tasks[1] in done:  # the job closed it: so does the browser's
            await send({"type": "websocket.close", "code": 1000})


# Why the proxy closed a socket, as its close code (a refused handshake would reach the page as 1006 and no reason):
# 4004 no such session (or not yours), 4010 its job has ended, 4503 its server is starting, 4502 it refused.
async def _refuse(send: Any, code: int) -> None:
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code})


def websocket_routes(wrap: Any) -> list:
    """The proxy's WebSocket routes, wrapped as the portal's other browser sockets are (`wrap`: the Origin
    checks)."""
    app = wrap(AuthMiddlewareStack(SessionSocketProxy()))
    return [
        path("jobs/<int:job_id>/open/<str:name>/<path:rest>", app),
        path("jobs/<int:job_id>/open/<str:name>/", app),
    ]
