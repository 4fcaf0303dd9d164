"""The job page's GPU charts: utilisation and memory in use, one line per card the job held, on an axis from the
job's start to its end (to now while it runs). What the portal's history kept of its cards is drawn when the page
opens, so a finished job keeps its charts; while it runs, job.js adds the stream's samples (charts.js reads the
JSON this writes)."""

from __future__ import annotations

from django.utils import timezone

from scheduling.choices import JobState
from scheduling.history.selectors.jobs import job_cards, job_gpu_history
from scheduling.jobs.states import ACTIVE_STATES


def _placed_cards(events) -> list:
    """The cards of the job's latest placement, from its record (a finished job's cards were given back)."""
    placed = next((e for e in reversed(events) if e.to_state == JobState.PLACED), None)
    assigned = (placed.data or {}).get("gpus", []) if placed is not None else []
    return job_cards(assigned=[a for a in assigned if isinstance(a, list | tuple)])


def job_charts(*, job, events) -> dict | None:
    """The two charts' specs and what to say beside them; None while the job has not started."""
    if job.started_at is None:
        return None
    running = job.state in ACTIVE_STATES
    if running:
        until = timezone.now()
    else:
        until = job.finished_at or (events[-1].at if events else timezone.now())
    until = max(until, job.started_at)
    cards = _placed_cards(events)
    history = job_gpu_history(cards=cards, since=job.started_at, until=until)
    x = {"min": job.started_at.timestamp(), "max": None if running else until.timestamp()}
    card_gib = max((c.memory_mib for c in cards if c.memory_mib), default=None)

    def spec(measure: str, title: str, values: dict, y: dict) -> dict:
        return {
            "json_id": f"chart-job-{measure}",
            "measure": measure,
            "title": title,
            "t": history.t,
            "series": [{"label": c.label, "values": values.get(c.label, [])} for c in cards],
            "x": x,
            "y": y,
            "sync": f"job-{job.pk}",
            "span_gaps": True,  # a gang's nodes sample at their own instants
        }

    return {
        "running": running,
        "sampled": bool(history.t),
        "seconds": (until - job.started_at).total_seconds(),
        "charts": [
            spec(
                "util_pct",
                "Utilisation",
                history.util_pct,
                {"label": "SM utilisation (%)", "unit": "%", "min": 0, "max": 100},
            ),
            spec(
                "memory_used_gib",
                "Memory in use on the card",
                history.memory_used_gib,
                {
                    "label": "GPU memory in use (GiB)",
                    "unit": "GiB",
                    "min": 0,
                    "max": round(card_gib / 1024, 2) if card_gib else None,
                },
            ),
        ],
    }
