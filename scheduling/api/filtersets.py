"""Filters for job lists: by state, team, user, priority class, and "mine"."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet

from scheduling.choices import JobState
from scheduling.models import Job


class JobFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=JobState.choices, help_text="Repeat for several.")
    team = django_filters.CharFilter(field_name="team__slug", help_text="Team slug.")
    user = django_filters.CharFilter(field_name="submitter__username", help_text="Submitter's username.")
    priority = django_filters.CharFilter(field_name="priority_class__name", help_text="Priority class name.")
    mine = django_filters.BooleanFilter(method="filter_mine", help_text="Only jobs you submitted.")
    submitted_after = django_filters.IsoDateTimeFilter(field_name="submitted_at", lookup_expr="gte")
    submitted_before = django_filters.IsoDateTimeFilter(field_name="submitted_at", lookup_expr="lt")

    class Meta:
        model = Job
        fields = ["state", "team", "user", "priority", "mine"]

    def filter_mine(self, queryset: QuerySet[Job], name: str, value: bool) -> QuerySet[Job]:
        if value is None:
            return queryset
        user = self.request.user if self.request else None
        if value:
            return queryset.filter(submitter=user)
        return queryset.exclude(submitter=user)


class QueueFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug", help_text="Team slug.")
    priority = django_filters.CharFilter(field_name="priority_class__name")

    class Meta:
        model = Job
        fields = ["team", "priority"]
