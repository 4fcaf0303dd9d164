"""The job page's GPU charts: utilisation and memory in use, one line per card the job held, on an axis from the
job's start to its end (to now while it runs). What the portal's history kept of its cards is drawn when the page
opens, so a finished job keeps its charts; while it runs, job.js adds the stream's samples (charts.js reads the
JSON this writes)."""

from __future__ import annotations

from django.utils import timezone

from scheduling.choices import JobState
from scheduling.history.selectors.jobs import JobGpuHistory, job_cards, job_gpu_history
from scheduling.jobs.states import ACTIVE_STATES, TERMINAL_STATES


def _placed_cards(events) -> list:
    """The cards of the job's latest placement, from its record (a finished job's cards were given back)."""
    placed = next((e for e in reversed(events) if e.to_state == JobState.PLACED), None)
    assigned = (placed.data or {}).get("gpus", []) if placed is not None else []
    return job_cards(assigned=[a for a in assigned if isinstance(a, list | tuple)])


def job_charts(*, job, events) -> dict | None:
    """The two charts' specs and what to say beside them; None for a job that ended without running. A job that
    has not started yet gets empty charts, for the samples that come once it runs (their first one starts the
    axis)."""
    cards = _placed_cards(events)
    started = job.started_at
    if started is None:
        if job.state in TERMINAL_STATES:
            return None
        history = JobGpuHistory(cards, [], {}, {})
        running, until, x = True, None, {"min": None, "max": None}
    else:
        running = job.state in ACTIVE_STATES
        if running:
            until = timezone.now()
        else:
            until = job.finished_at or (events[-1].at if events else timezone.now())
        until = max(until, started)
        history = job_gpu_history(cards=cards, since=started, until=until)
        x = {"min": started.timestamp(), "max": None if running else until.timestamp()}
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
        "started": started is not None,
        "running": running,
        "sampled": bool(history.t),
        "seconds": (until - started).total_seconds() if started is not None else None,
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
