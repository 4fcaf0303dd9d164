"""Writes for notifications. A job's state change and an admin event each write outbox rows in the transaction
that made them (cheap inserts); delivery happens after commit, in a Celery task (or the embedded loop), never
in the scheduling cycle, and is retried with backoff: 30 s, 1, 2, 4 ... minutes, up to MAX_ATTEMPTS."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import send_mail
from django.db import connection, transaction
from django.utils import timezone

from scheduling.choices import JobState
from scheduling.errors import ServiceError
from scheduling.notifications.models import ADMIN_EVENTS, JOB_EVENTS, Notification, NotificationSettings
from scheduling.notifications.webhooks import WebhookRefused, webhook_post, webhook_url_check

log = logging.getLogger(__name__)

DELIVER_TASK = "scheduling.tasks.notification_deliver_task"
MAX_ATTEMPTS = 8
FIRST_RETRY_S = 30
MAX_RETRY_S = 3600
WEBHOOK_TIMEOUT_S = 5.0
MAX_EVENT_WORDS = 8

# A job state -> the event its owner may ask to hear of (sbatch --mail-type's BEGIN, END, FAIL, and preemption).
EVENT_OF_STATE = {
    JobState.RUNNING: "start",
    JobState.SUCCEEDED: "end",
    JobState.CANCELLED: "end",
    JobState.FAILED: "fail",
    JobState.LOST: "fail",
    JobState.PREEMPTED: "preempt",
}


def parse_events(value: Any, *, field: str = "notify", allowed: tuple[str, ...] = JOB_EVENTS) -> list[str]:
    """ "start,end" or ["start", "end"] (also "all" and "none"; "" is none) into the events, in a fixed order; an
    unknown word is refused, naming it. Words as written: lower case, spaces around commas allowed."""
    if value is None:
        return []
    if isinstance(value, str):
        words = [] if not value.strip(" ") else [w.strip(" ") for w in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(w, str) for w in value):
        words = list(value)
    else:
        raise ServiceError(f"{field} is a comma list of {', '.join(allowed)} (or all, none).", field=field)
    if len(words) > MAX_EVENT_WORDS:
        raise ServiceError(
            f"{field} names at most {MAX_EVENT_WORDS} events.", field=field, limit=str(MAX_EVENT_WORDS)
        )
    chosen: set[str] = set()
    for word in words:
        if word == "none":
            continue
        if word == "all":
            chosen.update(allowed)
        elif word in allowed:
            chosen.add(word)
        else:
            raise ServiceError(
                f"{field}: unknown event {word[:30]!r}; use {', '.join(allowed)}, all or none.", field=field
            )
    return [e for e in allowed if e in chosen]


def settings_of(user: AbstractBaseUser) -> NotificationSettings:
    found = NotificationSettings.objects.filter(user=user).first()
    return found or NotificationSettings(user=user)


def notification_settings_save(
    *, user: AbstractBaseUser, job_events: Any, email: bool, webhook_url: str, admin_events: Any = None
) -> NotificationSettings:
    """A user's defaults. The webhook must be one the site lets the server call (notifications.webhooks)."""
    url = webhook_url_check(webhook_url)
    found = settings_of(user)
    found.job_events = parse_events(job_events, field="job_events")
    found.email = bool(email)
    found.webhook_url = url
    if admin_events is not None:
        found.admin_events = parse_events(admin_events, field="admin_events", allowed=ADMIN_EVENTS)
    found.save()
    return found


def _deliver_after_commit(ids: list[int]) -> None:
    if not ids or settings.CELERY_TASK_ALWAYS_EAGER:
        return  # embedded: the demo loop delivers what is due, off the request and the cycle

    def send() -> None:
        for pk in ids:
            try:
                current_app.send_task(DELIVER_TASK, args=[pk])
            except Exception as exc:  # the periodic sweep delivers it later
                log.warning("notification %s not queued: %s", pk, exc)

    transaction.on_commit(send)


def _messages_for(
    user: AbstractBaseUser, kind: str, subject: str, body: str, job_id: int | None
) -> list[Notification]:
    prefs = settings_of(user)
    targets = []
    if prefs.email and getattr(user, "email", ""):
        targets.append((Notification.EMAIL, user.email))
    if prefs.webhook_url:
        targets.append((Notification.WEBHOOK, prefs.webhook_url))
    now = timezone.now()
    return [
        Notification(
            user=user,
            job_id=job_id,
            kind=kind,
            channel=channel,
            target=target,
            subject=subject,
            body=body,
            next_attempt_at=now,
        )
        for channel, target in targets
    ]


def job_events_wanted(*, user_ids: Iterable[int]) -> dict[int, list[str]]:
    """Each user's default job events (what they saved, or the default), read at once: for writes of many jobs'
    changes, where settings_of per job was a query each."""
    wanted = {user_id: list(NotificationSettings().job_events) for user_id in user_ids}
    for user_id, events in NotificationSettings.objects.filter(user_id__in=list(wanted)).values_list(
        "user_id", "job_events"
    ):
        wanted[user_id] = events
    return wanted


def job_state_notify(
    *,
    job,
    from_state: str,
    to_state: str,
    message: str = "",
    defaults: dict[int, list[str]] | None = None,
    always: bool = False,
) -> list[Notification]:
    """Called by job_transition: the owner's notifications for this change, if they asked for its event (or
    `always`). `defaults`: job_events_wanted of the submitter, when the caller has read it already."""
    kind = EVENT_OF_STATE.get(to_state)
    if kind is None:
        return []
    if job.notify is not None:
        wanted = job.notify
    elif defaults is not None and job.submitter_id in defaults:
        wanted = defaults[job.submitter_id]
    else:
        wanted = settings_of(job.submitter).job_events
    wanted = wanted or []
    array_counts = None
    if job.array_job_id is not None:
        if not always and not ({kind, "end", "fail"} if kind in ("end", "fail") else {kind}) & set(wanted):
            return []  # asked for nothing this could tell: no query
        said = _array_moment(job, kind)
        if said is None:
            return []
        kind, array_counts = said
        if kind == "fail" and "fail" not in wanted and not always:
            kind = "end"  # the array ended, some of it failed: told as its end, with the counts
    if kind not in wanted and not always:
        return []
    words = {"start": "started", "end": to_state, "fail": to_state, "preempt": "was preempted"}[kind]
    subject = f"[Tessera] job {job.pk} {job.name} {words}"
    shown = job.pk if array_counts is None else job.array_job_id
    url = (
        f"{settings.TESSERA_PUBLIC_URL.rstrip('/')}/jobs/{shown}/"
        if settings.TESSERA_PUBLIC_URL
        else f"/jobs/{shown}/"
    )
    body = (
        f"Job {job.pk} ({job.name}, {job.team.slug}) went from {from_state} to {to_state}.\n{message}\n{url}"
    )
    if array_counts is not None:
        counted = ", ".join(
            f"{n:,} {state}" for state, n in sorted(array_counts.items(), key=lambda kv: -kv[1])
        )
        if kind == "start":
            subject = f"[Tessera] array {job.array_job_id} {job.name} started"
            body = f"Array {job.array_job_id} ({job.name}, {job.team.slug}): its first task started.\n{url}"
        else:
            subject = f"[Tessera] array {job.array_job_id} {job.name} ended: {counted}"
            body = f"Array {job.array_job_id} ({job.name}, {job.team.slug}) ended: {counted}.\n{url}"
    rows = Notification.objects.bulk_create(_messages_for(job.submitter, kind, subject, body.strip(), job.pk))
    _deliver_after_commit([r.pk for r in rows])
    return rows


def _array_moment(job, kind: str) -> tuple[str, dict[str, int]] | None:
    """An array tells its owner as one job, as Slurm mails by default: when its first task starts, and when its
    last task ends ("fail" if any task failed, with the counts by state); never task by task, and never of a
    task's preemption (it is requeued). None: this change of a task says nothing."""
    if kind in ("end", "fail") and job.state == JobState.LOST:
        return None  # a lost task goes back to the queue (or fails later): not its end
    _array_lock(job.array_job_id)
    rows = type(job).objects.filter(array_job_id=job.array_job_id)
    others = rows.exclude(pk=job.pk)
    if kind == "start":
        # Tasks started together (one batch: the same started_at) tell once, by the caller's choice.
        started = job.started_at or timezone.now()
        return None if others.filter(started_at__lt=started).exists() else ("start", {})
    if kind not in ("end", "fail"):
        return None
    live = others.filter(array_task_id__isnull=False).exclude(state__in=_ENDED)
    if live.exists() or rows.filter(pk=job.array_job_id).exclude(array_pending="").exists():
        return None
    counts: dict[str, int] = {}
    for state in rows.filter(array_task_id__isnull=False).values_list("state", flat=True):
        counts[state] = counts.get(state, 0) + 1
    never_placed = (job.array_task_count or 0) - sum(counts.values())
    if never_placed > 0:  # ended with the array's row before they were placed: cancelled, or failed with it
        ended_as = (
            job.state if job.pk == job.array_job_id and job.array_task_id is None else JobState.CANCELLED
        )
        counts[ended_as] = counts.get(ended_as, 0) + never_placed
    failed = counts.get(JobState.FAILED, 0) + counts.get(JobState.LOST, 0)
    return ("fail" if failed else "end"), counts


_ENDED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
# The key class of the advisory lock two tasks of one array take before deciding which of them tells its owner.
_ARRAY_NOTIFY_LOCK = 7101


def _array_lock(array_id: int) -> None:
    """Two tasks of one array ending at once (two nodes' reports) decide in turn whether theirs is the array's
    end: the second sees the first committed, so exactly one tells. (PostgreSQL; SQLite writes one at a time.)
    An advisory lock, not the array's row: the cycle holds that row while it locks task rows, the other way
    round."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_ARRAY_NOTIFY_LOCK, array_id])


def admin_notify(*, kind: str, subject: str, body: str) -> list[Notification]:
    """A cluster event for staff who want it (node_lost, gpu_xid), and the site's admin webhook if set."""
    staff = get_user_model().objects.filter(is_staff=True, is_active=True)
    rows: list[Notification] = []
    for user in staff:
        if kind in settings_of(user).admin_events:
            rows += _messages_for(user, kind, f"[Tessera] {subject}", body, None)
    if settings.TESSERA_NOTIFY_ADMIN_WEBHOOK_URL:
        rows.append(
            Notification(
                kind=kind,
                channel=Notification.WEBHOOK,
                target=settings.TESSERA_NOTIFY_ADMIN_WEBHOOK_URL,
                subject=f"[Tessera] {subject}",
                body=body,
                next_attempt_at=timezone.now(),
            )
        )
    rows = Notification.objects.bulk_create(rows)
    _deliver_after_commit([r.pk for r in rows])
    return rows


def _send(n: Notification) -> None:
    if n.channel == Notification.EMAIL:
        send_mail(n.subject, n.body, settings.DEFAULT_FROM_EMAIL, [n.target], fail_silently=False)
        return
    payload = {"text": f"*{n.subject}*\n{n.body}", "tessera": {"kind": n.kind, "job_id": n.job_id}}
    # A user's webhook is checked again now; the site's own (no user: TESSERA_NOTIFY_ADMIN_WEBHOOK_URL) is the
    # operator's choice.
    status = webhook_post(
        url=n.target, payload=payload, timeout_s=WEBHOOK_TIMEOUT_S, checked=n.user_id is not None
    )
    if 300 <= status < 400:
        raise RuntimeError(f"the webhook answered {status}, a redirect, which is not followed")
    if not 200 <= status < 300:
        raise RuntimeError(f"the webhook answered {status}")


def notification_deliver(*, notification_id: int) -> bool:
    """Send one notification if still due; on failure, schedule the next attempt (or give up after the last).
    Safe to run twice at once: the row is taken with SKIP LOCKED."""
    with transaction.atomic():
        n = (
            Notification.objects.select_for_update(skip_locked=True)
            .filter(pk=notification_id, sent_at__isnull=True, failed_at__isnull=True)
            .first()
        )
        if n is None:
            return False
        n.attempts += 1
        try:
            _send(n)
        except Exception as exc:  # noqa: BLE001 - any failure is retried, and said
            n.last_error = f"{type(exc).__name__}: {exc}"[:300]
            if isinstance(exc, WebhookRefused) or n.attempts >= MAX_ATTEMPTS:
                n.failed_at = timezone.now()
                log.warning("notification %s given up after %s attempts: %s", n.pk, n.attempts, n.last_error)
            else:
                delay = min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** (n.attempts - 1))
                n.next_attempt_at = timezone.now() + timedelta(seconds=delay)
            n.save(update_fields=["attempts", "last_error", "failed_at", "next_attempt_at"])
            return False
        n.sent_at = timezone.now()
        n.last_error = ""
        n.save(update_fields=["attempts", "sent_at", "last_error"])
        return True


def notifications_deliver_due(*, limit: int = 100) -> int:
    """Deliver what is due (first sends the queue missed, and retries). Returns how many went."""
    due: Iterable[int] = (
        Notification.objects.filter(
            sent_at__isnull=True, failed_at__isnull=True, next_attempt_at__lte=timezone.now()
        )
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(notification_deliver(notification_id=pk) for pk in list(due))


def job_idle_notify(*, job, subject: str, body: str) -> list[Notification]:
    """The owner told that their job's GPUs sit idle and will be given back (always: it is about to act on their
    job, whatever events they asked for)."""
    url = (
        f"{settings.TESSERA_PUBLIC_URL.rstrip('/')}/jobs/{job.pk}/"
        if settings.TESSERA_PUBLIC_URL
        else f"/jobs/{job.pk}/"
    )
    rows = Notification.objects.bulk_create(
        _messages_for(job.submitter, "idle", f"[Tessera] {subject}", f"{body}\n{url}", job.pk)
    )
    _deliver_after_commit([r.pk for r in rows])
    return rows
