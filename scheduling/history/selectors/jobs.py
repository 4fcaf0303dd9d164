"""A job's cards over its own life, from the GPU rollups: what its page charts once the live samples are gone (a
finished job, or a page opened while it runs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from scheduling.history.models import GpuFiveMinute
from scheduling.inventory.models import Gpu

WINDOW_S = 5 * 60  # a GpuFiveMinute row's window


@dataclass(frozen=True)
class Card:
    """One card a job held: where, and how much memory the card has (the memory chart's ceiling)."""

    node: str
    index: int
    memory_mib: int | None
    gpu_id: int | None  # None: no longer in the inventory (its history rows are then out of reach)

    @property
    def label(self) -> str:
        return f"{self.node} GPU {self.index}"


@dataclass(frozen=True)
class JobGpuHistory:
    cards: list[Card]
    t: list[float]  # Unix seconds: each 5-minute window's middle, kept within the job's life
    util_pct: dict[str, list[float | None]]  # card label -> the window's mean utilisation
    memory_used_gib: dict[str, list[float | None]]  # card label -> the window's highest memory in use


def job_cards(*, assigned: Sequence[Sequence]) -> list[Card]:
    """The cards of a placement's record ([node, GPU index, ...] each), with their memory, in node and index
    order; a card named twice (two slices of one card) once."""
    wanted = sorted({(str(a[0]), int(a[1])) for a in assigned if len(a) > 1})
    if not wanted:
        return []
    match = Q()
    for node, index in wanted:
        match |= Q(node__name=node, index=index)
    found = {
        (node, index): (mib, pk)
        for pk, node, index, mib in Gpu.objects.filter(match).values_list(
            "pk", "node__name", "index", "memory_mib"
        )
    }
    return [Card(node, index, *found.get((node, index), (None, None))) for node, index in wanted]


def job_gpu_history(*, cards: Sequence[Card], since: datetime, until: datetime) -> JobGpuHistory:
    """Each card's 5-minute windows that overlap [since, until]: one indexed query. A window's figures are the
    card's, whoever held it then (a card shared by slices, or a window the job only partly ran in, counts its
    other minutes too), which is why the page names the source."""
    empty = JobGpuHistory(list(cards), [], {}, {})
    if not cards or until < since:
        return empty
    label_of = {c.gpu_id: c.label for c in cards if c.gpu_id is not None}
    if not label_of:
        return empty
    first = datetime.fromtimestamp(since.timestamp() // WINDOW_S * WINDOW_S, since.tzinfo)
    rows = (
        GpuFiveMinute.objects.filter(gpu_id__in=label_of, at__gte=first, at__lte=until, samples__gt=0)
        .values_list("gpu_id", "at", "samples", "util_pct_sum", "memory_used_mib_max")
        .order_by("at")
    )
    low, high = since.timestamp(), until.timestamp()
    t: list[float] = []
    util: dict[str, list[float | None]] = {c.label: [] for c in cards}
    memory: dict[str, list[float | None]] = {c.label: [] for c in cards}
    for gpu_id, at, samples, util_sum, memory_max in rows:
        middle = min(high, max(low, at.timestamp() + WINDOW_S / 2))
        if not t or t[-1] != middle:
            t.append(middle)
            for series in (*util.values(), *memory.values()):
                series.append(None)
        label = label_of[gpu_id]
        util[label][-1] = round(util_sum / samples, 1)
        memory[label][-1] = None if memory_max is None else round(memory_max / 1024, 2)
    return JobGpuHistory(list(cards), t, util, memory)
