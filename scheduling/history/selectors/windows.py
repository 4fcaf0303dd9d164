"""The windows the history pages offer, and the buckets a chart draws: every series is read grouped by bucket.

Times are UTC. `step_s` is the width of a chart's bucket: each bucket is the mean of the rows in it (a minute
table read at step 3600 gives hourly means). Series come as columns for uPlot: `t` (Unix seconds) and one list
per measure, None where a bucket has no row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import QuerySet

from portal.database import BucketStart, TimeBucket
from scheduling.engine import types as eng

MILLI = eng.WHOLE_GPU_MILLI
# Windows the pages offer, and the bucket each is drawn with (about 150-350 points a series).
WINDOWS = {
    "1h": (timedelta(hours=1), 60),
    "6h": (timedelta(hours=6), 120),
    "24h": (timedelta(hours=24), 300),
    "7d": (timedelta(days=7), 3600),
    "30d": (timedelta(days=30), 3 * 3600),
}


@dataclass(frozen=True)
class Window:
    name: str
    since: datetime
    until: datetime
    step_s: int


def window(name: str, *, now: datetime | None = None, default: str = "24h") -> Window:
    """The named window ending now (an unknown name gives the default); a window drawn in hours or more starts
    on the hour (up to an hour short of its name)."""
    name = name if name in WINDOWS else default
    span, step = WINDOWS[name]
    until = (now or datetime.now(UTC)).astimezone(UTC)
    since = until - span
    if step >= 3600:
        # From a whole hour: the hourly rollups (GPU-hours, queue times) then cover the window exactly as the
        # jobs' own records do over it, so the history page and the team page's members count the same hours.
        floor = since.replace(minute=0, second=0, microsecond=0)
        since = floor if floor == since else floor + timedelta(hours=1)
    return Window(name, since, until, step)


def bucketed(rows: QuerySet, *, at: str, step_s: int) -> QuerySet:
    """`rows` with `time_bucket`, the `step_s`-second bucket their `at` falls in: group them by it
    (`.values(..., "time_bucket")`), read each group's `bucket_start()` among its aggregates, and leave the key
    itself out of the values read (`.values_list(...)` without it)."""
    return rows.annotate(time_bucket=TimeBucket(at, step_s=step_s))


def bucket_start() -> BucketStart:
    """The start (Unix s) of the bucket a group of `bucketed` rows is."""
    return BucketStart("time_bucket")


def columns(rows: Iterable[Sequence], names: Sequence[str], *, w: Window) -> dict[str, list]:
    """Rows of (bucket start (Unix s), *measures) into uPlot columns over every bucket of the window (gaps as
    None)."""
    found = {int(r[0]): r[1:] for r in rows}
    first = math.floor(w.since.timestamp() / w.step_s) * w.step_s
    ts = list(range(first, int(w.until.timestamp()) + 1, w.step_s))
    out: dict[str, list] = {"t": ts}
    for i, name in enumerate(names):
        out[name] = [
            None if found.get(t) is None or found[t][i] is None else round(float(found[t][i]), 3) for t in ts
        ]
    return out
