"""The demo as a small living cluster whose numbers agree: its other teams keep submitting a mix from a seed as the
clock passes, and its generated past is jobs that ran, from which the team page, the chargeback, the usage API
(`tessera usage`) and the history page all count the same GPU-hours."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from demo.workload import DemoSubmitter, submissions
from scheduling.choices import ActorKind, JobState
from scheduling.cycle.runner import cycle_run_once
from scheduling.jobs.models import Job
from scheduling.jobs.transitions import job_transition

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)  # a Wednesday morning


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_same_seed_submits_the_same_mix_in_every_quarter_of_an_hour():
    hour = [submissions(seed=7, minute=T0 + timedelta(minutes=m), live=True) for m in range(60)]
    again = [submissions(seed=7, minute=T0 + timedelta(minutes=m), live=True) for m in range(60)]
    assert hour == again
    assert hour != [submissions(seed=8, minute=T0 + timedelta(minutes=m), live=True) for m in range(60)]
    for first in range(0, 60, 15):
        window = [s for minute in hour[first : first + 15] for s in minute]
        assert window, f"nothing submitted in minutes {first}-{first + 15}"
    jobs = [s for minute in hour for s in minute]
    assert {s.kind.user for s in jobs} <= {
        "bob",
        "carol",
        "dave",
    }  # alice's own work is whoever signs in as her
    assert any(s.kind.gpus == 0 for s in jobs) and any(
        s.kind.gpus == 1 for s in jobs
    )  # slices and single cards
    day = [
        s for m in range(24 * 60) for s in submissions(seed=7, minute=T0 + timedelta(minutes=m), live=True)
    ]
    assert any(s.kind.gpus >= 4 for s in day)  # a multi-GPU training now and then


def _agents_step(minute: int, started: dict[int, int]) -> None:
    """What the simulated agents do, at a simulated minute: start what was placed, end what has run its time."""
    for job in Job.objects.filter(state=JobState.PLACED):
        job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT, code="started")
        started[job.pk] = minute
    for job in Job.objects.filter(state=JobState.RUNNING, pk__in=started):
        steps = int(job.env.get("TESSERA_DEMO_STEPS", 10**6))
        if (minute - started[job.pk]) * 60 >= steps * 5:
            job_transition(
                job=job,
                to_state=JobState.SUCCEEDED,
                actor_kind=ActorKind.AGENT,
                code="exited",
                data={"exit_code": 0},
            )


@pytest.mark.django_db
@pytest.mark.timeout(240, func_only=True)  # about 40 s on a loaded machine
def test_after_an_hour_other_teams_still_have_work_running_and_waiting():
    from demo.seed import load_demo

    load_demo(history_days=0)
    other = ["ai-lab/inference", "ai-lab/research"]
    submitter, started = DemoSubmitter(seed=7), {}
    running, waiting, submitted = [], [], []
    for minute in range(0, 61):
        submitted.append(submitter.step(now=T0 + timedelta(minutes=minute)))
        cycle_run_once()
        _agents_step(minute, started)
        theirs = Job.objects.filter(team__slug__in=other)
        running.append(theirs.filter(state=JobState.RUNNING).count())
        waiting.append(theirs.filter(state=JobState.PENDING).count())
    assert running[1] and running[30] and running[60], running
    assert max(waiting) > 0 and min(waiting[30:]) < max(waiting[30:]), waiting  # a queue that rises and falls
    assert (
        sum(submitted[45:]) > 0
        and Job.objects.filter(team__slug__in=other, state=JobState.SUCCEEDED).exists()
    )
    # The seeded 2 x 2 GPU training of alice's team started at once, beside its running finetune.
    gang = Job.objects.get(name="llama-pretrain-7b")
    assert gang.started_at is not None and started[gang.pk] == 0


def _chart(page: str, element_id: str) -> dict:
    start = page.index(f'<script id="{element_id}" type="application/json">')
    start = page.index(">", start) + 1
    return json.loads(page[start : page.index("</script>", start)])


def _as_text(response) -> str:
    """A page, its team names as text (team_name wraps each to break after its '/' only)."""
    return re.sub(r'<span class="nowrap">([^<]*)</span>(<wbr>)?', r"\1", response.content.decode())


def _number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.django_db
def test_the_team_page_chargeback_usage_api_and_history_count_the_same_gpu_hours(admin_user):
    from django.contrib.auth import get_user_model

    from demo.seed import load_demo

    load_demo(history_days=1)
    alice = get_user_model().objects.get(username="alice")
    client = _signed_in(alice)
    # Read as text: a team's name is wrapped to break after its '/' only (frontend team_name).
    team = re.sub(
        r'<span class="nowrap">|</span>|<wbr>',
        "",
        client.get("/teams/ai-lab/training/?window=7d").content.decode(),
    )
    members = {
        who: _number(hours)
        for who, hours in re.findall(r"<tr><td>(\w+)</td><td>[^<]*</td><td>([\d.,]+)</td>", team)
    }
    chargeback = [
        (who, model, _number(hours))
        for who, model, hours in re.findall(
            r"<tr><td>ai-lab/training</td><td>(\w+)</td><td>([^<]*)</td><td>([\d.,]+)</td>", team
        )
    ]
    assert chargeback and {model for _, model, _ in chargeback} <= {"A100-80GB", "H100-80GB", "T4"}
    api = _signed_in(alice).get("/api/v1/usage/?team=ai-lab/training&group_by=user").json()
    api = api["results"] if isinstance(api, dict) else api
    for who, hours in members.items():
        charged = sum(h for w, _, h in chargeback if w == who)  # over its GPU models
        from_api = sum(r["gpu_hours"] for r in api if r["user"] == who)
        assert hours == pytest.approx(charged, abs=0.02) == pytest.approx(from_api, abs=0.02), who
    assert sum(members.values()) > 10  # a day of generated work, not a few seconds of the seeded jobs
    history = _as_text(client.get("/history/?window=7d"))
    total = sum(h for _, _, h in chargeback)
    shown = re.search(r"<td>ai-lab/training</td><td class=\"num\">([\d.,]+)</td>", history)
    assert shown and _number(shown.group(1)) == pytest.approx(total, abs=0.1), (shown, total)
    # History's count of jobs started, its queue-time chart and its GPU-hours come from the same jobs.
    week = datetime.now(UTC) - timedelta(days=7)
    started = Job.objects.filter(started_at__gte=week).count()
    assert f"<b>{started}</b><span>jobs started</span>" in history
    usage, waits = _chart(history, "chart-usage"), _chart(history, "chart-wait")
    assert usage["t"] == waits["t"]
    busy_days = [i for i in range(len(usage["t"])) if sum(s["values"][i] or 0 for s in usage["series"]) > 0.5]
    assert busy_days and all(waits["series"][0]["values"][i] is not None for i in busy_days)
    # The team's chart: what it held never above its limit, and the limit drawn beside it.
    series = {s["label"]: s["values"] for s in _chart(team, "team-chart")["series"]}
    held = [(h, limit) for h, limit in zip(series["held"], series["limit"], strict=True) if h is not None]
    assert held and all(h <= limit + 1e-6 for h, limit in held)


@pytest.mark.django_db
def test_slice_jobs_that_ended_are_charged_to_the_model_of_the_cards_they_held():
    from django.contrib.auth import get_user_model

    from demo.seed import load_demo
    from scheduling.jobs.ledger import job_release_slices

    load_demo(history_days=0)
    for job in Job.objects.filter(name__startswith="llm-serve-", state=JobState.RUNNING):
        job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT, code="exited")
        job_release_slices(
            job=job
        )  # the cards are given back: only the placement's record says what they were
    bob = get_user_model().objects.get(username="bob")
    csv_text = _signed_in(bob).get("/teams/ai-lab/inference/chargeback.csv").content.decode()
    rows = [line.split(",") for line in csv_text.strip().splitlines()[1:]]
    assert rows and all(row[2] == "A100-80GB" for row in rows), csv_text
    page = _signed_in(bob).get("/teams/ai-lab/inference/").content.decode()
    assert "(not known)" not in page


@pytest.mark.django_db
def test_a_job_that_ran_past_a_ranges_end_is_charged_up_to_it(alice, teams, node):
    from scheduling.inventory.models import Gpu
    from scheduling.jobs.chargeback import usage_rows
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.models import JobEvent
    from scheduling.jobs.submit import job_submit

    gpu = Gpu.objects.filter(node=node).order_by("index").first()
    job = job_submit(submitter=alice, team=teams["training"], spec=JobSpec(name="t", command="x", gpus=1))
    placed = {"gpus": [[node.name, gpu.index, gpu.memory_mib, 1000]]}
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER, data=placed)
    job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    for to_state, at in [("placed", T0), ("running", T0), ("succeeded", T0 + timedelta(hours=2))]:
        JobEvent.objects.filter(job=job, to_state=to_state).update(at=at)
    Job.objects.filter(pk=job.pk).update(submitted_at=T0, finished_at=T0 + timedelta(hours=2))
    # A range ending while it ran (a day's chargeback, an hour's roll) counts it up to the range's end.
    rows = usage_rows(jobs=Job.objects.all(), since=T0, until=T0 + timedelta(hours=1), group_by=("user",))
    assert rows == [{"user": "alice", "gpu_hours": 1.0, "gpu_memory_gib_hours": 80.0, "jobs": 1}]
