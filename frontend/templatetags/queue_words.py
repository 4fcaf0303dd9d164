"""Template filters of the queue page: why another team's job waits, in words that say nothing of that team."""

from __future__ import annotations

from django import template

from scheduling.cycle.liveness import SCHEDULER_STALLED
from scheduling.engine.reasons import CODES

register = template.Library()

# Each code's general sentence (docs/engine.md lists them): the other team's own reason text names its nodes,
# jobs and sizes, which the API keeps from other teams; the code alone is a word for machines.
GENERAL = {
    **CODES,
    SCHEDULER_STALLED: "the scheduler is not running: no job starts until it is back",
    "": "waiting for the next scheduling cycle",
}


@register.filter
def reason_in_general(code: str | None) -> str:
    """Why a job waits, from its reason code alone ("insufficient-gpus" -> "no node has enough free whole GPUs")."""
    return GENERAL.get(code or "", "waiting for its turn in the queue")
