"""Reads for teams and quotas: who belongs where, and what each team is guaranteed."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from quotas.choices import Role
from quotas.models import Membership, PriorityClass, Quota, Team


def team_ids_for_user(*, user: AbstractBaseUser) -> set[int]:
    return set(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def team_ids_administered_by(*, user: AbstractBaseUser) -> set[int]:
    return set(Membership.objects.filter(user=user, role=Role.TEAM_ADMIN).values_list("team_id", flat=True))


def priority_class_default_for_team(*, team: Team) -> PriorityClass | None:
    quota = (
        Quota.objects.filter(team=team, gpu_model__isnull=True)
        .select_related("default_priority_class")
        .first()
    )
    if quota and quota.default_priority_class:
        return quota.default_priority_class
    return PriorityClass.objects.order_by("value").first()
