"""Filters for job lists: by state, team, user, priority class, "mine", an array's tasks and submit time (portal.api_params says
how each value is read)."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from portal.api_params import MOMENT_HELP, IdFilter, MomentFilter, StrictFilterSet, TextFilter
from scheduling.choices import JobState
from scheduling.jobs.models import Job
from scheduling.jobs.selectors import array_tasks_of, jobs_in_states


class JobFilterSet(StrictFilterSet):
    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices,
        method="filter_state",
        help_text="Repeat for several. An array's line matches when any of its tasks is in one of them.",
    )
    team = TextFilter(field_name="team__slug", help_text="Team slug.")
    user = TextFilter(field_name="submitter__username", help_text="Submitter's username.")
    priority = TextFilter(field_name="priority_class__name", help_text="Priority class name.")
    mine = django_filters.ChoiceFilter(
        method="filter_mine",
        choices=[(v, v) for v in ("true", "false")],
        help_text="true: only jobs you submitted; false: only others'. Anything else is refused (400).",
    )
    array = IdFilter(
        method="filter_array",
        help_text="The tasks of this array that have been placed (its id: the array's line; those not yet placed "
        "are counted on it). Without it, an array is one line.",
    )
    submitted_after = MomentFilter(
        field_name="submitted_at", lookup_expr="gte", help_text=f"Submitted at or after. {MOMENT_HELP}"
    )
    submitted_before = MomentFilter(
        field_name="submitted_at", lookup_expr="lt", help_text=f"Submitted before. {MOMENT_HELP}"
    )

    class Meta:
        model = Job
        fields = ["state", "team", "user", "priority", "mine", "array"]

    def filter_array(self, queryset: QuerySet[Job], name: str, value: int | None) -> QuerySet[Job]:
        return queryset if value is None else array_tasks_of(queryset, array_id=int(value))

    def filter_state(self, queryset: QuerySet[Job], name: str, value: list[str]) -> QuerySet[Job]:
        lines = not self.data.get("array")  # ?array=<id> lists its tasks, each by its own state
        return jobs_in_states(queryset, value, lines=lines) if value else queryset

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
