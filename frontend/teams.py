"""Teams and their quotas: the signed-in user's teams (/teams/) and the quota editor
(/teams/<slug>/quota/) with its impact preview, audit trail and undo.

Who may change what is the service's (`quotas.services.quota_save`): this module only shows the form, turns
GiB into the MiB the quota stores, and puts a refusal next to its field. The preview is the engine's answer on
the what-if snapshot (`scheduling.cycle.quota_whatif`); nothing is saved until the form is submitted with a
reason.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Min, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from quotas.choices import ChangeSource
from quotas.errors import QuotaRefused
from quotas.form_fields import MIB_PER_GIB, gib_of, mib_of
from quotas.form_fields import plain as _plain
from quotas.models import PriorityClass, Quota, QuotaChange, Team
from quotas.selectors import team_allowance, team_by_slug, team_ids_for_user
from quotas.services import (
    FIELD_WORDS,
    NOTE_MAX_CHARS,
    QUOTA_AUDITED_FIELDS,
    amount_words,
    quota_audit_values,
    quota_change_check,
    quota_change_undo,
    quota_change_undoable,
    quota_may_edit,
    quota_save,
    teams_administered_by,
)
from scheduling.choices import NodeState
from scheduling.cycle.quota_whatif import quota_impact
from scheduling.inventory.models import Gpu, GpuModel
from scheduling.inventory.selectors import gpu_model_rows

AUDIT_PAGE_SIZE = 20
ALL_MODELS = "all"
# Form fields -> the quota's fields (memory is edited in GiB, stored in MiB).
FORM_FIELDS = {
    "guaranteed_gpus": "guaranteed_gpus",
    "limit_gpus": "limit_gpus",
    "guaranteed_gib": "guaranteed_gpu_memory_mib",
    "limit_gib": "limit_gpu_memory_mib",
    "fair_share_weight": "fair_share_weight",
    "default_priority_class": "default_priority_class",
}
QUOTA_TO_FORM = {v: k for k, v in FORM_FIELDS.items()}
# The fields a GPU-count / memory mismatch is said beside (each has a place for it on the page).
WARNED_FIELDS = ("guaranteed_gpus", "guaranteed_gib", "limit_gpus", "limit_gib")


def _words(value: Decimal, unit: str) -> str:
    """'4 GPUs', '1 GPU', '0.5 GPUs', '480 GiB', '842.4 GiB' (grouped by thousands, no trailing zeros)."""
    if unit == "GiB":
        value = value.quantize(Decimal("0.1"), ROUND_HALF_UP)
    text = f"{_plain(value):,f}"
    if unit == "GPU":
        return "1 GPU" if value == 1 else f"{text} GPUs"
    return f"{text} {unit}"


def memory_gpus_mismatch(
    *, gpus: Decimal | None, gib: Decimal | None, cards: dict[str, int], what: str
) -> dict[str, str]:
    """Warnings, by form field, when a GPU count and a memory size of a quota disagree on the cards the team can
    get (`cards`: GPU model -> MiB of one card): the memory cannot hold the count's whole cards of a model
    (whole-card jobs stop short of the count), or it is more than that many of the largest cards hold (the count
    binds first; only slices could use the rest). A warning, never a refusal: slices make either deliberate, and a
    count under one card is slices' alone, so it is not checked. `what` is "limit" or "guarantee"."""
    if gpus is None or gib is None or gpus < 1 or not cards:
        return {}
    gpu_field, gib_field = (
        ("limit_gpus", "limit_gib") if what == "limit" else ("guaranteed_gpus", "guaranteed_gib")
    )
    whole = int(gpus.to_integral_value(ROUND_FLOOR))
    mib = gib * MIB_PER_GIB
    short = []
    for model, card_mib in sorted(cards.items(), key=lambda kv: (kv[1], kv[0])):
        need = whole * card_mib
        if mib < need:
            holds = int((mib / card_mib).to_integral_value(ROUND_FLOOR))
            short.append(
                f"{whole} {model} need {_words(Decimal(need) / MIB_PER_GIB, 'GiB')}, it holds {holds}"
            )
    if short:
        return {
            gib_field: f"{_words(gib, 'GiB')} cannot hold the {what}'s {_words(gpus, 'GPU')} as whole cards: "
            f"{'; '.join(short)}. Jobs on whole cards stop short of {_words(gpus, 'GPU')}.",
        }
    largest_model, largest = max(cards.items(), key=lambda kv: (kv[1], kv[0]))
    most = gpus * largest
    if mib > most:
        return {
            gpu_field: f"{_words(gpus, 'GPU')} cannot use the {what}'s {_words(gib, 'GiB')} of memory: "
            f"{_plain(gpus)} {largest_model}, the largest cards the team can get, hold "
            f"{_words(most / MIB_PER_GIB, 'GiB')}. Jobs on whole cards reach {_words(gpus, 'GPU')} first; only "
            "slices could use the rest.",
        }
    return {}


def _card_memory(team: Team, scope: str) -> dict[str, int]:
    """GPU model -> MiB of its smallest installed card (nodes not lost), for the models a quota row's team can
    get: its model on a per-model row; on the all-models row, every installed model but those the team's own
    per-model row closes (a limit of 0)."""
    cards = Gpu.objects.exclude(node__state=NodeState.LOST)
    if scope != ALL_MODELS:
        cards = cards.filter(model__name=scope)
    else:
        closed = Quota.objects.filter(team=team, gpu_model__isnull=False).filter(
            Q(limit_gpus=0) | Q(limit_gpu_memory_mib=0)
        )
        cards = cards.exclude(model_id__in=closed.values("gpu_model_id"))
    rows = cards.values("model__name").annotate(card_mib=Min("memory_mib"))
    return {row["model__name"]: row["card_mib"] for row in rows}


def quota_warnings(*, values: dict[str, Any], team: Team, scope: str) -> dict[str, str]:
    """The form's values (guaranteed_gpus, guaranteed_gib, limit_gpus, limit_gib) checked against the cards the
    team can get: a warning by field, for beside it."""
    cards = _card_memory(team, scope)
    warnings: dict[str, str] = {}
    for what, gpus, gib in (
        ("guarantee", "guaranteed_gpus", "guaranteed_gib"),
        ("limit", "limit_gpus", "limit_gib"),
    ):
        warnings.update(
            memory_gpus_mismatch(gpus=values.get(gpus), gib=values.get(gib), cards=cards, what=what)
        )
    return warnings


class QuotaForm(forms.Form):
    guaranteed_gpus = forms.DecimalField(
        label="Guaranteed GPUs",
        min_value=0,
        max_digits=9,
        decimal_places=3,
        help_text="Whole-GPU equivalents.",
    )
    limit_gpus = forms.DecimalField(
        label="GPU limit",
        min_value=0,
        max_digits=9,
        decimal_places=3,
        required=False,
        help_text="Empty: may borrow without limit.",
    )
    guaranteed_gib = forms.DecimalField(label="Guaranteed GPU memory (GiB)", min_value=0, decimal_places=3)
    limit_gib = forms.DecimalField(
        label="GPU memory limit (GiB)",
        min_value=0,
        decimal_places=3,
        required=False,
        help_text="Empty: may borrow without limit.",
    )
    fair_share_weight = forms.DecimalField(
        label="Fair-share weight",
        min_value=Decimal("0.01"),
        max_digits=6,
        decimal_places=2,
        help_text="How borrowed capacity is shared: a team of weight 2 borrows twice as much as one of weight 1.",
    )
    default_priority_class = forms.ChoiceField(label="Default priority class", required=False)
    reason = forms.CharField(
        label="Reason",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=f"Required; kept in the audit trail (at most {NOTE_MAX_CHARS} characters).",
    )

    def __init__(self, *args: Any, classes: list[str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["default_priority_class"].choices = [
            ("", "lowest it may use"),
            *((c, c) for c in classes),
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for guaranteed, limit, unit in (
            ("guaranteed_gpus", "limit_gpus", "GPUs"),
            ("guaranteed_gib", "limit_gib", "GiB"),
        ):
            g, lim = data.get(guaranteed), data.get(limit)
            if g is not None and lim is not None and lim < g:
                self.add_error(
                    limit,
                    f"The limit ({_plain(lim)} {unit}) must be at least the guarantee ({_plain(g)} {unit}).",
                )
        return data

    def apply_to(self, quota: Quota) -> Quota:
        data = self.cleaned_data
        quota.guaranteed_gpus = data["guaranteed_gpus"]
        quota.limit_gpus = data["limit_gpus"]
        quota.guaranteed_gpu_memory_mib = mib_of(data["guaranteed_gib"])
        quota.limit_gpu_memory_mib = mib_of(data["limit_gib"])
        quota.fair_share_weight = data["fair_share_weight"]
        name = data.get("default_priority_class") or ""
        quota.default_priority_class = PriorityClass.objects.filter(name=name).first() if name else None
        return quota

    def add_refusal(self, exc: Exception) -> None:
        """A service's refusal next to its field (or above the form)."""
        if isinstance(exc, ValidationError) and hasattr(exc, "message_dict"):
            for name, errors in exc.message_dict.items():
                field = QUOTA_TO_FORM.get(name)
                for error in errors:
                    self.add_error(field if field in self.fields else None, error)
            return
        message = getattr(exc, "message", str(exc))
        field = getattr(exc, "field", None)
        field = QUOTA_TO_FORM.get(field, field)
        self.add_error(field if field in self.fields else None, message)


def _initial(quota: Quota) -> dict[str, Any]:
    return {
        "guaranteed_gpus": _plain(quota.guaranteed_gpus),
        "limit_gpus": _plain(quota.limit_gpus),
        "guaranteed_gib": gib_of(quota.guaranteed_gpu_memory_mib),
        "limit_gib": gib_of(quota.limit_gpu_memory_mib),
        "fair_share_weight": _plain(quota.fair_share_weight),
        "default_priority_class": quota.default_priority_class.name
        if quota.default_priority_class_id
        else "",
    }


def _team(slug: str) -> Team:
    team = team_by_slug(slug=slug)
    if team is None:
        raise Http404("No such team.")
    return team


def _forbidden_as_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A refusal of who may edit (PermissionDenied, the service's QuotaForbidden included) as the portal's own
    403 page, saying why, instead of the bare one."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except PermissionDenied as exc:
            context = {"nav": "teams", "why": getattr(exc, "message", None) or str(exc)}
            return render(request, "frontend/teams/forbidden.html", context, status=403)

    return wrapped


def _editable_team(request: HttpRequest, slug: str) -> Team:
    team = _team(slug)
    if not quota_may_edit(actor=request.user, team=team):
        raise PermissionDenied(f"Only staff and team admins of {team.slug} may change its quota.")
    return team


def _rows(team: Team) -> dict[str, Quota]:
    """The team's quota rows by scope ("all", or a GPU model's name)."""
    rows = Quota.objects.filter(team=team).select_related("team", "gpu_model", "default_priority_class")
    return {q.gpu_model.name if q.gpu_model_id else ALL_MODELS: q for q in rows}


def _row_for(request: HttpRequest, team: Team, scope: str) -> Quota:
    """The row the editor edits: an existing one, or (staff) a new one for the all-models scope or a model."""
    rows = _rows(team)
    if scope in rows:
        return rows[scope]
    if scope == ALL_MODELS:
        return Quota(team=team)
    model = GpuModel.objects.filter(name=scope).first()
    if model is None:
        raise Http404("No such GPU model.")
    return Quota(team=team, gpu_model=model)


def _form(request: HttpRequest, team: Team, quota: Quota, data=None) -> QuotaForm:
    classes = [g.priority_class.name for g in team_allowance(team=team).classes]
    return QuotaForm(data, initial=_initial(quota), classes=classes)


def _visible_team_slugs(request: HttpRequest) -> set[str] | None:
    """Whose jobs a preview may name (None: all, for staff); others show as "a job of <team>"."""
    if request.user.is_staff:
        return None
    ids = team_ids_for_user(user=request.user)
    return set(Team.objects.filter(pk__in=ids).values_list("slug", flat=True))


def _change_rows(team: Team, page_number: str | None, may_edit: bool):
    changes = QuotaChange.objects.filter(team=team).select_related("actor", "quota__gpu_model", "undo_of")
    page = Paginator(changes, AUDIT_PAGE_SIZE).get_page(page_number)
    rows = []
    for change in page.object_list:
        rows.append(
            {
                "change": change,
                "items": [
                    {
                        "field": FIELD_WORDS.get(name, name.replace("_", " ")),
                        "old": _audit_words(name, values.get("old")),
                        "new": _audit_words(name, values.get("new")),
                    }
                    for name, values in change.changes.items()
                ],
                "undoable": may_edit and quota_change_undoable(change),
            }
        )
    return page, rows


def _audit_words(name: str, value: Any) -> str:
    if value is None:
        return (
            "–"
            if name in ("gpu_model", "default_priority_class", "priority_class")
            else amount_words(name, None)
        )
    if name.endswith("_mib") or name.endswith("_gpus") or name == "fair_share_weight":
        return amount_words(name, value)
    return str(value)


def _page(request: HttpRequest, team: Team, scope: str, form: QuotaForm, quota: Quota, status: int = 200):
    rows = _rows(team)
    may_add = request.user.is_staff
    # A tab to add per GPU model the cluster has (a model only in the catalogue has no cards to share out);
    # a model a row already names keeps its tab among `scopes`.
    models = sorted(m.name for m in gpu_model_rows(installed_only=True))
    page, changes = _change_rows(team, request.GET.get("page"), True)
    values = form.cleaned_data if form.is_bound and form.is_valid() else _initial(quota)
    context = {
        "nav": "teams",
        "team": team,
        "scope": scope,
        "quota": quota,
        "form": form,
        "scopes": [ALL_MODELS, *sorted(s for s in rows if s != ALL_MODELS)],
        "addable": [m for m in models if m not in rows] if may_add else [],
        "expected": quota_audit_values(quota) if quota.pk else {},
        "page": page,
        "changes": changes,
        "is_staff": request.user.is_staff,
        "note_max": NOTE_MAX_CHARS,
        "warnings": quota_warnings(values=values, team=team, scope=scope),
    }
    return render(request, "frontend/teams/quota.html", context, status=status)


@login_required
def teams(request: HttpRequest) -> HttpResponse:
    """The user's teams (staff: every team) with their quotas, and which of them the user may edit."""
    if request.user.is_staff:
        team_rows = Team.objects.all()
    else:
        team_rows = Team.objects.filter(memberships__user=request.user).distinct()
    editable = teams_administered_by(user=request.user)
    rows = []
    for team in team_rows.prefetch_related("quotas__gpu_model", "quotas__default_priority_class"):
        rows.append(
            {
                "team": team,
                "quotas": sorted(
                    team.quotas.all(), key=lambda q: (q.gpu_model_id is not None, str(q.gpu_model))
                ),
                "editable": request.user.is_staff or team.pk in editable,
            }
        )
    return render(request, "frontend/teams/list.html", {"nav": "teams", "rows": rows})


@login_required
@_forbidden_as_page
def team_quota(request: HttpRequest, slug: str) -> HttpResponse:
    team = _editable_team(request, slug)
    scope = request.POST.get("scope") or request.GET.get("scope") or ALL_MODELS
    quota = _row_for(request, team, scope)
    if request.method != "POST":
        return _page(request, team, scope, _form(request, team, quota), quota)
    form = _form(request, team, quota, request.POST)
    if form.is_valid():
        expected = {
            n: request.POST.get(f"was_{n}") for n in QUOTA_AUDITED_FIELDS if f"was_{n}" in request.POST
        }
        try:
            change = quota_save(
                quota=form.apply_to(quota),
                actor=request.user,
                source=ChangeSource.PORTAL,
                note=form.cleaned_data["reason"],
                expected_values={k: _expected(k, v) for k, v in expected.items()} if quota.pk else None,
            )
        except (QuotaRefused, ValidationError) as exc:
            form.add_refusal(exc)
            if quota.pk:
                quota.refresh_from_db()
        else:
            if change is None:
                messages.info(request, "Nothing changed.")
            else:
                messages.success(request, f"Saved as change #{change.pk}.")
            return redirect(f"{request.path}?scope={scope}")
    return _page(request, team, scope, form, quota, status=400)


def _expected(name: str, text: str) -> Any:
    """A hidden "was" value as the audit trail writes it (memory in MiB as an integer)."""
    if text == "":
        return None
    return int(text) if name.endswith("_mib") else text


@login_required
@_forbidden_as_page
@require_POST
def team_quota_preview(request: HttpRequest, slug: str) -> HttpResponse:
    """The engine's answer to "what if the quota were this?" on the what-if snapshot; nothing is saved."""
    team = _editable_team(request, slug)
    scope = request.POST.get("scope") or ALL_MODELS
    quota = _row_for(request, team, scope)
    form = _form(request, team, quota, request.POST)
    context: dict[str, Any] = {"form": form, "team": team}
    if form.is_valid():
        row = form.apply_to(quota)
        try:
            quota_change_check(quota=row, actor=request.user)
        except (QuotaRefused, ValidationError) as exc:
            form.add_refusal(exc)
            context["refused"] = True
        context["impact"] = quota_impact(row=row)
        context["visible"] = _visible_team_slugs(request)
        context["warnings"] = quota_warnings(values=form.cleaned_data, team=team, scope=scope)
        context["warned_fields"] = WARNED_FIELDS
    return render(request, "frontend/teams/_preview.html", context)


@login_required
@_forbidden_as_page
@require_POST
def team_quota_undo(request: HttpRequest, slug: str, change_id: int) -> HttpResponse:
    team = _editable_team(request, slug)
    change = QuotaChange.objects.filter(team=team, pk=change_id).first()
    if change is None:
        raise Http404("No such change.")
    try:
        undone = quota_change_undo(
            change=change,
            actor=request.user,
            reason=request.POST.get("reason", ""),
            source=ChangeSource.PORTAL,
        )
    except QuotaRefused as exc:
        messages.error(request, f"Change #{change.pk} not undone: {exc.message}")
    except ValidationError as exc:
        messages.error(request, f"Change #{change.pk} not undone: {'; '.join(exc.messages)}")
    else:
        messages.success(request, f"Undid change #{change.pk} (recorded as change #{undone.pk}).")
    scope = change.quota.gpu_model.name if change.quota and change.quota.gpu_model_id else ALL_MODELS
    return redirect(f"/teams/{team.slug}/quota/?scope={scope}")
