"""The fairness page (/fairness/): the organisation -> team tree with guarantees, holdings, borrowing and fair
shares, and who borrows from whom. Aggregates only, so every signed-in user may see it
(`scheduling.cycle.fairness` says how each number is read, and the lending rule)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from scheduling.cycle.fairness import UNGUARANTEED
from scheduling.cycle.fairness import fairness as fairness_reading
from scheduling.realtime.parts import pushed


def _tree_audience(request: HttpRequest) -> tuple | None:
    """The tree is aggregates only: the same for every signed-in user."""
    return ("everyone",) if request.GET.get("part") == "tree" and request.user.is_authenticated else None


@pushed(_tree_audience)
@login_required
def fairness(request: HttpRequest) -> HttpResponse:
    context = {"nav": "fairness", "f": fairness_reading(), "unguaranteed": UNGUARANTEED}
    template = (
        "frontend/fairness/_tree.html" if request.GET.get("part") == "tree" else "frontend/fairness/page.html"
    )
    return render(request, template, context)
