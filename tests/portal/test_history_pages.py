"""The history and capacity pages through Django's test client: a member sees other teams' usage as teams, never
their users; the window is one the page offers, whatever is asked; the heatmap's pools and their nodes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from scheduling.history import recorder
from scheduling.history.models import UsageHour
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.models import Job
from scheduling.jobs.submit import job_submit

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _usage(team, user, model_id, *, hours_ago: int, gpu_hours: float) -> None:
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours_ago)
    UsageHour.objects.create(
        hour=hour, team_id=team.pk, user_id=user.pk, model_id=model_id, gpu_seconds=gpu_hours * 3600
    )


def _chart(page: str, element_id: str) -> dict:
    start = page.index(f'<script id="{element_id}" type="application/json">') + len(
        f'<script id="{element_id}" type="application/json">'
    )
    return json.loads(page[start : page.index("</script>", start)])


def test_a_member_sees_other_teams_as_teams_and_their_users_only_as_other_teams(alice, bob, teams, node):
    model = Gpu.objects.filter(node=node).first().model_id
    _usage(teams["training"], alice, model, hours_ago=2, gpu_hours=10)
    _usage(teams["inference"], bob, model, hours_ago=3, gpu_hours=4)

    page = _signed_in(alice).get("/history/?by=user").content.decode()
    assert "ai-lab/inference" in re.sub(r"<[^>]+>", "", page)  # team totals are everyone's (tags cut out)
    assert "bob" not in page  # not in the tables, not in the chart
    assert "other teams" in page
    series = {s["label"]: sum(s["values"]) for s in _chart(page, "chart-usage")["series"]}
    assert series == {"alice": 10.0, "other teams": 4.0}

    bob_page = _signed_in(bob).get("/history/?by=user").content.decode()
    assert "alice" not in bob_page and "bob" in bob_page


def test_staff_see_every_user(admin_user, alice, bob, teams, node):
    model = Gpu.objects.filter(node=node).first().model_id
    _usage(teams["training"], alice, model, hours_ago=2, gpu_hours=10)
    _usage(teams["inference"], bob, model, hours_ago=3, gpu_hours=4)
    page = _signed_in(admin_user).get("/history/?window=30d&by=user").content.decode()
    assert "alice" in page and "bob" in page and "other teams" not in page


def test_queue_times_are_read_from_their_rollup_and_the_p95_says_it_is_from_a_histogram(alice, teams, node):
    started = datetime.now(UTC).replace(minute=5, second=0, microsecond=0) - timedelta(hours=3)
    for wait in (10, 20, 30, 40, 1000):
        job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="j", command="x", gpus=1))
        Job.objects.filter(pk=job.pk).update(
            submitted_at=started - timedelta(seconds=wait), started_at=started
        )
    recorder.waits_roll()
    # The jobs' rows now say a day's wait each: the page's figures are the rollup's, rolled when they started.
    Job.objects.update(submitted_at=started - timedelta(days=1))
    page = _signed_in(alice).get("/history/").content.decode()
    assert "<b>4 min</b><span>mean wait" in page  # 220 s
    assert "<b>≈ 17 min</b><span" in page and "from a histogram of waits, within 10 %" in page  # 1000 s
    assert "mean (p95 ≈ 17 min, 5 jobs)" in page  # alice's teams
    assert sum(n or 0 for n in _chart(page, "chart-wait")["series"][0]["values"]) == pytest.approx(
        3.7, abs=0.1
    )


@pytest.mark.parametrize("query", ["?window=1y", "?window=", "?window=24h&by=nobody", "?by=<script>"])
def test_an_unknown_window_or_grouping_falls_back_to_the_default(alice, query):
    response = _signed_in(alice).get(f"/history/{query}")
    assert response.status_code == 200
    assert 'aria-current="page">Last 7 days' in response.content.decode()
    capacity = _signed_in(alice).get(f"/capacity/{query}&pool=nowhere")
    assert capacity.status_code == 200
    assert 'aria-current="page">Last 24h' in capacity.content.decode()


def test_the_pages_ask_for_sign_in(db):
    assert Client().get("/history/").status_code == 302
    assert Client().get("/capacity/").status_code == 302


def test_capacity_shows_now_by_model_and_a_heatmap_row_per_pool_then_per_node(alice, node):
    Node.objects.filter(pk=node.pk).update(labels={"pool": "training-pool"})
    now = datetime.now(UTC)
    for minute in range(3):
        recorder.history_record(now=now - timedelta(minutes=minute))
    page = _signed_in(alice).get("/capacity/").content.decode()
    assert "A100-80GB" in page and "Now, by GPU model" in page
    assert "training-pool" in page and "90–100 %" in page  # the pool's row and the legend
    assert "training-pool, " in page and "0 % allocated" in page  # a cell's title says what it holds

    per_node = _signed_in(alice).get("/capacity/?pool=training-pool&window=7d").content.decode()
    assert node.name in per_node and "Nodes 1–1 of 1" in per_node
    assert 'id="capacity-now"' in _signed_in(alice).get("/capacity/?part=now").content.decode()


def test_the_demo_writes_a_day_of_generated_history_once(db):
    from demo.seed import load_demo
    from scheduling.history.models import ClusterMinute, NodeHour, NodeMinute
    from scheduling.jobs.models import JobEvent

    load_demo(history_days=1)
    counts = (ClusterMinute.objects.count(), NodeMinute.objects.count(), UsageHour.objects.count())
    # A day back to the first whole hour in it: 23 to 24 hours of minutes.
    assert 1380 < counts[0] <= 1440 and counts[1] == counts[0] * 6 and counts[2] > 0
    assert NodeHour.objects.filter(minutes=60).exists()
    # A generated job says so in a researcher's words (its events named the module: "(demo.history)").
    said = (
        JobEvent.objects.filter(message__contains="generated past").values_list("message", flat=True).first()
    )
    assert said and "demo.history" not in said, said
    assert not JobEvent.objects.filter(
        message=""
    ).exists()  # the loaded jobs' start said nothing on their pages
    load_demo(history_days=1)  # history is there: nothing twice
    assert (ClusterMinute.objects.count(), NodeMinute.objects.count(), UsageHour.objects.count()) == counts


def test_the_capacity_charts_and_the_heatmap_say_one_timezone(alice, node):
    recorder.history_record(now=datetime.now(UTC))
    page = _signed_in(alice).get("/capacity/").content.decode()
    ids = [part.split('"')[0] for part in page.split('<script id="')[1:]]
    labels = {_chart(page, i).get("x_label") for i in ids if i.startswith("chart-")}
    assert labels == {"Time (local)"}, labels  # charts.js draws time axes in the browser's timezone
    # The heatmap's times are put in the browser's timezone too (each tick and cell carries its Unix time).
    assert "Times in UTC" not in page and "Times in your browser's timezone" in page
    assert 'class="heat-tick" style="grid-column: 1" data-t="' in page or 'class="heat-tick"' in page
    assert page.count('data-t="') > 24


@pytest.mark.parametrize(("name", "until"), [("24h", "2026-12-03T20:30"), ("7d", "2026-12-03T01:30")])
def test_no_heatmap_tick_sits_where_its_label_has_no_room(db, name, until):
    from frontend.history import _heatmap
    from scheduling.history.selectors.windows import window

    w = window(name, now=datetime.fromisoformat(until).replace(tzinfo=UTC))
    heatmap = _heatmap(pools=[], pool=None, w=w, page=None)
    # The last column's hour is a tick's (20:00; Thursday 00:00): its label read "20:0", cut at the row's edge.
    last = max(t["at"] for t in heatmap["ticks"])
    assert heatmap["columns"] - last >= 0.1 * heatmap["columns"], heatmap["ticks"][-1]
