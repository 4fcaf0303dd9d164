"""Reads for teams and quotas: who belongs where, and what each team is guaranteed."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from quotas.choices import Role
from quotas.models import IdempotencyRecord, Membership, PriorityClass, Quota, Team
from quotas.rows import fetch_rows, model_from_row


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


def team_by_slug(*, slug: str) -> Team | None:
    """The team with this slug. Every submit looks one up, so it is one hand-written query, not the ORM's."""
    fields = Team._meta.concrete_fields
    rows = fetch_rows(
        f"SELECT {', '.join(f.column for f in fields)} FROM {Team._meta.db_table} WHERE slug = %s", [slug]
    )
    return model_from_row(Team, fields, rows[0]) if rows else None


def team_slugs_for_user(*, user: AbstractBaseUser, limit: int) -> list[str]:
    return list(Membership.objects.filter(user=user).values_list("team__slug", flat=True)[:limit])


def idempotency_record_for(*, user: AbstractBaseUser, key: str) -> IdempotencyRecord | None:
    return IdempotencyRecord.objects.filter(user=user, key=key).first()


def team_slugs_visible_to(*, user: AbstractBaseUser, all_teams: bool = False) -> list[str]:
    """Slugs of the teams a user may pick (to submit to, to filter by): their own; staff, every team. With
    `all_teams`, every team that runs work (the queue names every team, anonymous or not)."""
    if user.is_staff or all_teams:
        # Teams that run work: the leaves of the tree (an org like ai-lab holds teams, not jobs).
        teams = Team.objects.filter(children__isnull=True)
        return list(teams.order_by("slug").values_list("slug", flat=True))
    return sorted(Membership.objects.filter(user=user).values_list("team__slug", flat=True))
