"""Admin site for teams and quotas. Quota and priority class grant edits go through their services, so each one
is audited."""

from django import forms
from django.contrib import admin

from portal.admin_base import ReadOnlyAdmin, ReadOnlyInline
from quotas import services
from quotas.choices import ChangeSource
from quotas.models import Membership, PriorityClass, Quota, QuotaChange, Team, TeamPriorityClass


class QuotaReasonForm(forms.ModelForm):
    """A quota's fields and the reason for changing them, which `quota_save` requires of a person and keeps in
    the audit trail."""

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
        return data


class QuotaInline(admin.TabularInline):
    model = Quota
    form = QuotaReasonForm
    extra = 0
    fields = (*services.QUOTA_AUDITED_FIELDS, "reason")


class PriorityClassGrantInline(admin.TabularInline):
    """The priority classes the team may use beyond those open to all teams, and per-class limits."""

    model = TeamPriorityClass
    extra = 0
    fields = services.GRANT_AUDITED_FIELDS
    verbose_name_plural = "Priority class grants (classes open to all teams need a row only for a limit)"


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


class QuotaChangeInline(ReadOnlyInline):
    """The quota audit trail, shown read-only on the team's page."""

    model = QuotaChange
    fields = ("changed_at", "actor", "source", "changes", "note")
    readonly_fields = fields
    verbose_name_plural = "Quota changes (audit trail)"


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "display_name", "parent")
    list_filter = ("parent",)
    search_fields = ("slug", "display_name")
    inlines = (QuotaInline, PriorityClassGrantInline, MembershipInline, QuotaChangeInline)

    def save_formset(self, request, form, formset, change):
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
        "gpu_model",
        "guaranteed_gpu_memory_mib",
        "limit_gpu_memory_mib",
        "guaranteed_gpus",
        "limit_gpus",
        "fair_share_weight",
        "default_priority_class",
    )
    list_filter = ("gpu_model", "default_priority_class")
    search_fields = ("team__slug",)
    form = QuotaReasonForm

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
    list_display = ("changed_at", "team", "actor", "source", "changes", "note")
    list_filter = ("source", "team")
    search_fields = ("team__slug", "actor__username", "note")
    readonly_fields = ("team", "quota", "actor", "source", "changed_at", "changes", "note", "undo_of")


@admin.register(PriorityClass)
class PriorityClassAdmin(admin.ModelAdmin):
    list_display = ("name", "value", "preemptible", "preemption_grace_s", "open_to_all_teams")
    list_filter = ("open_to_all_teams",)
    search_fields = ("name",)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "team", "role")
    list_filter = ("role", "team")
    search_fields = ("user__username", "team__slug")
