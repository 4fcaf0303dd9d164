"""Sign-in from the site's directory (LDAP or OIDC): what the directory says about a user, written at each
sign-in. Teams follow groups (`Team.directory_group` and `directory_admin_group`), staff status follows
DIRECTORY_STAFF_GROUP, and the user's Unix account is kept for the agents' `account` mode.

Only teams that name a group are the directory's: a user in neither of a team's groups loses that team at their
next sign-in, while memberships of teams kept by hand are never touched. The directory is read at sign-in, not
watched: a removal takes effect at the user's next sign-in (or token login), and docs/operations.md says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from quotas.choices import Role
from quotas.models import DirectoryAccount, Membership, Team

log = logging.getLogger(__name__)

MAX_GROUPS = 1000  # a directory may list many groups; only names are kept, and a sane number of them


@dataclass(frozen=True)
class DirectoryUser:
    """What the directory says about the person signing in."""

    source: str  # quotas.choices.DirectorySource
    subject: str  # the LDAP DN, or the OIDC `sub`
    groups: frozenset[str]
    unix_account: str = ""


@dataclass
class DirectorySync:
    """What a sign-in changed: team slugs joined, left and whose role changed, and the staff flag."""

    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    role_changed: list[str] = field(default_factory=list)
    staff: bool | None = None  # None: unchanged

    @property
    def changed(self) -> bool:
        return bool(self.joined or self.left or self.role_changed or self.staff is not None)


def group_names(values: Iterable[object]) -> frozenset[str]:
    """The group names of a directory's answer: strings, trimmed, at most MAX_GROUPS of them."""
    names = sorted({v.strip() for v in values if isinstance(v, str) and v.strip()})
    return frozenset(names[:MAX_GROUPS])


def _roles_from_groups(groups: frozenset[str]) -> tuple[dict[int, str], set[int]]:
    """The role the groups give in each directory-managed team, and the ids of all directory-managed teams."""
    managed = Team.objects.exclude(directory_group="", directory_admin_group="").values_list(
        "pk", "directory_group", "directory_admin_group"
    )
    roles: dict[int, str] = {}
    ids = set()
    for team_id, member_group, admin_group in managed:
        ids.add(team_id)
        if admin_group and admin_group in groups:
            roles[team_id] = Role.TEAM_ADMIN
        elif member_group and member_group in groups:
            roles[team_id] = Role.MEMBER
    return roles, ids


@transaction.atomic
def directory_sign_in(*, user: AbstractBaseUser, directory: DirectoryUser) -> DirectorySync:
    """Bring the user's directory teams, staff flag and account record to what the directory says now."""
    sync = DirectorySync()
    roles, managed = _roles_from_groups(directory.groups)
    current = {
        m.team_id: m for m in Membership.objects.select_for_update().filter(user=user, team_id__in=managed)
    }
    slugs = dict(Team.objects.filter(pk__in=set(roles) | set(current)).values_list("pk", "slug"))
    for team_id, membership in current.items():
        if team_id not in roles:
            membership.delete()
            sync.left.append(slugs[team_id])
        elif membership.role != roles[team_id]:
            membership.role = roles[team_id]
            membership.save(update_fields=["role"])
            sync.role_changed.append(slugs[team_id])
    for team_id, role in roles.items():
        if team_id not in current:
            Membership.objects.create(user=user, team_id=team_id, role=role)
            sync.joined.append(slugs[team_id])

    staff_group = settings.DIRECTORY_STAFF_GROUP
    if staff_group:
        is_staff = staff_group in directory.groups
        if user.is_staff != is_staff:
            user.is_staff = is_staff
            user.save(update_fields=["is_staff"])
            sync.staff = is_staff

    DirectoryAccount.objects.update_or_create(
        user=user,
        defaults={
            "source": directory.source,
            "subject": directory.subject[:500],
            "unix_account": directory.unix_account[:64],
            "groups": sorted(directory.groups),
            "synced_at": timezone.now(),
        },
    )
    if sync.changed:
        log.info(
            "directory sign-in of %s changed teams: joined %s, left %s, role changed %s, staff %s",
            user.get_username(),
            sync.joined or "-",
            sync.left or "-",
            sync.role_changed or "-",
            "unchanged" if sync.staff is None else sync.staff,
        )
    return sync
