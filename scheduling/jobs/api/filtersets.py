"""Filters for job lists: by state, team, user, priority class, and "mine"."""

from __future__ import annotations

from datetime import UTC, datetime

import django_filters
from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError

from scheduling.choices import JobState
from scheduling.jobs.models import Job

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


class BoundedIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO date-time between 1970 and 9999: far-off years with odd offsets are refused, not crashed on."""

    def __init__(self, *args, param: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.param = param  # the query parameter, for the error

    def filter(self, qs: QuerySet, value: datetime | None) -> QuerySet:
        if value is not None:
            try:
                in_range = EARLIEST <= value.astimezone(UTC) <= LATEST
            except (OverflowError, ValueError):
                in_range = False
            if not in_range:
                raise ValidationError(
                    {self.param: [f"Give a date-time between {EARLIEST.year} and {LATEST.year}."]}
                )
            # In UTC: Python takes offsets up to 24 h, PostgreSQL refuses those beyond 15:59.
            value = value.astimezone(UTC)
        return super().filter(qs, value)


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, help_text="Repeat for several.")
    team = django_filters.CharFilter(field_name="team__slug", help_text="Team slug.")
    user = django_filters.CharFilter(field_name="submitter__username", help_text="Submitter's username.")
    priority = django_filters.CharFilter(field_name="priority_class__name", help_text="Priority class name.")
    mine = django_filters.ChoiceFilter(
        method="filter_mine",
        choices=[(v, v) for v in ("true", "false")],
        help_text="true: only jobs you submitted; false: only others'. Anything else is refused (400).",
    )
    submitted_after = BoundedIsoDateTimeFilter(
        param="submitted_after", field_name="submitted_at", lookup_expr="gte"
    )
    submitted_before = BoundedIsoDateTimeFilter(
        param="submitted_before", field_name="submitted_at", lookup_expr="lt"
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


class QueueFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug", help_text="Team slug.")
    priority = django_filters.CharFilter(field_name="priority_class__name")

    class Meta:
        model = Job
        fields = ["team", "priority"]
