"""Admin site for teams and quotas. Quota and priority class grant edits go through their services, so each one
is audited. Sizes are typed and shown as the portal shows them (GPU memory in GiB, GPU counts as "4"), and each
quota links to the portal's quota editor, which previews a change's impact before it is saved."""

from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from portal.admin_base import ReadOnlyAdmin, ReadOnlyInline
from quotas import services
from quotas.choices import ChangeSource
from quotas.form_fields import GpuMemoryGiBField, PlainDecimalField
from quotas.models import (
    DirectoryAccount,
    Membership,
    PriorityClass,
    Quota,
    QuotaChange,
    Team,
    TeamMount,
    TeamPriorityClass,
)
from quotas.sign_out import user_sign_out_everywhere

NO_LIMIT_HELP = "Empty: may borrow without limit."
WHOLE_GPU_HELP = "Whole-GPU equivalents (0.25 = a quarter of one card)."


def quota_editor_url(team: Team, quota: Quota | None = None) -> str:
    """The portal's quota editor for this team, on the quota's row (the all-models row when none is given)."""
    scope = quota.gpu_model.name if quota is not None and quota.gpu_model_id else "all"
    return f"{reverse('frontend:team_quota', args=[team.slug])}?{urlencode({'scope': scope})}"


def _editor_link(team: Team, quota: Quota | None = None, text: str = "Edit with impact preview") -> str:
    return format_html('<a href="{}">{}</a>', quota_editor_url(team, quota), text)


class QuotaReasonForm(forms.ModelForm):
    """A quota's fields and the reason for changing them, which `quota_save` requires of a person and keeps in
    the audit trail."""

    guaranteed_gpu_memory_mib = GpuMemoryGiBField(label="Guaranteed GPU memory (GiB)")
    limit_gpu_memory_mib = GpuMemoryGiBField(
        label="GPU memory limit (GiB)", required=False, help_text=NO_LIMIT_HELP
    )
    guaranteed_gpus = PlainDecimalField(
        label="Guaranteed GPUs", min_value=0, max_digits=9, decimal_places=3, help_text=WHOLE_GPU_HELP
    )
    limit_gpus = PlainDecimalField(
        label="GPU limit",
        min_value=0,
        max_digits=9,
        decimal_places=3,
        required=False,
        help_text=f"{WHOLE_GPU_HELP} {NO_LIMIT_HELP}",
    )
    fair_share_weight = PlainDecimalField(
        label="Fair-share weight",
        min_value=Decimal("0.01"),
        max_digits=6,
        decimal_places=2,
        help_text="How borrowed capacity is shared: a team of weight 2 borrows twice as much as one of weight 1.",
    )
    reason = forms.CharField(
        max_length=services.NOTE_MAX_CHARS,
        required=False,
        help_text="Why (required for a change; kept in the audit trail).",
    )

    class Meta:
        model = Quota
        fields = ("team", *services.QUOTA_AUDITED_FIELDS)

    def clean(self):
        data = super().clean()
        changed = [name for name in self.changed_data if name != "reason"]
        if changed and not (data.get("reason") or "").strip():
            self.add_error("reason", "Say why: a reason is required for a quota change.")
        for guaranteed, limit in (
            ("guaranteed_gpu_memory_mib", "limit_gpu_memory_mib"),
            ("guaranteed_gpus", "limit_gpus"),
        ):
            g, lim = data.get(guaranteed), data.get(limit)
            if g is not None and lim is not None and lim < g:
                self.add_error(
                    limit,
                    f"The limit ({services.amount_words(limit, lim)}) must be at least the guarantee "
                    f"({services.amount_words(guaranteed, g)}).",
                )
                # Said here in GiB and GPUs: the model's own check (in MiB) then meets the stored pair, not this.
                data.pop(guaranteed, None)
        return data


class QuotaInline(admin.TabularInline):
    model = Quota
    form = QuotaReasonForm
    extra = 0
    fields = (*services.QUOTA_AUDITED_FIELDS, "reason")


class PriorityClassGrantForm(forms.ModelForm):
    limit_gpus = PlainDecimalField(
        label="GPU limit",
        min_value=0,
        max_digits=9,
        decimal_places=3,
        required=False,
        help_text="The most GPUs (whole-GPU equivalents) the team may hold at this class at once. Empty: only "
        "the team's quota limits it.",
    )

    class Meta:
        model = TeamPriorityClass
        fields = services.GRANT_AUDITED_FIELDS


class PriorityClassGrantInline(admin.TabularInline):
    """The priority classes the team may use beyond those open to all teams, and per-class limits."""

    model = TeamPriorityClass
    form = PriorityClassGrantForm
    extra = 0
    fields = services.GRANT_AUDITED_FIELDS
    verbose_name_plural = "Priority class grants (classes open to all teams need a row only for a limit)"


class TeamMountInline(admin.TabularInline):
    """Directories of the nodes its jobs in images may ask for by name; each change is in the audit trail."""

    model = TeamMount
    extra = 0
    fields = ("name", "host_path", "container_path", "read_only")
    verbose_name_plural = "Mounts for jobs in images (an organisation's hold for each of its teams)"


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


def _value_words(name: str, value: Any) -> str:
    if value is None and name in ("gpu_model", "default_priority_class", "priority_class"):
        return "–"
    if value is None and name == "allowed_images":
        return "any image"
    if value is None and (name == "network" or name.startswith("mount ")):
        return "–"
    return services.amount_words(name, value)


@admin.display(description="what changed")
def changes_in_words(change: QuotaChange) -> str:
    """Each field old -> new as the portal's audit trail says it ("GPU limit: 2 GPUs → 3 GPUs")."""
    return format_html_join(
        "",
        "<div>{}: {} → {}</div>",
        (
            (
                services.FIELD_WORDS.get(name, name.replace("_", " ")),
                _value_words(name, values.get("old")),
                _value_words(name, values.get("new")),
            )
            for name, values in (change.changes or {}).items()
        ),
    )


class QuotaChangeInline(ReadOnlyInline):
    """The quota audit trail, shown read-only on the team's page."""

    model = QuotaChange
    fields = ("changed_at", "actor", "source", "what_changed", "note")
    readonly_fields = fields
    verbose_name_plural = "Quota changes (audit trail)"

    @admin.display(description="what changed")
    def what_changed(self, obj: QuotaChange) -> str:
        return changes_in_words(obj)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "display_name", "parent", "quota_editor")
    list_filter = ("parent",)
    search_fields = ("slug", "display_name")
    readonly_fields = ("quota_editor",)
    inlines = (QuotaInline, PriorityClassGrantInline, TeamMountInline, MembershipInline, QuotaChangeInline)
    fieldsets = (
        (None, {"fields": ("slug", "display_name", "parent", "quota_editor")}),
        ("Directory", {"fields": ("directory_group", "directory_admin_group")}),
        ("Jobs in images", {"fields": ("allowed_images", "network")}),
    )

    def save_model(self, request, obj, form, change):
        services.team_images_save(team=obj, actor=request.user, source=ChangeSource.ADMIN)

    @admin.display(description="quota editor")
    def quota_editor(self, obj: Team) -> str:
        if obj.pk is None:
            return "Once the team is saved: its quota in the portal's editor, with the impact preview."
        return _editor_link(obj)

    def save_formset(self, request, form, formset, change):
        if formset.model is TeamMount:
            mounts = formset.save(commit=False)
            for obj in formset.deleted_objects:
                services.team_mount_delete(mount=obj, actor=request.user, source=ChangeSource.ADMIN)
            for obj in mounts:
                services.team_mount_save(mount=obj, actor=request.user, source=ChangeSource.ADMIN)
            return None
        if formset.model not in (Quota, TeamPriorityClass):
            return super().save_formset(request, form, formset, change)
        objects = formset.save(commit=False)
        reasons = {id(f.instance): f.cleaned_data.get("reason", "") for f in formset.forms if f.cleaned_data}
        for obj in formset.deleted_objects:
            if isinstance(obj, Quota):
                services.quota_delete(quota=obj, actor=request.user, source=ChangeSource.ADMIN)
            else:
                services.priority_class_grant_delete(grant=obj, actor=request.user, source=ChangeSource.ADMIN)
        for obj in objects:
            if isinstance(obj, Quota):
                services.quota_save(
                    quota=obj, actor=request.user, source=ChangeSource.ADMIN, note=reasons.get(id(obj), "")
                )
            else:
                services.priority_class_grant_save(grant=obj, actor=request.user, source=ChangeSource.ADMIN)
        formset.save_m2m()


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = (
        "team",
        "scope",
        "guaranteed",
        "limit",
        "editor_link",  # before the rest: beside the navigation and the filters, the list scrolls sideways
        "weight",
        "default_priority_class",
    )
    list_filter = ("gpu_model", "default_priority_class")
    search_fields = ("team__slug",)
    form = QuotaReasonForm
    fields = ("quota_editor", "team", *services.QUOTA_AUDITED_FIELDS, "reason")
    readonly_fields = ("quota_editor",)

    @admin.display(description="GPU model", ordering="gpu_model__name")
    def scope(self, obj: Quota) -> str:
        return obj.gpu_model.name if obj.gpu_model_id else "all GPU models"

    @admin.display(description="guaranteed")
    def guaranteed(self, obj: Quota) -> str:
        gpus = services.amount_words("guaranteed_gpus", obj.guaranteed_gpus)
        return f"{gpus} · {services.amount_words('guaranteed_gpu_memory_mib', obj.guaranteed_gpu_memory_mib)}"

    @admin.display(description="limit")
    def limit(self, obj: Quota) -> str:
        if obj.limit_gpus is None and obj.limit_gpu_memory_mib is None:
            return "no limit"
        gpus = services.amount_words("limit_gpus", obj.limit_gpus).replace("no limit", "no GPU limit")
        memory = services.amount_words("limit_gpu_memory_mib", obj.limit_gpu_memory_mib)
        return f"{gpus} · {memory.replace('no limit', 'no memory limit')}"

    @admin.display(description="fair-share weight", ordering="fair_share_weight")
    def weight(self, obj: Quota) -> str:
        return services.amount_words("fair_share_weight", obj.fair_share_weight)

    @admin.display(description="quota editor")
    def editor_link(self, obj: Quota) -> str:
        return _editor_link(obj.team, obj, "Edit with preview")

    @admin.display(description="quota editor")
    def quota_editor(self, obj: Quota) -> str:
        if obj.pk is None:
            return "The portal's quota editor previews a change's impact before saving it: open it from the team."
        return format_html(
            "{} <span class='help'>(the portal's quota editor: what the scheduler would do differently, before "
            "anything is saved)</span>",
            _editor_link(obj.team, obj),
        )

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("team", "gpu_model", "default_priority_class")

    def save_model(self, request, obj, form, change):
        services.quota_save(
            quota=obj, actor=request.user, source=ChangeSource.ADMIN, note=form.cleaned_data.get("reason", "")
        )

    def delete_model(self, request, obj):
        services.quota_delete(quota=obj, actor=request.user, source=ChangeSource.ADMIN)

    def delete_queryset(self, request, queryset):
        for quota in queryset:
            services.quota_delete(quota=quota, actor=request.user, source=ChangeSource.ADMIN)


@admin.register(QuotaChange)
class QuotaChangeAdmin(ReadOnlyAdmin):
    list_display = ("changed_at", "team", "actor", "source", changes_in_words, "note")
    list_filter = ("source", "team")
    search_fields = ("team__slug", "actor__username", "note")
    fields = ("team", "quota", "actor", "source", "changed_at", "what_changed", "note", "undo_of")
    readonly_fields = fields

    @admin.display(description="what changed")
    def what_changed(self, obj: QuotaChange) -> str:
        return changes_in_words(obj)


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "value",
        "preemptible",
        "preemption_grace_s",
        "idle_timeout_s",
        "interactive_idle_timeout_s",
        "network",
        "open_to_all_teams",
    )
    list_filter = ("open_to_all_teams",)
    search_fields = ("name",)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "team", "role")
    list_filter = ("role", "team")
    search_fields = ("user__username", "team__slug")


@admin.register(DirectoryAccount)
class DirectoryAccountAdmin(ReadOnlyAdmin):
    """Who signs in through the directory, as it said at their last sign-in (quotas/directory.py writes it)."""

    list_display = ("user", "source", "unix_account", "synced_at")
    list_filter = ("source",)
    search_fields = ("user__username", "unix_account", "subject")


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class PortalUserAdmin(UserAdmin):
    """Django's user admin, with the action an admin needs when someone must lose access now: a person removed
    from a directory group keeps their teams until their next sign-in, and their sessions and tokens until then."""

    actions = ("sign_out_everywhere",)

    @admin.action(description="Sign out everywhere: end their sessions and revoke their API tokens")
    def sign_out_everywhere(self, request, queryset) -> None:
        sessions = tokens = 0
        for user in queryset:
            done = user_sign_out_everywhere(
                user=user, why=f"by {request.user.get_username()} on the admin site"
            )
            sessions, tokens = sessions + done.sessions_ended, tokens + done.tokens_revoked
        count = queryset.count()
        self.message_user(
            request,
            f"Signed out {count} user{'' if count == 1 else 's'}: {sessions} sessions ended, "
            f"{tokens} tokens revoked.",
        )
