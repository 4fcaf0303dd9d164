"""The session proxy's HTTP (frontend/sessions.py) against jobs that answer oddly or badly: a real TCP server
stands in for the job's port; who may open it is decided elsewhere (tests/scheduling/test_sessions.py) and given
here. Whatever the job does, the browser gets an answer (a page saying what went wrong), never a server error, and
nothing of the portal's sign-in reaches the job."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from frontend import sessions
from scheduling.jobs.sessions import SessionTarget

TOKEN = "the-jobs-secret"


class Job:
    """The job as the proxy needs it."""

    pk = 7
    state = "running"


def _scope(
    method: str = "GET", path: str = "/jobs/7/open/jupyter/lab", headers=(), host: bytes = b"testserver"
):
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "scheme": "http",
        "client": ("10.9.8.7", 5000),
        "headers": [(b"host", host), *headers],
        "user": SimpleNamespace(is_authenticated=True, get_username=lambda: "alice"),
    }


def _through(
    answer: bytes | None, scope: dict, monkeypatch, *, body: bytes = b"", target: SessionTarget | None = None
) -> tuple[dict, bytes, bytes]:
    """Run one request through the proxy to a job that answers `answer` (None: closes at once); the response's
    start message, its body, and what the job received."""
    received = bytearray()

    async def job(reader, writer):
        received.extend(await reader.readuntil(b"\r\n\r\n"))
        if answer is not None:
            writer.write(answer)
            await writer.drain()
        writer.close()

    async def run():
        server = await asyncio.start_server(job, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        given = target or SessionTarget(address="127.0.0.1", port=port, token=TOKEN, ready=True)
        monkeypatch.setattr(sessions, "session_job_for", lambda **_: Job())
        monkeypatch.setattr(sessions, "session_target", lambda **_: given)
        sent = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        async with server:
            await sessions.SessionHttpProxy()(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start, content

    start, content = asyncio.run(run())
    return start, content, bytes(received)


@pytest.fixture(autouse=True)
def _hosts(settings):
    settings.ALLOWED_HOSTS = ["testserver"]


def _headers(start: dict) -> dict[bytes, bytes]:
    return dict(start["headers"])


def test_the_job_gets_its_token_and_none_of_the_portals_sign_in(monkeypatch):
    scope = _scope(
        headers=[
            (b"cookie", b"sessionid=portal; csrftoken=x"),
            (b"authorization", b"Bearer the-users-api-token"),
            (b"x_tessera_user", b"mallory"),
            (b"x-csrftoken", b"x"),
            (b"accept", b"text/html"),
        ]
    )
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nSet-Cookie: sessionid=evil; Path=/\r\n"
        b"Service-Worker-Allowed: /\r\n\r\nok"
    )
    start, content, received = _through(answer, scope, monkeypatch)
    assert (start["status"], content) == (200, b"ok")
    assert b"set-cookie" not in _headers(start) and b"service-worker-allowed" not in _headers(start)
    text = received.decode()
    assert f"Authorization: token {TOKEN}\r\n" in text and "X-Tessera-User: alice\r\n" in text
    assert (
        "sessionid" not in text and "Bearer" not in text and "mallory" not in text and "csrftoken" not in text
    )
    assert "accept: text/html" in text and text.startswith("GET /jobs/7/open/jupyter/lab HTTP/1.1\r\n")


@pytest.mark.parametrize(
    "answer",
    [
        None,  # closes without a word
        b"SSH-2.0-OpenSSH_9.2\r\n\r\n",  # not HTTP
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",  # a coding the proxy does not take
    ],
)
def test_a_job_that_answers_nothing_usable_gets_the_browser_a_502_page(answer, monkeypatch):
    start, content, _ = _through(answer, _scope(), monkeypatch)
    assert start["status"] == 502 and b"answered nothing usable" in content


def test_chunks_interim_answers_and_an_odd_length_are_read_as_http_says(monkeypatch):
    chunked = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
    )
    start, content, _ = _through(chunked, _scope(), monkeypatch)
    assert (start["status"], content) == (200, b"hello world")
    odd = b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\nabc"  # a superscript two is no length
    start, content, _ = _through(odd, _scope(), monkeypatch)
    assert (start["status"], content) == (200, b"abc") and b"content-length" not in _headers(start)
    cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"
    start, content, _ = _through(cut, _scope(), monkeypatch)
    assert start["status"] == 200 and content == b"hel"  # as cut as the job left it


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ([(b"origin", b"http://testserver")], True),
        ([(b"referer", b"http://testserver/jobs/7/open/jupyter/")], True),
        ([(b"origin", b"http://evil.example")], False),
        ([(b"origin", b"https://testserver")], False),  # another scheme is another site
        ([], False),  # neither: not from the portal's pages
    ],
)
def test_a_change_from_another_site_is_refused(headers, allowed, monkeypatch):
    ok = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    start, _, received = _through(ok, _scope("POST", headers=headers), monkeypatch, body=b"{}")
    assert start["status"] == (201 if allowed else 403)
    assert bool(received) is allowed


def test_a_service_worker_and_an_unknown_host_are_refused(monkeypatch):
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    start, content, received = _through(ok, _scope(headers=[(b"service-worker", b"script")]), monkeypatch)
    assert start["status"] == 403 and b"service worker" in content and not received
    start, _, received = _through(ok, _scope(host=b"evil.example"), monkeypatch)
    assert start["status"] == 400 and not received


@pytest.mark.django_db
def test_a_session_path_typed_without_its_slash_is_sent_to_it(client, alice):
    client.force_login(alice)
    response = client.get("/jobs/12/open/jupyter")
    assert (response.status_code, response["Location"]) == (302, "/jobs/12/open/jupyter/")


def test_the_forms_command_line_writes_web_ports_as_the_cli_takes_them():
    from portal.submit_flags import submit_command_line

    line = submit_command_line(
        {
            "name": "nb",
            "command": "jupyter lab",
            "kind": "interactive",
            "ports": [{"name": "jupyter", "port": 8888}],
        }
    )
    assert line == "tessera submit --name nb --kind interactive --port jupyter:8888 -- jupyter lab"


def test_a_node_at_an_address_sessions_may_not_use_is_said_so_not_retried(monkeypatch):
    """A site's setting, not a wait: a 502 page that says so, with no "tries again"."""
    refused = SessionTarget(
        unavailable="Job 7's node a1 is not at an address sessions may use", unreachable=True
    )
    monkeypatch.setattr(sessions, "session_target", lambda **_: refused)
    start, content, _ = _through(None, _scope(), monkeypatch, target=refused)
    assert start["status"] == 502 and b"Cannot reach the node" in content and b"tries again" not in content
