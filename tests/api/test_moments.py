"""Moments in query parameters (`since`, `until`...): a day or an RFC 3339 date-time with its offset, nothing
looser, each refusal saying why."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from portal.api_params import moment_problem


@pytest.mark.parametrize(
    ("raw", "moment"),
    [
        ("2026-01-31", datetime(2026, 1, 31, tzinfo=UTC)),
        ("2026-01-31T10:00:00Z", datetime(2026, 1, 31, 10, tzinfo=UTC)),
        ("2026-01-31t10:00:00z", datetime(2026, 1, 31, 10, tzinfo=UTC)),
        ("2026-01-31T10:00:00.5+05:30", datetime(2026, 1, 31, 4, 30, 0, 500000, tzinfo=UTC)),
        ("2026-01-31T10:00:00.1234567-05:59", datetime(2026, 1, 31, 15, 59, 0, 123456, tzinfo=UTC)),
    ],
)
def test_a_day_or_an_rfc_3339_moment_is_read_in_utc(raw, moment) -> None:
    assert moment_problem(raw) == (moment, None)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("2026-02-30", "no such day or time"),
        ("2026-01-31T24:00:00Z", "no such day or time"),
        ("2026-01-31T10:00:00+24:00", "no such day or time"),
        ("2026-01-31T10:00:00+05:60", "no such day or time"),
        ("2026-01-31T10:00:00", "with its offset"),  # no offset: which moment is it?
        ("2026-01-31 10:00:00Z", "with its offset"),  # the library takes a space; RFC 3339 here does not
        ("20260131", "give a day"),
        ("1969-12-31", "the year must be from 1970"),
    ],
)
def test_anything_else_is_refused_saying_why(raw, why) -> None:
    moment, problem = moment_problem(raw)
    assert moment is None and why in problem and raw[:40] in problem
