"""Template filters for the portal: requests in words, sizes, durations and times the browser localises, and when a
live part of a page is re-requested."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from scheduling.jobs.models import Job
from scheduling.jobs.selectors import job_request_fields, pending_reason
from scheduling.jobs.states import TERMINAL_STATES

register = template.Library()


def _an(word: str) -> str:
    return f"an {word}" if word[:1].upper() in "AEIOU" or word[:2].upper() in ("H1", "L4") else f"a {word}"


@register.filter
def gib(mib: int | None) -> str:
    """MiB as people say it: 10240 -> "10 GiB", 512 -> "512 MiB", none -> "0 GiB" (beside "of 640 GiB")."""
    if mib is None:
        return ""
    if mib == 0:
        return "0 GiB"
    if mib >= 1024:
        value = mib / 1024
        return f"{value:.0f} GiB" if value == int(value) or value >= 100 else f"{value:.1f} GiB"
    return f"{mib} MiB"


def _request_in_words(r: dict) -> str:
    models = list(r.get("gpu_models") or ())
    kind = " or ".join(models) if models else "GPU"
    if r.get("gpus"):
        words = f"{r['gpus']} x {kind}"
        if (r.get("nodes") or 1) > 1:
            words = f"{r['nodes']} nodes x {words}"
        return words + {"nvlink": " (NVLink)", "numa": " (one NUMA node)"}.get(r.get("topology") or "", "")
    parts = []
    if r.get("gpu_memory_mib"):
        parts.append(gib(r["gpu_memory_mib"]))
    if r.get("compute_pct"):
        parts.append(f"{r['compute_pct']}%")
    return f"{' + '.join(parts)} of {_an(kind)}"


@register.filter
def team_name(slug: object) -> str:
    """A team's slug that wraps after its '/' and nowhere else: in a narrow table column "ai-lab/training" broke
    at its hyphen ("ai-" over "lab/training"). Each part is kept whole; <wbr> offers the break after the '/'."""
    if slug is None:
        return ""
    parts = str(slug).split("/")
    head = format_html_join("", '<span class="nowrap">{}/</span><wbr>', ((part,) for part in parts[:-1]))
    return head + format_html('<span class="nowrap">{}</span>', parts[-1])


@register.filter
def request_words(job: Job) -> str:
    """What a job asks for, in words: "2 x H100-80GB", "2 nodes x 8 x A100-80GB (NVLink)",
    "10 GiB + 25% of an A100-80GB"."""
    return _request_in_words(job_request_fields(job))


@register.filter
def request_fields_words(fields: dict) -> str:
    """The same, from a request as the queue and the API give it (`job_request_fields`)."""
    return _request_in_words(fields)


@register.filter
def duration(seconds: float | int | None) -> str:
    """A span as people say it: 45 s, 12 min, 3 h 5 min, 2 d 4 h."""
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    if s < 86400:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(round(s / 3600), 24)
    return f"{d} d {h} h" if h else f"{d} d"


@register.filter
def since(moment: datetime | None) -> str:
    """Time from `moment` until now, as `duration` says it."""
    if moment is None:
        return ""
    return duration((timezone.now() - moment).total_seconds())


def _time(value: datetime, style: str, hover: str, text: str) -> str:
    utc = value.astimezone(UTC)
    return format_html(
        '<time datetime="{}" data-style="{}" title="{}">{}</time>',
        utc.isoformat(),
        style,
        f"{hover}{utc:%Y-%m-%d %H:%M:%S} UTC",
        text,
    )


@register.simple_tag
def moment(value: datetime | None, style: str = "relative") -> str:
    """A <time> the page's script shows in the browser's timezone (relative or absolute), the absolute time on
    hover; without script it reads in UTC."""
    if value is None:
        return "–"
    return _time(value, style, "", f"{value.astimezone(UTC):%Y-%m-%d %H:%M} UTC")


@register.filter
def get_item(mapping, key):
    """`mapping[key]` in a template, None when absent."""
    return mapping.get(key) if hasattr(mapping, "get") else None


@register.filter
def terminal(job: Job) -> bool:
    return job.state in TERMINAL_STATES


@register.simple_tag(takes_context=True)
def query(context, **changes) -> str:
    """This page's query string with `changes` applied (None removes a key); never the partial's `part`."""
    params = context["request"].GET.copy()
    params.pop("part", None)
    for key, value in changes.items():
        params.pop(key, None)
        if value not in (None, ""):
            params[key] = value
    return "?" + params.urlencode() if params else "?"


@register.filter
def span_to(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from `start` to `end`."""
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


@register.simple_tag
def elapsed(value: datetime | None) -> str:
    """Time since `value` as a span ("12 min") that the page's script keeps counting."""
    if value is None:
        return ""
    return _time(value, "elapsed", "since ", duration((timezone.now() - value).total_seconds()))


@register.filter
def why_pending(job: Job) -> str:
    """Why a pending job waits, as scheduling.jobs.selectors.pending_reason tells it (the scheduler's own state
    included)."""
    return pending_reason(job)[1] or "Waiting for the next scheduling cycle."


# A live part is re-requested this long after the last of a burst of its events: one request for the burst (a
# job's change comes as job.changed and queue.changed together; a cycle places many jobs in one commit).
REFRESH_DEBOUNCE_MS = 200
_EVENT = re.compile(r"([\w.-]+)(?:\[([^\]]*)\])?")


@register.simple_tag
def refresh_on(events: str, when: str = "") -> str:
    """The hx-trigger of a live part: re-requested on the page's stream `events` (portal.js turns each message into
    `tessera:<type>` on <body>), debounced, and whenever the page catches up (`tessera:catch-up`: its socket
    opened, or every 5 s while it is down). An event may carry an htmx filter of its own
    ("job.changed queue.changed[!!this.querySelector('#why')]"); `when` is one for every trigger, catching up too.
    htmx keeps an event only where its filter is `true` itself, not merely truthy, and reads a bare name in it off
    the event first (`null` is `event.null`)."""

    def trigger(event: str, test: str, modifiers: str) -> str:
        tests = " && ".join(f"({t})" for t in (test, when) if t)
        return f"tessera:{event}{f'[{tests}]' if tests else ''} from:body{modifiers}"

    triggers = [
        trigger(name, test, f" delay:{REFRESH_DEBOUNCE_MS}ms") for name, test in _EVENT.findall(events)
    ]
    return ", ".join([*triggers, trigger("catch-up", "", "")])


@register.simple_tag
def push_on(events: str) -> str:
    """The live attributes of a part the page's socket pushes (scheduling/realtime/parts.py; its view is marked
    `@pushed`): `data-push-on`, the stream's events that change it, which portal.js tells the socket; and its
    hx-trigger, re-requested when the page catches up (its socket opened, or every 5 s while it is down), and on
    `tessera:pull`, which portal.js fires on those events when the socket does not push it to this user."""
    names = " ".join(name for name, _ in _EVENT.findall(events))
    trigger = f"tessera:catch-up from:body, tessera:pull delay:{REFRESH_DEBOUNCE_MS}ms"
    return format_html('hx-trigger="{}" data-push-on="{}"', trigger, names)
