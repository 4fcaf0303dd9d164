"""Filters for job lists: by state, team, user, priority class, "mine" and submit time (portal.api_params says
how each value is read)."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from portal.api_params import MOMENT_HELP, MomentFilter, StrictFilterSet, TextFilter
from scheduling.choices import JobState
from scheduling.jobs.models import Job


class JobFilterSet(StrictFilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, help_text="Repeat for several.")
    team = TextFilter(field_name="team__slug", help_text="Team slug.")
    user = TextFilter(field_name="submitter__username", help_text="Submitter's username.")
    priority = TextFilter(field_name="priority_class__name", help_text="Priority class name.")
    mine = django_filters.ChoiceFilter(
        method="filter_mine",
        choices=[(v, v) for v in ("true", "false")],
        help_text="true: only jobs you submitted; false: only others'. Anything else is refused (400).",
    )
    submitted_after = MomentFilter(
        field_name="submitted_at", lookup_expr="gte", help_text=f"Submitted at or after. {MOMENT_HELP}"
    )
    submitted_before = MomentFilter(
        field_name="submitted_at", lookup_expr="lt", help_text=f"Submitted before. {MOMENT_HELP}"
    )

    class Meta:
        model = Job
        fields = ["state", "team", "user", "priority", "mine"]

    def filter_mine(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        if not value:
            return queryset
        user = self.request.user if self.request else None
        if value == "true":
            return queryset.filter(submitter=user)
        return queryset.exclude(submitter=user)


class QueueFilterSet(StrictFilterSet):
    team = TextFilter(field_name="team__slug", help_text="Team slug.")
    priority = TextFilter(field_name="priority_class__name", help_text="Priority class name.")

    class Meta:
        model = Job
        fields = ["team", "priority"]
