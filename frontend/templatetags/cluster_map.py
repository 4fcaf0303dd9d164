"""The cluster map's GPU cell, built in Python: a page may hold a thousand of them, and one format_html per cell
renders several times faster than an included template. The cell and its aria-label say the same facts; the
page's script shows the label as the cell's hover text (not sent twice: a page of 120 nodes is big enough)."""

from __future__ import annotations

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from frontend.cluster import team_colour
from frontend.templatetags.portal import gib
from scheduling.choices import GpuHealth
from scheduling.inventory.cluster_map import GpuCell, SliceHolder, team_colour_index

register = template.Library()


def _slice_words(s: SliceHolder, card_mib: int) -> str:
    size = f"{gib(s.memory_mib)} + {s.compute_pct}%" if s.memory_mib < card_mib else "the whole card"
    releasing = " (releasing: the job has ended, its node has not confirmed the stop)" if s.releasing else ""
    if not s.mine:
        return f"another team: {size}{releasing}"
    return f"job {s.job_id} {s.job_name} ({s.user}, {s.team}): {size}{releasing}"


def cell_words(cell: GpuCell) -> str:
    """What the cell shows, in words (its aria-label and its hover text)."""
    util = cell.util_pct
    used = cell.memory_used_mib
    parts = [f"GPU {cell.index}, {cell.model}"]
    parts.append(
        f"utilisation {round(util)}%" if util is not None else "utilisation unknown (no recent sample)"
    )
    if used is not None:
        parts.append(f"{gib(used)} of {gib(cell.memory_mib)} memory in use")
    if not cell.slices:
        parts.append("free" if not cell.allocated else f"{gib(cell.allocated_memory_mib)} allocated")
    else:
        held = f"{gib(cell.allocated_memory_mib)} of {gib(cell.memory_mib)} held"
        count = len(cell.slices)
        parts.append(
            f"{held} by {count} slice{'s' if count > 1 else ''}: "
            + "; ".join(_slice_words(s, cell.memory_mib) for s in cell.slices)
        )
    if cell.health != GpuHealth.OK:
        parts.append(f"health {cell.health}")
    return ", ".join(parts)


@register.simple_tag
def gpu_cell(cell: GpuCell) -> SafeString:
    # Plain string building with escape() on the text parts: format_html per attribute costs more than the
    # rest of the page at a thousand cells.
    util = cell.util_pct
    segments = "".join(
        '<span class="gpu-slice{}" style="width:{}%;{}" title="{}"></span>'.format(
            "" if s.mine else " anon",
            round(100 * min(1.0, s.memory_mib / cell.memory_mib), 2) if cell.memory_mib else 0,
            f"background:{team_colour(s.team)}" if s.mine else "",
            escape(_slice_words(s, cell.memory_mib)),
        )
        for s in cell.slices
    )
    words = escape(cell_words(cell))
    fill = 0 if util is None else round(min(100.0, max(0.0, util)), 1)
    return mark_safe(  # noqa: S308 - every text part above is escaped, the rest are numbers and our names
        f'<div class="gpu-cell {"allocated" if cell.allocated else "free"} health-{escape(cell.health)}" '
        f'role="img" aria-label="{words}" data-gpu="{cell.index}" data-mib="{cell.memory_mib}">'
        f'<span class="gpu-fill" style="height:{fill}%"></span>'
        f'<span class="gpu-util">{"–" if util is None else f"{round(util)}%"}</span>'
        f'<span class="gpu-index" aria-hidden="true">{cell.index}</span>'
        f'<span class="gpu-slices">{segments}</span></div>'
    )


@register.filter
def group_id(name: str) -> str:
    """A stable element id for a group, whatever characters its name has."""
    return f"group-{team_colour_index(name, 2**32):08x}"


@register.filter
def colour_of(slug: str | None) -> str:
    return team_colour(slug)
