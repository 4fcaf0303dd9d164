"""Template filters of the team, quota and fairness pages: GPU counts and bar widths."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def gpus(value: float | None) -> str:
    """A GPU count as people write it: 4, 2.5, 0.25 (no trailing zeros); empty stays empty."""
    if value is None:
        return ""
    text = f"{float(value):.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


@register.filter
def gpus_noun(value: float | None) -> str:
    """ "GPU" after a count of one, "GPUs" after any other ("1 GPU", "0.5 GPUs", "2 GPUs")."""
    return "GPU" if gpus(value) == "1" else "GPUs"


@register.filter
def pct_of(value: float | None, scale: float | None) -> str:
    """`value` as a percentage of `scale`, for a bar's width (0-100, one decimal)."""
    if not value or not scale:
        return "0"
    return f"{max(0.0, min(100.0, 100.0 * float(value) / float(scale))):.1f}"


@register.filter
def minus(value: float | None, other: float | None) -> float:
    return float(value or 0) - float(other or 0)


@register.filter
def field_label(form, name: str) -> str:
    """The label of a form's field by name (for errors listed away from their field)."""
    field = form.fields.get(name)
    return str(field.label) if field is not None and field.label else name.replace("_", " ")
