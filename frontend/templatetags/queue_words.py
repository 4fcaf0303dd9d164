"""Template filters of the queue page: why another team's job waits, in words that say nothing of that team."""

from __future__ import annotations

from django import template

from scheduling.jobs.wording import reason_in_general as _reason_in_general

register = template.Library()


@register.filter
def reason_in_general(code: str | None) -> str:
    """Why a job waits, from its reason code alone (scheduling.jobs.wording: the API's `pending_reason_general`)."""
    return _reason_in_general(code)
