"""Reads for teams and quotas: who belongs where, what each team is guaranteed, which priority classes it may
use."""

from __future__ import annotations

import fnmatch
import functools
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser

from portal.database import db_values, fetch_rows, model_from_row
from quotas.choices import Role
from quotas.models import (
    IdempotencyRecord,
    Membership,
    PriorityClass,
    Quota,
    Team,
    TeamMount,
    TeamPriorityClass,
)


def team_ids_for_user(*, user: AbstractBaseUser) -> set[int]:
    return set(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def team_visible_to(*, user: AbstractBaseUser, team: Team) -> bool:
    """Whether the user may see the team at all: staff, or one of its members. The API answers 404 for a team the
    user cannot see, never 403, so that team ids cannot be probed."""
    return bool(user.is_staff) or team.pk in team_ids_for_user(user=user)


def team_role_of(*, user: AbstractBaseUser, team_id: int) -> str | None:
    """The user's role in one team (None: not a member)."""
    return Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()


def team_ids_administered_by(*, user: AbstractBaseUser) -> set[int]:
    return set(Membership.objects.filter(user=user, role=Role.TEAM_ADMIN).values_list("team_id", flat=True))


@dataclass(frozen=True)
class ClassGrant:
    """A priority class a team may use, and the most GPUs it may hold at it at once (None: no per-class limit)."""

    priority_class: PriorityClass
    limit_gpus: Decimal | None


@dataclass(frozen=True)
class TeamAllowance:
    """What a team may ask of the scheduler: the priority classes it may use (with their per-class limits), the
    class its jobs get when they name none, and its limits (the all-models quota's; None: no limit)."""

    team_id: int
    team_slug: str
    is_member: bool  # the user asked about belongs to the team
    classes: tuple[ClassGrant, ...]  # highest first
    default_class: PriorityClass | None
    limit_gpus: Decimal | None
    limit_gpu_memory_mib: int | None
    known_classes: tuple[str, ...]  # every priority class, allowed or not

    def grant_of(self, name: str) -> ClassGrant | None:
        return next((g for g in self.classes if g.priority_class.name == name), None)

    def classes_text(self) -> str:
        """For refusals: 'training, inference; default training'."""
        names = ", ".join(g.priority_class.name for g in self.classes) or "none"
        return f"{names}; default {self.default_class.name if self.default_class else 'none'}"


def _allowance(
    *, team_id: int, team_slug: str, is_member: bool, quota: tuple, classes: list[tuple]
) -> TeamAllowance:
    """The one rule: a team may use a priority class that is open to all teams, that the team or its
    organisation was granted, or that is its default. Its limit at a class is its own grant's, else its
    organisation's. A team with no default set gets the lowest class it may use."""
    default_id, limit_gpus, limit_gpu_memory_mib = quota
    grants = []
    for pc, own_id, own_limit, inherited_id, inherited_limit in classes:
        if pc.open_to_all_teams or own_id is not None or inherited_id is not None or pc.pk == default_id:
            grants.append(ClassGrant(pc, own_limit if own_id is not None else inherited_limit))
    default = next((g.priority_class for g in grants if g.priority_class.pk == default_id), None)
    if default is None and grants:
        default = grants[-1].priority_class
    return TeamAllowance(
        team_id=team_id,
        team_slug=team_slug,
        is_member=is_member,
        classes=tuple(grants),
        default_class=default,
        limit_gpus=limit_gpus,
        limit_gpu_memory_mib=limit_gpu_memory_mib,
        known_classes=tuple(pc.name for pc, *_ in classes),
    )


@functools.cache
def _allowance_sql(teams: int | None) -> str:
    """One statement: a row per (team, priority class), highest class first, with the team's all-models quota
    and the user's membership repeated on each row. `teams`: how many ids the IN list takes (None: all)."""
    team, membership, quota = Team._meta.db_table, Membership._meta.db_table, Quota._meta.db_table
    pc, grant = PriorityClass._meta.db_table, TeamPriorityClass._meta.db_table
    where = "" if teams is None else f"WHERE t.id IN ({', '.join(['%s'] * teams)})"
    return f"""
        SELECT t.id, t.slug, EXISTS (SELECT 1 FROM {membership} m WHERE m.user_id = %s AND m.team_id = t.id),
               q.default_priority_class_id, q.limit_gpus, q.limit_gpu_memory_mib,
               {", ".join(f"pc.{f.column}" for f in PriorityClass._meta.concrete_fields)},
               own.id, own.limit_gpus, inherited.id, inherited.limit_gpus
        FROM {team} t
        LEFT JOIN {quota} q ON q.team_id = t.id AND q.gpu_model_id IS NULL
        LEFT JOIN {pc} pc ON TRUE
        LEFT JOIN {grant} own ON own.team_id = t.id AND own.priority_class_id = pc.id
        LEFT JOIN {grant} inherited ON inherited.team_id = t.parent_id AND inherited.priority_class_id = pc.id
        {where}
        ORDER BY t.id, pc.value DESC, pc.id"""


def team_allowances(
    *, team_ids: Collection[int] | None = None, user: AbstractBaseUser | None = None
) -> dict[int, TeamAllowance]:
    """Each team's allowance (all teams when `team_ids` is None), in one statement: every submit reads one, so it
    is hand-written. `user`: whose membership `is_member` tells."""
    if team_ids is not None and not team_ids:
        return {}
    ids = None if team_ids is None else sorted(set(team_ids))
    rows = fetch_rows(
        _allowance_sql(None if ids is None else len(ids)), [user.pk if user else None, *(ids or [])]
    )
    pc_fields = PriorityClass._meta.concrete_fields
    quota_fields = [Quota._meta.get_field(n) for n in ("limit_gpus", "limit_gpu_memory_mib")]
    grant_limit = TeamPriorityClass._meta.get_field("limit_gpus")
    by_team: dict[int, tuple[str, bool, tuple, list[tuple]]] = {}
    for team_id, slug, is_member, default_id, *rest in rows:
        limits, pc_values = rest[:2], rest[2 : 2 + len(pc_fields)]
        own_id, own_limit, inherited_id, inherited_limit = rest[2 + len(pc_fields) :]
        if team_id not in by_team:
            by_team[team_id] = (slug, bool(is_member), (default_id, *db_values(quota_fields, limits)), [])
        if pc_values[0] is not None:
            own_limit, inherited_limit = db_values([grant_limit, grant_limit], [own_limit, inherited_limit])
            pc = model_from_row(PriorityClass, pc_fields, pc_values)
            by_team[team_id][3].append((pc, own_id, own_limit, inherited_id, inherited_limit))
    return {
        team_id: _allowance(
            team_id=team_id, team_slug=slug, is_member=is_member, quota=quota, classes=classes
        )
        for team_id, (slug, is_member, quota, classes) in by_team.items()
    }


def team_allowance(*, team: Team, user: AbstractBaseUser | None = None) -> TeamAllowance:
    return team_allowances(team_ids=[team.pk], user=user)[team.pk]


def team_allowances_by_slug(
    *, slugs: Collection[str], user: AbstractBaseUser | None = None
) -> dict[str, TeamAllowance]:
    """The allowances of the teams named, by slug, in the order given (those that exist)."""
    ids = Team.objects.filter(slug__in=list(slugs)).values_list("pk", flat=True)
    by_slug = {a.team_slug: a for a in team_allowances(team_ids=list(ids), user=user).values()}
    return {slug: by_slug[slug] for slug in slugs if slug in by_slug}


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


# --- Jobs in images: which images a team may run, its mounts, its network ---------------------------------------
# Each is the team's own setting, else its organisation's: read with the parent's in one statement.
def _patterns(text: str | None) -> tuple[str, ...]:
    return tuple(line.strip() for line in (text or "").splitlines() if line.strip())


def _allowed_images(team_ids: Collection[int]) -> dict[int, tuple[str, ...]]:
    rows = Team.objects.filter(pk__in=team_ids).values_list("pk", "allowed_images", "parent__allowed_images")
    return {pk: _patterns(own) or _patterns(parents) for pk, own, parents in rows}


def team_allowed_images(*, team: Team) -> tuple[str, ...]:
    """The image patterns a team's jobs may run (globs): its own, else its organisation's; empty: any image."""
    return _allowed_images([team.pk]).get(team.pk, ())


def image_allowed(image: str, patterns: Collection[str]) -> bool:
    """Whether an image is one of the patterns (`*` matches anything, `/` and `:` included): any, when there are
    none."""
    return not patterns or any(fnmatch.fnmatchcase(image, p) for p in patterns)


def team_mounts(*, team_ids: Collection[int]) -> dict[int, dict[str, TeamMount]]:
    """Each team's mounts by name: its organisation's, with the team's own of the same name instead."""
    teams = dict(Team.objects.filter(pk__in=team_ids).values_list("pk", "parent_id"))
    by_team: dict[int, dict[str, TeamMount]] = defaultdict(dict)
    for mount in TeamMount.objects.filter(team_id__in={*teams, *teams.values()} - {None}):
        by_team[mount.team_id][mount.name] = mount
    return {pk: {**by_team.get(parent, {}), **by_team.get(pk, {})} for pk, parent in teams.items()}


def team_networks(*, team_ids: Collection[int]) -> dict[int, str]:
    """Each team's network setting for jobs in images: its own, else its organisation's (blank: it says none)."""
    rows = Team.objects.filter(pk__in=team_ids).values_list("pk", "network", "parent__network")
    return {pk: own or parents or "" for pk, own, parents in rows}


def team_image_settings(*, team_ids: Collection[int]) -> dict[str, dict[str, list[str]]]:
    """What the submit form says of each team's jobs in images: its allowed image patterns (empty: any image) and
    its mounts ("datasets: /datasets, read-only")."""
    slugs = dict(Team.objects.filter(pk__in=team_ids).values_list("pk", "slug"))
    images, mounts = _allowed_images(team_ids), team_mounts(team_ids=team_ids)
    return {
        slug: {
            "images": list(images.get(pk, ())),
            "mounts": [
                f"{name}: {m.container_path}, {m.access}" for name, m in sorted(mounts.get(pk, {}).items())
            ],
        }
        for pk, slug in slugs.items()
    }
