"""Writes for teams, memberships, priority classes and quotas. Every quota change, and every change to the
priority classes a team is granted, leaves a QuotaChange."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from quotas.choices import ChangeSource, Role
from quotas.models import (
    IdempotencyRecord,
    Membership,
    PriorityClass,
    Quota,
    QuotaChange,
    Team,
    TeamPriorityClass,
)

QUOTA_AUDITED_FIELDS = (
    "gpu_model",
    "guaranteed_gpu_memory_mib",
    "limit_gpu_memory_mib",
    "guaranteed_gpus",
    "limit_gpus",
    "fair_share_weight",
    "default_priority_class",
)
GRANT_AUDITED_FIELDS = ("priority_class", "limit_gpus")


@dataclass(frozen=True)
class DefaultPriorityClass:
    name: str
    value: int
    preemptible: bool
    preemption_grace_s: int
    open_to_all_teams: bool
    description: str


# A class that preempts everyone and is never preempted is granted team by team; the others are open to all.
DEFAULT_PRIORITY_CLASSES = (
    DefaultPriorityClass(
        "inference", 50, True, 30, True, "Light, latency-tolerant serving and evaluation jobs."
    ),
    DefaultPriorityClass("training", 100, True, 120, True, "Training runs; may preempt inference."),
    DefaultPriorityClass(
        "critical", 1000, False, 300, False, "Never preempted. For deadlines and production serving."
    ),
)


def priority_classes_ensure_defaults() -> list[PriorityClass]:
    """Create the default priority classes that do not exist yet; leave edited ones alone."""
    created = []
    for default in DEFAULT_PRIORITY_CLASSES:
        pc, _ = PriorityClass.objects.get_or_create(
            name=default.name,
            defaults={
                "value": default.value,
                "preemptible": default.preemptible,
                "preemption_grace_s": default.preemption_grace_s,
                "open_to_all_teams": default.open_to_all_teams,
                "description": default.description,
            },
        )
        created.append(pc)
    return created


def team_create(*, slug: str, display_name: str = "", parent: Team | None = None) -> Team:
    team = Team(slug=slug, display_name=display_name or slug, parent=parent)
    team.full_clean()
    team.save()
    return team


def membership_set(*, user: AbstractBaseUser, team: Team, role: str = Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
    return membership


def _audit_value(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, Decimal):
        # 10.000 -> "10", 2.500 -> "2.5": as typed, whatever the column's scale (str() gives "1E+1" for 10).
        return f"{value.normalize():f}"
    if hasattr(value, "pk"):
        return str(value)
    return value


def _quota_values(quota: Quota) -> dict[str, Any]:
    return {name: _audit_value(getattr(quota, name)) for name in QUOTA_AUDITED_FIELDS}


@transaction.atomic
def quota_save(
    *,
    quota: Quota,
    actor: AbstractBaseUser | None,
    source: str = ChangeSource.ADMIN,
    note: str = "",
) -> QuotaChange | None:
    """Validate and save a new or edited quota, recording what changed. Returns None when nothing changed.

    The caller passes the quota with its new values set; the stored row gives the old ones.
    """
    quota.full_clean()
    if quota.pk:
        before = Quota.objects.select_for_update().get(pk=quota.pk)
        old = _quota_values(before)
    else:
        old = dict.fromkeys(QUOTA_AUDITED_FIELDS)
    new = _quota_values(quota)
    changes = {
        name: {"old": old[name], "new": new[name]} for name in QUOTA_AUDITED_FIELDS if old[name] != new[name]
    }
    quota.save()
    if not changes:
        return None
    return QuotaChange.objects.create(
        team=quota.team, quota=quota, actor=actor, source=source, changes=changes, note=note
    )


@transaction.atomic
def quota_delete(
    *, quota: Quota, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN
) -> QuotaChange:
    old = _quota_values(quota)
    change = QuotaChange.objects.create(
        team=quota.team,
        quota=None,
        actor=actor,
        source=source,
        changes={name: {"old": value, "new": None} for name, value in old.items() if value is not None},
        note="quota deleted",
    )
    quota.delete()
    return change


def _grant_values(grant: TeamPriorityClass) -> dict[str, Any]:
    return {name: _audit_value(getattr(grant, name)) for name in GRANT_AUDITED_FIELDS}


@transaction.atomic
def priority_class_grant_save(
    *, grant: TeamPriorityClass, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN
) -> QuotaChange | None:
    """Validate and save a new or edited grant of a priority class to a team, recording what changed in the
    team's quota audit trail. Returns None when nothing changed."""
    grant.full_clean()
    if grant.pk:
        old = _grant_values(TeamPriorityClass.objects.select_for_update().get(pk=grant.pk))
    else:
        old = dict.fromkeys(GRANT_AUDITED_FIELDS)
    new = _grant_values(grant)
    changes = {
        name: {"old": old[name], "new": new[name]} for name in GRANT_AUDITED_FIELDS if old[name] != new[name]
    }
    grant.save()
    if not changes:
        return None
    return QuotaChange.objects.create(
        team=grant.team,
        actor=actor,
        source=source,
        changes=changes,
        note=f"priority class {grant.priority_class.name} granted",
    )


@transaction.atomic
def priority_class_grant_delete(
    *, grant: TeamPriorityClass, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN
) -> QuotaChange:
    old = _grant_values(grant)
    change = QuotaChange.objects.create(
        team=grant.team,
        actor=actor,
        source=source,
        changes={name: {"old": value, "new": None} for name, value in old.items() if value is not None},
        note=f"priority class {grant.priority_class.name} grant removed",
    )
    grant.delete()
    return change


def idempotency_record_create(
    *, user: AbstractBaseUser, key: str, request_hash: str, response_status: int, response_body: Any
) -> IdempotencyRecord:
    """Remember the response to a request made with an Idempotency-Key. The (user, key) unique constraint
    decides between two concurrent retries: the loser's IntegrityError rolls back its whole request."""
    return IdempotencyRecord.objects.create(
        user=user,
        key=key,
        request_hash=request_hash,
        response_status=response_status,
        response_body=response_body,
    )
