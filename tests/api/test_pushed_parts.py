"""Live parts pushed over the page's socket (scheduling/realtime/parts.py): a changed part is rendered once for all
the sockets of one audience and sent to each; users its view answers differently are told apart; a part of a job
the user may not see, or of a view that pushes nothing, is not followed; the render carries no user's CSRF token."""

from __future__ import annotations

import asyncio
import re

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.middleware.csrf import _unmask_cipher_token

from scheduling.choices import ActorKind, JobState
from scheduling.jobs.transitions import job_transition
from scheduling.realtime import parts
from tests.api.test_streams import _headers, _open, _submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def dave(django_user_model, teams):
    """A plain member of alice's team: sees her jobs, may not cancel them."""
    from quotas.services import membership_set

    user = django_user_model.objects.create_user(username="dave", password="dave-pw")
    membership_set(user=user, team=teams["training"])
    return user


def _live(job_id: int) -> dict:
    return {"id": "job-live", "url": f"/jobs/{job_id}/?part=live", "on": ["job.changed", "queue.changed"]}


async def _watching(communicator, part: dict) -> list[str]:
    await communicator.receive_json_from()  # hello
    await communicator.send_json_to({"type": "watch", "parts": [part]})
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == "watching":
            return message["parts"]


async def _next_part(communicator) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == "part":
            return message


def _place(job) -> None:
    with transaction.atomic():
        row = type(job).objects.select_for_update().get(pk=job.pk)
        job_transition(
            job=row, to_state=JobState.PLACED, actor_kind=ActorKind.ADMIN, code="test", message="test"
        )


def test_one_change_is_rendered_once_for_all_pages_of_an_audience_and_once_more_for_another(
    alice, carol, dave, teams, node
):
    job = _submit(alice, teams["training"])
    same = [_headers(alice), _headers(alice), _headers(carol)]  # the owner twice and a team admin: may cancel
    other = _headers(dave)  # a member: may see it, may not cancel it

    async def scenario():
        sockets = []
        for headers in [*same, other]:
            communicator, connected = await _open(f"/ws/jobs/{job.pk}/", headers)
            assert connected
            assert await _watching(communicator, _live(job.pk)) == ["job-live"]
            sockets.append(communicator)
        renders = parts.hub.renders
        await sync_to_async(_place)(job)
        pushed = [await _next_part(c) for c in sockets]
        assert parts.hub.renders - renders == 2  # one per audience, not one per page
        assert all(p["id"] == "job-live" for p in pushed)
        assert all("Placed" in p["html"] for p in pushed)
        assert [("Cancel job" in p["html"]) for p in pushed] == [True, True, True, False]
        assert pushed[0]["html"] == pushed[1]["html"] == pushed[2]["html"]
        for c in sockets:
            await c.disconnect()

    async_to_sync(scenario)()


def test_a_part_of_a_job_the_user_may_not_see_or_of_a_view_that_pushes_nothing_is_not_followed(
    alice, bob, teams, node
):
    alices = _submit(alice, teams["training"])
    bobs = _submit(bob, teams["inference"])
    headers = _headers(bob)

    async def scenario():
        communicator, connected = await _open(f"/ws/jobs/{bobs.pk}/", headers)
        assert connected
        await communicator.receive_json_from()  # hello
        await communicator.send_json_to(
            {
                "type": "watch",
                "parts": [
                    _live(alices.pk),  # another team's job: its view answers bob 404
                    # A whole page's answer (the part is picked from it in the browser): not pushed.
                    {"id": "summary", "url": "/?cluster&part=summary", "on": ["queue.changed"]},
                    {"id": "nowhere", "url": "/no/such/page/", "on": ["queue.changed"]},
                    _live(bobs.pk),
                ],
            }
        )
        watching = await communicator.receive_json_from(timeout=5)
        assert watching == {"type": "watching", "parts": ["job-live"]}
        await communicator.send_json_to({"type": "watch", "parts": [{"id": "x", "url": "//evil.example/"}]})
        assert await communicator.receive_nothing(timeout=0.3)  # refused, and the socket stays open
        await communicator.send_json_to({"type": "ping"})
        assert (await communicator.receive_json_from(timeout=5))["type"] == "pong"
        await communicator.disconnect()

    async_to_sync(scenario)()


def test_a_pushed_part_carries_no_token_of_the_user_it_was_rendered_as(alice, teams, node, client, settings):
    # Kept in the session, a user's CSRF secret would be in any render that read the socket's session.
    settings.CSRF_USE_SESSIONS = True
    job = _submit(alice, teams["training"])
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/")
    secret = _unmask_cipher_token(page.context["csrf_token"])
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()))

    async def scenario():
        communicator, connected = await _open(f"/ws/jobs/{job.pk}/", headers)
        assert connected
        assert await _watching(communicator, _live(job.pk)) == ["job-live"]
        await sync_to_async(_place)(job)
        html = (await _next_part(communicator))["html"]
        await communicator.disconnect()
        return html

    html = async_to_sync(scenario)()
    tokens = re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert tokens, "the owner's cancel form is in the part"
    assert all(_unmask_cipher_token(t) != secret for t in tokens)


def test_the_queue_is_rendered_once_per_set_of_teams_and_others_jobs_stay_anonymous(
    alice, dave, bob, teams, node
):
    headers = [_headers(alice), _headers(dave), _headers(bob)]
    rows = {"id": "queue-rows", "url": "/queue/?part=rows", "on": ["job.changed", "queue.changed"]}

    async def scenario():
        sockets = []
        for h in headers:
            communicator, connected = await _open("/ws/queue/", h)
            assert connected
            assert await _watching(communicator, rows) == ["queue-rows"]
            sockets.append(communicator)
        renders = parts.hub.renders
        await sync_to_async(_submit)(alice, teams["training"], name="alices-secret-sweep")
        pushed = [await _next_part(c) for c in sockets]
        assert (
            parts.hub.renders - renders == 2
        )  # alice and dave share their teams; bob sees them from outside
        assert ["alices-secret-sweep" in p["html"] for p in pushed] == [True, True, False]
        assert "ai-lab/training" in re.sub(r"<[^>]+>", "", pushed[2]["html"])  # bob sees the team's entry
        for c in sockets:
            await c.disconnect()

    async_to_sync(scenario)()


def test_an_arrays_page_is_pushed_its_counts_when_one_of_its_tasks_changes(alice, teams, node):
    from scheduling.cycle.runner import cycle_run_once
    from scheduling.jobs.models import Job

    array = _submit(alice, teams["training"], array="0-7")
    cycle_run_once()  # all 8 placed: the array's row is task 7, no longer pending (the queue's moves are not its)
    task = Job.objects.filter(array_job_id=array.pk, state="placed").exclude(pk=array.pk).first()

    def run_it() -> None:
        with transaction.atomic():
            row = type(task).objects.select_for_update().get(pk=task.pk)
            job_transition(job=row, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)

    headers = _headers(alice)

    async def scenario():
        communicator, connected = await _open(f"/ws/jobs/{array.pk}/", headers)
        assert connected
        assert await _watching(communicator, _live(array.pk)) == ["job-live"]
        await sync_to_async(run_it)()
        pushed = await _next_part(communicator)
        await communicator.disconnect()
        return pushed

    pushed = async_to_sync(scenario)()
    assert re.search(r">1 running</span>", pushed["html"]) and re.search(r">7 placed</span>", pushed["html"])
    assert Job.objects.get(pk=array.pk).array_task_id == 7


@pytest.mark.parametrize("max_age_s", [600, 0])
def test_renders_keep_their_database_connection_as_a_request_thread_does(
    alice, teams, node, monkeypatch, max_age_s
):
    """A render's connection stays open for the next render while CONN_MAX_AGE allows (not a new PostgreSQL backend
    per event), and is closed after it when 0."""
    from django.db import connection, connections

    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", max_age_s)
    monkeypatch.setattr(parts, "RENDER_THREADS", 1)
    monkeypatch.setattr(parts, "_render_pool", None)
    job = _submit(alice, teams["training"])
    url = f"/jobs/{job.pk}/?part=live"

    def backend_pid():
        return connection.connection.info.backend_pid if connection.connection is not None else None

    async def scenario():
        pids = []
        for _ in range(2):
            html = await parts._render_async(url=url, user=alice, host="testserver")
            assert html is not None and 'id="job-live"' in html
            pids.append(await asyncio.get_running_loop().run_in_executor(parts._render_pool, backend_pid))
        return pids

    try:
        pids = async_to_sync(scenario)()
    finally:
        parts._render_pool.submit(lambda: connection.close()).result()
        parts._render_pool.shutdown()
    if max_age_s:
        assert pids[0] is not None and pids[0] == pids[1]
    else:
        assert pids == [None, None]
