"""Celery entry points of the scheduling app: the cycle, the node watchdog and preemption follow-ups. Thin:
each calls a service of the cycle room (`scheduling.cycle`) and is safe to run twice."""

from __future__ import annotations

from celery import shared_task

from scheduling.cycle import idle, requests, runner, watchdog
from scheduling.history import recorder
from scheduling.notifications import services as notifications


@shared_task(name=requests.RUN_CYCLE_TASK, ignore_result=True)
def run_cycle_task() -> dict:
    """Run the scheduling cycle if no one else is (see scheduling.cycle.runner.cycles_run_locked)."""
    return runner.cycles_run_locked()


@shared_task(ignore_result=True)
def cycle_tick() -> None:
    """The periodic cycle (beat): requests one like any writer would, so it coalesces with the rest."""
    requests.cycle_request()


@shared_task(ignore_result=True)
def node_watchdog_task() -> dict:
    """Declare silent nodes lost and requeue their jobs; finish preemptions whose agent never answered.

    Safe to run twice at once (two beats): every step re-checks its condition under row locks.
    """
    return watchdog.watchdog_run()


@shared_task(ignore_result=True)
def idle_check_task() -> dict:
    """Warn jobs whose GPUs sit idle, and give back the GPUs of those idle past their timeout."""
    return idle.idle_check()


@shared_task(ignore_result=True)
def history_record_task() -> bool:
    """This minute's history rows (a second run of the same minute writes nothing)."""
    return recorder.history_record()


@shared_task(ignore_result=True)
def history_usage_task() -> int:
    """The last two hours' GPU-seconds per team, user and model, and the queue times of the jobs started since
    the last roll, from the jobs' own records."""
    rows = recorder.usage_hours_roll()
    return rows + recorder.waits_roll()


@shared_task(ignore_result=True)
def history_maintain_task() -> dict:
    """The next days' partitions; history older than the retention period dropped."""
    return recorder.history_maintain()


@shared_task(name=notifications.DELIVER_TASK, ignore_result=True)
def notification_deliver_task(notification_id: int) -> bool:
    """Send one notification (queued after the commit that wrote it); a failure schedules its retry."""
    return notifications.notification_deliver(notification_id=notification_id)


@shared_task(ignore_result=True)
def notifications_due_task() -> int:
    """Retries that are due, and any first send the queue missed."""
    return notifications.notifications_deliver_due()
