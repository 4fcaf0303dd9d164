"""The scheduler lease's fencing epochs: every cycle takes a new one, and only the newest may write, once."""

from __future__ import annotations

import os
import socket
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from scheduling import lock_objects
from scheduling.cycle.models import SchedulerLease


class StaleEpoch(Exception):
    """A cycle tried to write with an epoch a later cycle has superseded (or that was already applied)."""


def holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def epoch_issue(*, holder: str | None = None) -> int:
    """Start a cycle: take the next fencing epoch. Every later epoch makes this one stale."""
    with transaction.atomic():
        SchedulerLease.objects.get_or_create(pk=1)
        lease = lock_objects.scheduler_lease_for_update().get(pk=1)
        lease.issued_epoch += 1
        lease.holder = (holder or holder_name())[:200]
        lease.issued_at = timezone.now()
        lease.save(update_fields=["issued_epoch", "holder", "issued_at"])
        return lease.issued_epoch


def epoch_claim(epoch: int, *, full_pending: int | None = None) -> None:
    """Inside the apply transaction: lock the lease row and refuse unless `epoch` is the newest, unapplied one.
    `full_pending`, for a full cycle: the jobs it saw waiting (incremental passes follow it, runner.py)."""
    lease = lock_objects.scheduler_lease_for_update().filter(pk=1).first()
    if lease is None or lease.issued_epoch != epoch or lease.applied_epoch >= epoch:
        newest = lease.issued_epoch if lease else 0
        applied = lease.applied_epoch if lease else 0
        raise StaleEpoch(
            f"cycle epoch {epoch} is stale: the newest issued epoch is {newest}, the last applied {applied}"
        )
    lease.applied_epoch = epoch
    lease.applied_at = timezone.now()
    fields = ["applied_epoch", "applied_at"]
    if full_pending is not None:
        lease.full_applied_at, lease.full_pending = lease.applied_at, full_pending
        fields += ["full_applied_at", "full_pending"]
    lease.save(update_fields=fields)


def last_full_cycle() -> tuple[datetime | None, int]:
    """When the last full cycle was applied (None: never), and how many jobs it saw waiting."""
    row = SchedulerLease.objects.filter(pk=1).values_list("full_applied_at", "full_pending").first()
    return row if row is not None else (None, 0)
