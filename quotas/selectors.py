"""Reads for teams and quotas: who belongs where, and what each team is guaranteed."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from quotas.choices import Role
from quotas.models import Membership, PriorityClass, Quota, QuotaChange, Team


def teams_for_user(*, user: AbstractBaseUser) -> QuerySet[Team]:
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


def team_ids_for_user(*, user: AbstractBaseUser) -> set[int]:
    return set(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def team_ids_administered_by(*, user: AbstractBaseUser) -> set[int]:
    return set(Membership.objects.filter(user=user, role=Role.TEAM_ADMIN).values_list("team_id", flat=True))


def user_is_member(*, user: AbstractBaseUser, team: Team) -> bool:
    return Membership.objects.filter(user=user, team=team).exists()


def quotas_all() -> QuerySet[Quota]:
    return Quota.objects.select_related("team", "gpu_model", "default_priority_class")


def quota_changes_for_team(*, team: Team) -> QuerySet[QuotaChange]:
    return QuotaChange.objects.filter(team=team).select_related("actor")


def priority_class_default_for_team(*, team: Team) -> PriorityClass | None:
    quota = (
        Quota.objects.filter(team=team, gpu_model__isnull=True)
        .select_related("default_priority_class")
        .first()
    )
    if quota and quota.default_priority_class:
        return quota.default_priority_class
    return PriorityClass.objects.order_by("value").first()
