"""Notifications as `sbatch --mail-type` users expect: a job names the events its owner hears of (or takes their
default); the messages are written with the change and sent after it commits, by email and to a real local
webhook; a webhook that fails is retried with backoff and never fails the change; admins hear of a lost node."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from scheduling.choices import ActorKind, JobState
from scheduling.errors import ServiceError
from scheduling.inventory.models import Gpu, Node
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.ledger import slice_allocate
from scheduling.jobs.models import Job
from scheduling.jobs.spec import spec_from_mapping
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_transition
from scheduling.notifications.models import Notification
from scheduling.notifications.services import (
    notification_settings_save,
    notifications_deliver_due,
    parse_events,
)
from tests.support import RecordingHttpServer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def loopback_webhooks_allowed(settings):
    """The tests' webhook listens on this host, which webhooks may reach only when the site's allow-list says so
    (tests/security/test_webhooks.py tries the refusals)."""
    settings.TESSERA_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]


@pytest.fixture
def hook():
    h = RecordingHttpServer()
    yield h
    h.close()


def _run(job, node, index=0):
    gpu = Gpu.objects.get(node=node, index=index)
    job_transition(job=job, to_state=JobState.PLACED, actor_kind=ActorKind.SCHEDULER)
    slice_allocate(job=job, gpu=gpu, memory_mib=gpu.memory_mib, compute_pct=100)
    return job_transition(job=job, to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)


def _submit(user, team, **spec):
    return job_submit(
        submitter=user,
        team=team,
        spec=JobSpec(name="train", command="python train.py", gpus=1, **spec),
    )


def test_a_job_asking_for_start_and_fail_tells_its_owner_by_email_and_webhook(alice, teams, node, hook):
    alice.email = "alice@example.org"
    alice.save()
    notification_settings_save(user=alice, job_events=[], email=True, webhook_url=hook.url)
    job = _submit(alice, teams["training"], notify=("start", "fail"))
    _run(job, node)
    job_transition(job=job, to_state=JobState.FAILED, actor_kind=ActorKind.AGENT, message="exit 1")
    assert notifications_deliver_due() == 4  # start and fail, each by email and webhook
    assert [m.subject for m in mail.outbox] == [
        f"[Tessera] job {job.pk} train started",
        f"[Tessera] job {job.pk} train failed",
    ]
    assert mail.outbox[0].to == ["alice@example.org"]
    assert [m["tessera"]["kind"] for m in hook.received] == ["start", "fail"]
    assert "exit 1" in hook.received[1]["text"]


def test_without_a_choice_the_owners_default_holds_and_nothing_by_default(alice, teams, node):
    alice.email = "alice@example.org"
    alice.save()
    _run(_submit(alice, teams["training"]), node)
    assert not Notification.objects.exists()  # no default chosen: nothing
    notification_settings_save(user=alice, job_events="end", email=True, webhook_url="")
    job = _submit(alice, teams["training"])
    _run(job, node, index=1)
    job_transition(job=job, to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    assert list(Notification.objects.values_list("kind", flat=True)) == ["end"]


def test_a_failing_webhook_is_retried_with_backoff_and_never_fails_the_change(alice, teams, node):
    broken = RecordingHttpServer(status=500)
    try:
        notification_settings_save(user=alice, job_events="start", email=False, webhook_url=broken.url)
        job = _run(_submit(alice, teams["training"]), node)
        assert job.state == JobState.RUNNING  # the change went through
        assert notifications_deliver_due() == 0
        n = Notification.objects.get()
        assert n.attempts == 1 and "500" in n.last_error and n.sent_at is None
        first_wait = (n.next_attempt_at - timezone.now()).total_seconds()
        Notification.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))
        notifications_deliver_due()
        n.refresh_from_db()
        assert n.attempts == 2
        assert (n.next_attempt_at - timezone.now()).total_seconds() > first_wait + 20  # 30 s, then 60 s
        broken.status = 200
        Notification.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))
        assert notifications_deliver_due() == 1 and len(broken.received) == 3
    finally:
        broken.close()


def test_admins_hear_of_a_lost_node(admin_user, node):
    from scheduling.cycle.watchdog import node_mark_lost

    admin_user.email = "ops@example.org"
    admin_user.save()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    node_mark_lost(node_id=node.pk)
    notifications_deliver_due()
    assert [m.subject for m in mail.outbox] == ["[Tessera] node a100-01 lost"]


def test_bad_events_and_webhooks_are_refused_naming_the_field(alice, teams):
    with pytest.raises(ServiceError, match="unknown event 'begin'") as refused:
        parse_events("start,begin")
    assert refused.value.field == "notify"
    assert parse_events("all") == ["start", "end", "fail", "preempt"] and parse_events("none") == []
    with pytest.raises(ServiceError) as spec_refused:
        spec_from_mapping({"name": "x", "command": "true", "gpus": 1, "notify": "START"})
    assert spec_refused.value.field == "notify"
    assert spec_from_mapping(
        {"name": "x", "command": "true", "gpus": 1, "notify": "end, fail"}
    ).spec.notify == (
        "end",
        "fail",
    )
    client = Client()
    client.force_login(alice)
    bad = client.put(
        "/api/v1/notifications/",
        {"job_events": ["start"], "email": True, "webhook_url": "ftp://x"},
        content_type="application/json",
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "webhook_url"
    good = client.put(
        "/api/v1/notifications/",
        {"job_events": ["end"], "email": False, "webhook_url": ""},
        content_type="application/json",
    )
    assert good.status_code == 200 and client.get("/api/v1/notifications/").json()["job_events"] == ["end"]


def test_the_api_and_the_cli_take_notify_with_the_job(alice, teams, node):
    import subprocess
    import sys

    client = Client()
    client.force_login(alice)
    made = client.post(
        "/api/v1/jobs/",
        {"name": "n", "command": "true", "gpus": 1, "team": "ai-lab/training", "notify": "end,fail"},
        content_type="application/json",
    )
    assert made.status_code == 201, made.content
    job_id = made.json()["id"]
    assert Job.objects.get(pk=job_id).notify == ["end", "fail"]
    assert client.get(f"/api/v1/jobs/{job_id}/").json()["notify"] == ["end", "fail"]
    dry = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "submit",
            "--dry-run",
            "-G",
            "1",
            "--notify",
            "start",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert '"notify": "start"' in dry.stdout or "notify: start" in dry.stdout, dry.stdout + dry.stderr


def test_an_array_tells_its_owner_once_when_it_starts_and_once_when_it_ends(alice, teams, node):
    """As Slurm mails for an array by default: not once per task. Its end says how its tasks ended."""
    from scheduling.cycle.runner import cycle_run_once
    from scheduling.jobs.batches import StartWrite, jobs_start

    alice.email = "alice@example.org"
    alice.save()
    notification_settings_save(user=alice, job_events=[], email=True, webhook_url="")
    array = _submit(alice, teams["training"], notify=("start", "end"), array="0-3")
    cycle_run_once()  # the node's 8 cards: all four tasks placed
    tasks = list(Job.objects.filter(array_job_id=array.pk).order_by("array_task_id"))
    assert [t.state for t in tasks] == ["placed"] * 4
    jobs_start(starts=[StartWrite(job=t, message="Started.", data={}) for t in tasks[:3]])  # three at once
    job_transition(job=Job.objects.get(pk=tasks[3].pk), to_state=JobState.RUNNING, actor_kind=ActorKind.AGENT)
    for t in tasks[:3]:
        job_transition(job=Job.objects.get(pk=t.pk), to_state=JobState.SUCCEEDED, actor_kind=ActorKind.AGENT)
    job_transition(job=Job.objects.get(pk=tasks[3].pk), to_state=JobState.FAILED, actor_kind=ActorKind.AGENT)
    notifications_deliver_due()
    assert [m.subject for m in mail.outbox] == [
        f"[Tessera] array {array.pk} train started",
        f"[Tessera] array {array.pk} train ended: 3 succeeded, 1 failed",
    ]
    assert f"/jobs/{array.pk}/" in mail.outbox[1].body
