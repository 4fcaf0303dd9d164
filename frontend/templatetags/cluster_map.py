"""The cluster map's GPU cell, built in Python: a page may hold a thousand of them, and one format_html per cell
renders several times faster than an included template. The cell and its aria-label say the same facts."""

from __future__ import annotations

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from frontend.cluster import team_colour
from frontend.templatetags.portal import gib
from scheduling.choices import GpuHealth
from scheduling.inventory.cluster_map import GpuCell, SliceHolder, team_colour_index

register = template.Library()


def _slice_words(s: SliceHolder, card_mib: int) -> str:
    size = f"{gib(s.memory_mib)} + {s.compute_pct}%" if s.memory_mib < card_mib else "the whole card"
    if not s.mine:
        return f"another team: {size}"
    return f"job {s.job_id} {s.job_name} ({s.user}, {s.team}): {size}"


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
    util = cell.util_pct
    segments = format_html_join(
        "",
        '<span class="gpu-slice{}" style="width:{}%;{}" title="{}"></span>',
        (
            (
                "" if s.mine else " anon",
                round(100 * min(1.0, s.memory_mib / cell.memory_mib), 2) if cell.memory_mib else 0,
                f"background:{team_colour(s.team)}" if s.mine else "",
                _slice_words(s, cell.memory_mib),
            )
            for s in cell.slices
        ),
    )
    words = cell_words(cell)
    return format_html(
        '<div class="gpu-cell {} health-{}" role="img" aria-label="{}" title="{}" data-gpu="{}" data-mib="{}">'
        '<span class="gpu-fill" style="height:{}%"></span><span class="gpu-util">{}</span>'
        '<span class="gpu-index" aria-hidden="true">{}</span><span class="gpu-slices">{}</span></div>',
        "allocated" if cell.allocated else "free",
        cell.health,
        words,
        words,
        cell.index,
        cell.memory_mib,
        0 if util is None else round(min(100.0, max(0.0, util)), 1),
        "–" if util is None else f"{round(util)}%",
        cell.index,
        segments,
    )


@register.filter
def group_id(name: str) -> str:
    """A stable element id for a group, whatever characters its name has."""
    return f"group-{team_colour_index(name, 2**32):08x}"


@register.filter
def colour_of(slug: str | None) -> str:
    return team_colour(slug)
