"""Query parameters, read one way by every endpoint, and the schema that says so (portal.api_schema puts these
schemas on the filters).

A parameter given must have a value: `?team=` is refused, leave it out instead. Text holds no NUL character.
A boolean is `true` or `false`. A whole number is ASCII digits with an optional minus, within the parameter's
range; an id's range is 1 to 2**63 - 1, every id a row can have (beyond it a database cannot even compare). A moment is a day (`2026-01-31`, read as midnight UTC) or an RFC 3339 date-time
(`2026-01-31T09:30:00Z`, `2026-01-31T09:30:00.25+02:00`), written with a year from 1970 to 9998. Each refusal is
a 400 naming the parameter.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any

import django_filters
from django import forms
from django.db import models
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.rest_framework import FilterSet as DrfFilterSet

from portal.api_errors import ApiError

MAX_ID = 2**63 - 1  # the largest id a row can have: a signed 64-bit integer
EARLIEST_YEAR = 1970
LATEST_YEAR = 9998  # a year 9998 moment in any offset is still a datetime in UTC (9999 may not be)

# What str.strip() takes away (str.isspace()), as a regex character class: text of only these is blank.
WHITESPACE = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def text_pattern(*, blank: bool) -> str:
    """Text without NUL (what PostgreSQL stores); with blank=False, something besides whitespace in it."""
    return "^[^\\x00]*$" if blank else f"^[{WHITESPACE}]*[^\\x00{WHITESPACE}][^\\x00]*$"


def trimmed_text_pattern(*, min_length: int | None, max_length: int | None, blank: bool) -> str:
    """Text as DRF's CharField takes it: no NUL, its length counted once trimmed of whitespace (so the schema's
    minLength and maxLength, which count the whitespace too, cannot say it)."""
    edge = f"[^\\x00{WHITESPACE}]"
    low = max(min_length or 1, 1)
    inner = f"{{{max(low - 2, 0)},{'' if max_length is None else max_length - 2}}}"
    content = edge if max_length == 1 else f"{edge}(?:[^\\x00]{inner}{edge}){'?' if low <= 1 else ''}"
    return f"^[{WHITESPACE}]*(?:{content}){'?' if blank else ''}[{WHITESPACE}]*$"


# What the schema says of a text parameter: at least one character, none of them NUL.
TEXT_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "pattern": "^[^\\x00]+$"}
# The year as written, 1970 to 9998: a prefix both forms of a moment share.
_YEAR_PATTERN = "^(19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-"
MOMENT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "anyOf": [{"format": "date"}, {"format": "date-time"}],
    "pattern": _YEAR_PATTERN,
}
MOMENT_HELP = (
    "A day (2026-01-31, midnight UTC) or an RFC 3339 date-time with its offset (2026-01-31T09:30:00Z, "
    f"2026-01-31T09:30:00.25+02:00), in the years {EARLIEST_YEAR} to {LATEST_YEAR}."
)

_DAY = re.compile(r"(\d{4})-(\d{2})-(\d{2})", re.ASCII)
_DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)


def value_problem(raw: str) -> str | None:
    """Why a query value given is refused whatever the parameter, or None."""
    if raw == "":
        return "give a value, or leave the parameter out."
    if "\x00" in raw:
        return "must not contain NUL characters."
    return None


def query_value(request: Any, name: str) -> str | None:
    """The parameter's value, None when it is not given; refused (400) when empty or holding a NUL."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    problem = value_problem(raw)
    if problem:
        raise ApiError(f"{name}: {problem}", field=name)
    return raw


def whole_number_problem(raw: str, *, low: int, high: int | None) -> tuple[int | None, str | None]:
    """(the number, None), or (None, why not): digits as written (int() would also take " 5", "+5", "5_0" and
    other scripts' digits), from low to high (no upper bound for None)."""
    try:
        value = int(raw) if re.fullmatch(r"-?[0-9]+", raw) else None
    except ValueError:  # more than 4300 digits
        value = None
    if value is None:
        return None, f"must be a whole number (got {raw[:40]!r})."
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
        return None, f"must be {bounds} (got {raw[:40]})."
    return value, None


def int_param(request: Any, name: str, *, low: int, high: int | None, default: int | None) -> int | None:
    """A whole number between low and high (no upper bound for None), or `default` when not given."""
    raw = query_value(request, name)
    if raw is None:
        return default
    value, problem = whole_number_problem(raw, low=low, high=high)
    if problem:
        raise ApiError(f"{name} {problem}", field=name, limit=high)
    return value


def moment_problem(raw: str) -> tuple[datetime | None, str | None]:
    """(the moment in UTC, None), or (None, why not): see the module docstring for the forms taken."""
    day = _DAY.fullmatch(raw)
    stamp = None if day else _DATE_TIME.fullmatch(raw)
    if not day and not stamp:
        return None, f"give a day (2026-01-31) or an RFC 3339 date-time with its offset (got {raw[:40]!r})."
    year = int((day or stamp).group(1))
    if not EARLIEST_YEAR <= year <= LATEST_YEAR:
        return None, f"the year must be from {EARLIEST_YEAR} to {LATEST_YEAR} (got {raw[:40]!r})."
    # The shape is checked above (the standard library also takes forms RFC 3339 has not); the standard library
    # reads it. Digits past the microsecond are below what is stored: dropped, as the database would.
    if stamp and stamp.group(11) and int(stamp.group(11)) > 59:  # the library reads "+05:60" as "+06:00"
        return None, f"no such day or time (got {raw[:40]!r})."
    try:
        if day:
            return datetime.combine(date.fromisoformat(raw), datetime.min.time(), tzinfo=UTC), None
        moment = datetime.fromisoformat(raw.upper())  # RFC 3339 allows "t" and "z"
    except ValueError:
        return None, f"no such day or time (got {raw[:40]!r})."
    return moment.astimezone(UTC), None


def moment_param(request: Any, name: str) -> datetime | None:
    raw = query_value(request, name)
    if raw is None:
        return None
    moment, problem = moment_problem(raw)
    if problem:
        raise ApiError(f"{name}: {problem}", field=name, limit=f"{EARLIEST_YEAR}..{LATEST_YEAR}")
    return moment


# --- Filters (django-filter), for the list endpoints --------------------------------------------------------


class _BooleanField(forms.Field):
    widget = forms.TextInput  # not NullBooleanSelect, which reads anything unknown as "no filter"

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        if value in ("true", "false"):
            return value == "true"
        raise forms.ValidationError(f"give true or false (got {str(value)[:40]!r}).".replace("%", "%%"))


class _IdField(forms.Field):
    def to_python(self, value: Any) -> int | None:
        if value in (None, ""):
            return None
        number, problem = whole_number_problem(str(value), low=1, high=MAX_ID)
        if problem:
            raise forms.ValidationError(problem.replace("%", "%%"))  # django-filter %-formats the message
        return number


class _MomentField(forms.Field):
    def to_python(self, value: Any) -> datetime | None:
        if value in (None, ""):
            return None
        moment, problem = moment_problem(str(value))
        if problem:
            raise forms.ValidationError(problem.replace("%", "%%"))  # django-filter %-formats the message
        return moment


class TextFilter(django_filters.CharFilter):
    query_schema = TEXT_SCHEMA


class BooleanFilter(django_filters.BooleanFilter):
    field_class = _BooleanField
    query_schema = {"type": "boolean"}


class IdFilter(django_filters.NumberFilter):
    """An object's id: a whole number from 1 to MAX_ID. One that names nothing matches nothing; it is not an error."""

    field_class = _IdField
    query_schema = {"type": "integer", "minimum": 1, "maximum": MAX_ID}


class MomentFilter(django_filters.Filter):
    field_class = _MomentField
    query_schema = MOMENT_SCHEMA


class StrictFilterSet(DrfFilterSet):
    """Every list's filters: a filter given with no value (or a NUL) is refused, text and booleans as above."""

    FILTER_DEFAULTS = {
        **DrfFilterSet.FILTER_DEFAULTS,
        models.CharField: {"filter_class": TextFilter},
        models.SlugField: {"filter_class": TextFilter},
        models.TextField: {"filter_class": TextFilter},
        models.BooleanField: {"filter_class": BooleanFilter},
    }

    def is_valid(self) -> bool:
        valid = super().is_valid()
        for name in self.filters:
            values = self.data.getlist(name) if hasattr(self.data, "getlist") else [self.data.get(name)]
            problems = [p for raw in values if raw is not None and (p := value_problem(raw))]
            if problems:
                self.form.errors[name] = self.form.error_class(problems[:1])
                valid = False
        return valid


class FilterBackend(DjangoFilterBackend):
    """django-filter's backend with StrictFilterSet under the filtersets it builds from `filterset_fields`."""

    filterset_base = StrictFilterSet
