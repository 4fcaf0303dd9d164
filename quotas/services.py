"""Writes for teams, memberships, priority classes and quotas. Every quota change, and every change to the
priority classes a team is granted, leaves a QuotaChange.

Who may change a quota is decided here, for the portal, the admin site and the API alike (`quota_save`):
staff may change any quota; a team admin (Membership role team_admin, on the team or on its organisation) may
make their team ask *less* of the cluster, never more: lower a guarantee, a limit or the fair-share weight, and
pick the team's default priority class among those it may use. Raising a guarantee is a promise made against
the whole cluster's capacity, so it is staff's; so are new per-GPU-model rows and deletions. A team admin may
also undo their own change (it restores what was there before). A person's change needs a reason (300
characters at most); changes by the system (actor None: the demo loader, fixtures) may carry none."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from quotas.choices import ChangeSource, Role
from quotas.errors import QuotaConflict, QuotaForbidden, QuotaRefused
from quotas.models import (
    IdempotencyRecord,
    Membership,
    PriorityClass,
    Quota,
    QuotaChange,
    Team,
    TeamMount,
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
GRANT_AUDITED_FIELDS = ("priority_class", "limit_gpus", "idle_timeout_s")


@dataclass(frozen=True)
class DefaultPriorityClass:
    name: str
    value: int
    preemptible: bool
    preemption_grace_s: int
    open_to_all_teams: bool
    description: str
    idle_timeout_s: int | None = None  # batch: requeued while others wait (scheduling/cycle/idle.py)
    interactive_idle_timeout_s: int | None = None  # sessions: stopped


# A class that preempts everyone and is never preempted is granted team by team; the others are open to all.
DEFAULT_PRIORITY_CLASSES = (
    # Serving waits for requests by design: its idle cards are not given back.
    DefaultPriorityClass(
        "inference", 50, True, 30, True, "Light, latency-tolerant serving and evaluation jobs."
    ),
    DefaultPriorityClass(
        "training",
        100,
        True,
        120,
        True,
        "Training runs and notebooks; may preempt inference. Idle cards are given back: a batch job after 2 h, a "
        "session after 30 min.",
        idle_timeout_s=2 * 3600,
        interactive_idle_timeout_s=30 * 60,
    ),
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
                "idle_timeout_s": default.idle_timeout_s,
                "interactive_idle_timeout_s": default.interactive_idle_timeout_s,
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


def quota_audit_values(quota: Quota) -> dict[str, Any]:
    """The quota's audited fields as `QuotaChange.changes` writes them (what an editor posts back as "was")."""
    return _quota_values(quota)


NOTE_MAX_CHARS = QuotaChange._meta.get_field("note").max_length
# What a team admin may only lower (None, no limit, counts as the most).
_LOWER_ONLY = (
    "guaranteed_gpus",
    "guaranteed_gpu_memory_mib",
    "limit_gpus",
    "limit_gpu_memory_mib",
    "fair_share_weight",
)
_NEVER_EMPTY = ("guaranteed_gpus", "guaranteed_gpu_memory_mib", "fair_share_weight")
FIELD_WORDS = {
    "guaranteed_gpus": "guaranteed GPUs",
    "limit_gpus": "GPU limit",
    "guaranteed_gpu_memory_mib": "guaranteed GPU memory",
    "limit_gpu_memory_mib": "GPU memory limit",
    "fair_share_weight": "fair-share weight",
    "default_priority_class": "default priority class",
    "gpu_model": "GPU model",
    "allowed_images": "allowed images",
    "network": "network of jobs in images",
}


def teams_administered_by(*, user: AbstractBaseUser) -> set[int]:
    """Ids of the teams whose quota a team admin may change: those they administer, and the teams of an
    organisation they administer."""
    direct = set(Membership.objects.filter(user=user, role=Role.TEAM_ADMIN).values_list("team_id", flat=True))
    if not direct:
        return set()
    return direct | set(Team.objects.filter(parent_id__in=direct).values_list("pk", flat=True))


def quota_may_edit(*, actor: AbstractBaseUser, team: Team) -> bool:
    """Whether the actor may change this team's quota at all (what they may change is `quota_save`'s)."""
    return bool(actor.is_staff) or team.pk in teams_administered_by(user=actor)


def reason_checked(reason: str | None, *, prefix: str = "") -> str:
    """The reason as stored (`prefix` + reason): required, and within QuotaChange.note's 300 characters."""
    reason = (reason or "").strip()
    if not reason:
        raise QuotaRefused(
            "Say why: a reason is required (it is kept in the quota's audit trail).",
            field="reason",
            code="required",
        )
    room = NOTE_MAX_CHARS - len(prefix)
    if len(reason) > room:
        raise QuotaRefused(
            f"The reason is {len(reason)} characters; at most {room} are kept.",
            field="reason",
            code="out_of_range",
            limit=room,
        )
    return prefix + reason


def amount_words(name: str, value: Any) -> str:
    """A quota field's value as the portal says it: "4 GPUs", "320 GiB", "no limit"."""
    if value is None:
        return "no limit" if name.startswith("limit_") else "none"
    if name.endswith("_mib"):
        return f"{(Decimal(int(value)) / 1024).normalize():f} GiB"
    if name.endswith("_gpus"):
        count = Decimal(str(value)).normalize()
        return f"{count:f} GPU" if count == 1 else f"{count:f} GPUs"
    return f"{Decimal(str(value)).normalize():f}" if name == "fair_share_weight" else str(value)


def _check_team_admin(
    *, actor: AbstractBaseUser, quota: Quota, before: Quota | None, undoing_own: bool
) -> None:
    """What a team admin may change (the module's docstring says why). Raises QuotaForbidden."""
    if quota.team_id not in teams_administered_by(user=actor):
        raise QuotaForbidden(
            f"You are not a team admin of {quota.team.slug}: its quota is not yours to change."
        )
    if before is None:
        raise QuotaForbidden("Only staff may add a quota row (a per-GPU-model one too).", field="gpu_model")
    if undoing_own:
        return  # it puts back what was there before their own change
    for name in _LOWER_ONLY:
        old, new = getattr(before, name), getattr(quota, name)
        if old is None or (new is not None and new <= old):
            continue
        raise QuotaForbidden(
            f"A team admin may lower the {FIELD_WORDS[name]}, not raise it (it is {amount_words(name, old)}); "
            "an admin can raise it.",
            field=name,
            limit=float(old) if isinstance(old, Decimal) else old,
        )
    if (
        quota.default_priority_class_id
        and quota.default_priority_class_id != before.default_priority_class_id
    ):
        from quotas.selectors import team_allowance  # the one rule of which classes a team may use

        allowed = {g.priority_class.pk for g in team_allowance(team=quota.team).classes}
        if quota.default_priority_class_id not in allowed:
            raise QuotaForbidden(
                f"{quota.team.slug} may not use priority class {quota.default_priority_class.name}.",
                field="default_priority_class",
            )


def quota_change_check(*, quota: Quota, actor: AbstractBaseUser | None) -> None:
    """Would `quota_save` refuse this edit for this actor? Raises as it would (ValidationError, QuotaForbidden);
    saves nothing. For previews, so a team admin learns before saving that a change is not theirs to make."""
    quota.full_clean()
    before = Quota.objects.filter(pk=quota.pk).first() if quota.pk else None
    if actor is not None and not actor.is_staff:
        _check_team_admin(actor=actor, quota=quota, before=before, undoing_own=False)


@transaction.atomic
def quota_save(
    *,
    quota: Quota,
    actor: AbstractBaseUser | None,
    source: str = ChangeSource.ADMIN,
    note: str = "",
    undo_of: QuotaChange | None = None,
    expected_values: dict[str, Any] | None = None,
) -> QuotaChange | None:
    """Validate, check who may, and save a new or edited quota, recording what changed and why (`note`: the
    reason, required when a person makes the change). Returns None when nothing changed.

    The caller passes the quota with its new values set; the stored row (locked) gives the old ones.
    `expected_values` (audited fields as `QuotaChange.changes` writes them) are what the editor showed: when the
    stored row differs, someone changed it meanwhile and QuotaConflict refuses. Refusals: ValidationError
    naming the field (a limit below its guarantee), QuotaRefused (the reason), QuotaForbidden, QuotaConflict.
    """
    quota.full_clean()
    before = Quota.objects.select_for_update().get(pk=quota.pk) if quota.pk else None
    old = _quota_values(before) if before else dict.fromkeys(QUOTA_AUDITED_FIELDS)
    for name, shown in (expected_values or {}).items():
        if name in old and old[name] != shown:
            raise QuotaConflict(
                f"The {FIELD_WORDS.get(name, name)} was changed by someone else while you edited "
                f"(it is {old[name] if old[name] is not None else 'empty'} now): reload and try again.",
                field=name,
            )
    new = _quota_values(quota)
    changes = {
        name: {"old": old[name], "new": new[name]} for name in QUOTA_AUDITED_FIELDS if old[name] != new[name]
    }
    if not changes:
        return None
    if actor is not None:
        note = reason_checked(note)
    if actor is not None and not actor.is_staff:
        own = undo_of is not None and undo_of.actor_id == actor.pk
        _check_team_admin(actor=actor, quota=quota, before=before, undoing_own=own)
    quota.save()
    return QuotaChange.objects.create(
        team=quota.team,
        quota=quota,
        actor=actor,
        source=source,
        changes=changes,
        note=note,
        undo_of=undo_of,
    )


def _field_from_audit(name: str, value: Any) -> Any:
    """A quota field's value from how the audit trail wrote it."""
    if value is None:
        return None
    if name in ("guaranteed_gpus", "limit_gpus", "fair_share_weight"):
        return Decimal(str(value))
    if name == "default_priority_class":
        # str(PriorityClass) is "name (value)"; a class's name is a slug, so it is what comes before " (".
        found = PriorityClass.objects.filter(name=str(value).split(" (", 1)[0]).first()
        if found is None:
            raise QuotaConflict(f"Priority class {value} no longer exists.", field=name)
        return found
    return int(value)


def quota_change_undoable(change: QuotaChange) -> bool:
    """Whether the change is an edit of an existing quota's values (not a created or deleted row, not a grant),
    the only kind an undo can invert. Whether it may be undone now is `quota_change_undo`'s to say."""
    # A created row's change has None as the old value of a field no row ever leaves empty.
    created = any(change.changes.get(name, {}).get("old", "") is None for name in _NEVER_EMPTY)
    names = set(change.changes)
    return change.quota_id is not None and not created and names <= set(QUOTA_AUDITED_FIELDS) - {"gpu_model"}


@transaction.atomic
def quota_change_undo(
    *, change: QuotaChange, actor: AbstractBaseUser, reason: str, source: str = ChangeSource.ADMIN
) -> QuotaChange:
    """Apply the inverse of a quota edit through `quota_save`, so it is checked and audited the same way
    ("undo of change #N: <reason>"). Refused with QuotaConflict when the quota was changed since (a field no
    longer holds the value the change gave it), QuotaRefused when the change was not an edit of a quota's
    values (a created or deleted row, a priority class grant), QuotaForbidden / ValidationError as any save."""
    note = reason_checked(reason, prefix=f"undo of change #{change.pk}: ")
    if not quota_change_undoable(change):
        raise QuotaRefused(
            f"Change #{change.pk} added or removed a quota row (or a priority class grant), or its quota is "
            "gone: only edits of a quota's values can be undone.",
            field="change",
        )
    quota = Quota.objects.select_for_update().select_related("team").get(pk=change.quota_id)
    now = _quota_values(quota)
    for name, values in change.changes.items():
        if now[name] != values["new"]:
            raise QuotaConflict(
                f"The {FIELD_WORDS.get(name, name)} was changed after change #{change.pk} (it is "
                f"{now[name] if now[name] is not None else 'empty'} now; that change set it to "
                f"{values['new'] if values['new'] is not None else 'empty'}): undo the later change first.",
                field=name,
            )
    for name, values in change.changes.items():
        setattr(quota, name, _field_from_audit(name, values["old"]))
    undone = quota_save(quota=quota, actor=actor, source=source, note=note, undo_of=change)
    if undone is None:  # the check above found the change's values in place, so the inverse changes something
        raise QuotaConflict(f"Change #{change.pk} is already undone.", field="change")
    return undone


@transaction.atomic
def quota_delete(
    *, quota: Quota, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN, note: str = ""
) -> QuotaChange:
    """Delete a quota row (staff only), recording its values."""
    if actor is not None and not actor.is_staff:
        raise QuotaForbidden("Only staff may delete a quota row.")
    old = _quota_values(quota)
    change = QuotaChange.objects.create(
        team=quota.team,
        quota=None,
        actor=actor,
        source=source,
        changes={name: {"old": value, "new": None} for name, value in old.items() if value is not None},
        note=f"quota deleted: {note}"[:NOTE_MAX_CHARS] if note else "quota deleted",
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


# --- Jobs in images: a team's allowed images, network and mounts, each change in its audit trail -----------------
TEAM_IMAGE_FIELDS = ("allowed_images", "network")


@transaction.atomic
def team_images_save(
    *, team: Team, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN
) -> QuotaChange | None:
    """Save a team's allowed images and network (its other fields with them), recording what changed of those two
    in its audit trail. Returns None when neither changed."""
    team.full_clean()
    old = (
        dict(
            zip(
                TEAM_IMAGE_FIELDS,
                Team.objects.select_for_update().filter(pk=team.pk).values_list(*TEAM_IMAGE_FIELDS).get(),
                strict=True,
            )
        )
        if team.pk
        else dict.fromkeys(TEAM_IMAGE_FIELDS, "")
    )
    team.save()
    changes = {
        name: {"old": old[name] or None, "new": getattr(team, name) or None}
        for name in TEAM_IMAGE_FIELDS
        if (old[name] or "") != (getattr(team, name) or "")
    }
    if not changes:
        return None
    return QuotaChange.objects.create(
        team=team, actor=actor, source=source, changes=changes, note="jobs in images"
    )


def _mount_words(mount: TeamMount) -> str:
    return f"{mount.host_path} → {mount.container_path} ({mount.access})"


@transaction.atomic
def team_mount_save(
    *, mount: TeamMount, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN
) -> QuotaChange | None:
    """Save a new or edited mount of a team, recorded in its audit trail. Returns None when nothing changed."""
    mount.full_clean()
    before = TeamMount.objects.select_for_update().filter(pk=mount.pk).first() if mount.pk else None
    old = _mount_words(before) if before is not None else None
    old_name = before.name if before is not None else mount.name
    mount.save()
    new = _mount_words(mount)
    if old == new and old_name == mount.name:
        return None
    changes = {f"mount {mount.name}": {"old": old if old_name == mount.name else None, "new": new}}
    if old_name != mount.name:
        changes[f"mount {old_name}"] = {"old": old, "new": None}
    return QuotaChange.objects.create(
        team=mount.team,
        actor=actor,
        source=source,
        changes=changes,
        note=f"mount {mount.name} {'changed' if before else 'added'}",
    )


@transaction.atomic
def team_mount_delete(
    *, mount: TeamMount, actor: AbstractBaseUser | None, source: str = ChangeSource.ADMIN
) -> QuotaChange:
    change = QuotaChange.objects.create(
        team=mount.team,
        actor=actor,
        source=source,
        changes={f"mount {mount.name}": {"old": _mount_words(mount), "new": None}},
        note=f"mount {mount.name} removed",
    )
    mount.delete()
    return change
