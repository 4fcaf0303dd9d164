"""Model instances from rows of hand-written queries, converted as the ORM converts them (hot paths of both apps)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Field, Model


@functools.cache
def _converters(vendor: str, field: Field) -> tuple[Any, list[Any]]:
    """The column and the converters the ORM would apply to it (`vendor` keys the cache per backend)."""
    col = field.get_col(field.model._meta.db_table)
    return col, [*connection.ops.get_db_converters(col), *field.get_db_converters(connection)]


def db_values(fields: Sequence[Field], values: Sequence[Any]) -> list[Any]:
    """Python values of raw column values: SQLite gives text datetimes and 0/1 booleans, JSON comes as text."""
    out = []
    for field, value in zip(fields, values, strict=True):
        col, converters = _converters(connection.vendor, field)
        for convert in converters:
            value = convert(value, col, connection)
        out.append(value)
    return out


def model_from_row(model: type[Model], fields: Sequence[Field], values: Sequence[Any]) -> Model:
    """An instance as a queryset would load it (`fields` in the order of `values`)."""
    return model.from_db(connection.alias, [f.attname for f in fields], db_values(fields, values))


def fetch_rows(sql: str, params: Sequence[Any]) -> list[tuple]:
    """Rows of one hand-written query. Hot paths (submit, token checks) use a few of these: building the same
    ORM queries costs more CPU than PostgreSQL spends answering them."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
