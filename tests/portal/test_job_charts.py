"""The GPU charts of a job's page and of a node's page, as the server writes them for charts.js: a job's axis runs
over its own life, a finished job keeps its charts from the portal's history, memory is drawn up to the card's,
and every chart has one named line per GPU (the browser side is tests/browser/test_job_charts.py)."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from scheduling.history.models import GpuFiveMinute
from scheduling.history.partitions import partitions_ensure
from scheduling.inventory.models import Gpu
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit

pytestmark = pytest.mark.django_db


def _chart(page: str, json_id: str) -> dict | None:
    found = re.search(rf'<script id="{json_id}" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(found.group(1)) if found else None


def _page(user, url: str) -> str:
    client = Client()
    client.force_login(user)
    return client.get(url).content.decode()


def _ran(alice, teams, node, *, gpus: int, seconds: float, state: str = "succeeded"):
    """A job that ran `seconds` on the node's first `gpus` cards and ended, as the agent reports it."""
    from scheduling.agents.reports.job_status import job_report
    from scheduling.cycle import apply, lease
    from scheduling.engine import types as eng

    job = job_submit(
        submitter=alice, team=teams["training"], spec=JobSpec(name="ran", command="python run.py", gpus=gpus)
    )
    cards = tuple(eng.Assignment(node.name, i, 81920, 1000) for i in range(gpus))
    apply.apply_decisions(
        decisions=eng.Decisions(placements=(eng.Placement(str(job.pk), cards),)), epoch=lease.epoch_issue()
    )
    job.refresh_from_db()
    report = {"job_id": job.pk, "attempt": job.attempt}
    job_report(node_id=node.pk, payload={**report, "state": "started"})
    exit_code = 0 if state == "succeeded" else 3
    job_report(node_id=node.pk, payload={**report, "state": "exited", "exit_code": exit_code})
    job.refresh_from_db()
    # Its life, as long as the test says (the reports above took milliseconds).
    job.started_at = job.finished_at - timedelta(seconds=seconds)
    job.save(update_fields=["started_at"])
    return job


def _windows(node, *, indexes, since: datetime, until: datetime, util: float, memory_mib: int) -> None:
    """The recorder's 5-minute rows of the node's cards over [since, until]."""
    gpu_of = dict(Gpu.objects.filter(node=node).values_list("index", "pk"))
    partitions_ensure(days=[since.date(), until.date()])
    at = since.replace(minute=since.minute - since.minute % 5, second=0, microsecond=0)
    while at <= until:
        for i in indexes:
            GpuFiveMinute.objects.create(
                gpu_id=gpu_of[i],
                at=at,
                node_id=node.pk,
                samples=5,
                util_pct_sum=util * 5,
                memory_used_mib_max=memory_mib,
            )
        at += timedelta(minutes=5)


def test_a_finished_job_keeps_its_charts_from_history_one_line_per_card_over_its_own_life(alice, teams, node):
    job = _ran(alice, teams, node, gpus=2, seconds=600)
    _windows(node, indexes=(0, 1), since=job.started_at, until=job.finished_at, util=87.5, memory_mib=40960)
    page = _page(alice, f"/jobs/{job.pk}/")
    util, memory = _chart(page, "chart-job-util_pct"), _chart(page, "chart-job-memory_used_gib")
    assert util is not None and memory is not None, "a finished job lost its charts"
    assert [s["label"] for s in util["series"]] == ["a100-01 GPU 0", "a100-01 GPU 1"]
    assert {v for s in util["series"] for v in s["values"]} == {87.5}
    assert {v for s in memory["series"] for v in s["values"]} == {40.0}
    # The axis is the job's life, and every point lies on it.
    assert util["x"] == {"min": job.started_at.timestamp(), "max": job.finished_at.timestamp()}
    assert all(job.started_at.timestamp() <= t <= job.finished_at.timestamp() for t in util["t"])
    assert memory["y"]["max"] == 80, "memory is drawn up to the card's 80 GiB"
    assert util["y"]["max"] == 100
    assert "From the portal's history" in html.unescape(page)


def test_a_job_that_failed_after_a_second_has_an_axis_of_that_second_and_says_no_sample_was_kept(
    alice, teams, node
):
    job = _ran(alice, teams, node, gpus=1, seconds=1, state="failed")
    page = " ".join(html.unescape(_page(alice, f"/jobs/{job.pk}/")).split())
    util = _chart(page, "chart-job-util_pct")
    assert util is None or util["x"]["max"] - util["x"]["min"] == pytest.approx(1)
    assert "It ran 1 s, and no sample of its GPUs was kept" in page
    # A window the recorder wrote in that second is drawn within it, not over years.
    _windows(node, indexes=(0,), since=job.started_at, until=job.finished_at, util=3.0, memory_mib=1024)
    util = _chart(_page(alice, f"/jobs/{job.pk}/"), "chart-job-util_pct")
    assert util["x"]["max"] - util["x"]["min"] == pytest.approx(1)
    assert all(util["x"]["min"] <= t <= util["x"]["max"] for t in util["t"])


def test_a_running_jobs_axis_starts_at_its_start_and_runs_to_now(alice, teams, node):
    from tests.portal.test_pages import _running_on_a_whole_card

    job = job_submit(
        submitter=alice, team=teams["training"], spec=JobSpec(name="runs", command="python run.py", gpus=1)
    )
    job = _running_on_a_whole_card(job, node)
    job.refresh_from_db()
    util = _chart(_page(alice, f"/jobs/{job.pk}/"), "chart-job-util_pct")
    assert util["x"] == {"min": job.started_at.timestamp(), "max": None}  # None: now, as it runs
    assert [s["label"] for s in util["series"]] == ["a100-01 GPU 0"]


def test_a_node_pages_charts_name_each_gpu_hide_lines_together_and_draw_memory_up_to_the_card(alice, node):
    now = datetime.now(UTC)
    _windows(node, indexes=range(8), since=now - timedelta(minutes=30), until=now, util=50.0, memory_mib=8192)
    page = _page(alice, f"/cluster/{node.name}/?window=1h")
    memory = _chart(page, "chart-node-memory_used_gib")
    util = _chart(page, "chart-node-util_pct")
    assert [s["label"] for s in memory["series"]] == [f"GPU {i}" for i in range(8)]
    assert memory["y"]["max"] == 80 and util["y"]["max"] == 100
    # One key for the page's charts: a GPU hidden in one legend is hidden in every chart.
    assert memory["sync"] == util["sync"] == f"node-{node.name}"
    assert "Click a GPU in a legend to hide or show its line" in html.unescape(page)
