"""The one place that knows which database it talks to, and the hand-written SQL of the hot paths.

PostgreSQL (production) takes fast paths: arrays and `unnest`, data-modifying CTEs, `FOR KEY SHARE`,
`date_bin`, repeatable-read snapshots, partitioned history. Every other database (SQLite, the embedded default)
takes the plain path, the ORM's. Code asks `postgresql()` (or `single_writer()`) here; nothing else reads
`connection.vendor`. Where one expression's SQL differs (a chart's time bucket, a duration in seconds), it is an
ORM expression here with a method per database. Model instances from rows of hand-written queries are converted
as the ORM converts them.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction
from django.db.models import BigIntegerField, Field, FloatField, Func, Model, QuerySet


def postgresql() -> bool:
    """Whether PostgreSQL's fast paths apply to the default connection."""
    return connection.vendor == "postgresql"


def single_writer() -> bool:
    """Whether the database takes one writer at a time (SQLite): its writes stay on one thread."""
    return connection.vendor == "sqlite"


def greatest() -> str:
    """The SQL function of the larger of several values (SQLite's scalar MAX)."""
    return "GREATEST" if postgresql() else "MAX"


class TimeBucket(Func):
    """The `step_s`-second bucket (counted from the Unix epoch) a moment falls in: a key to group rows by (an
    annotation named in `.values()`), whose start `BucketStart` reads. On PostgreSQL the key is date_bin's moment (twice
    as fast to group by as arithmetic on the numeric EXTRACT); other databases key on the start's Unix second."""

    arity = 1
    output_field = Field()  # a key to group by, not a value to read

    def __init__(self, moment: Any, *, step_s: int) -> None:
        super().__init__(moment)
        self.step_s = int(step_s)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        moment, params = compiler.compile(self.get_source_expressions()[0])
        return f"date_bin(%s * INTERVAL '1 second', {moment}, TIMESTAMPTZ 'epoch')", (self.step_s, *params)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        moment, params = compiler.compile(self.get_source_expressions()[0])
        return f"(CAST(strftime('%%s', {moment}) AS INTEGER) / %s * %s)", (*params, self.step_s, self.step_s)


class BucketStart(Func):
    """The start of a `TimeBucket` the rows are grouped by, in Unix seconds, read once per group: it is a function
    of the group's key, so it adds nothing to the GROUP BY. (The key's SQL is written twice, in the select list and
    in the GROUP BY, with the same parameters: Django binds them client-side, as it does by default.)"""

    arity = 1
    output_field = BigIntegerField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        bucket, params = compiler.compile(self.get_source_expressions()[0])
        return f"EXTRACT(EPOCH FROM {bucket})::bigint", tuple(params)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        return compiler.compile(self.get_source_expressions()[0])

    def get_group_by_cols(self) -> list:
        return []


class Seconds(Func):
    """A duration (`F("end") - F("start")` of two moments) in seconds, a float: PostgreSQL's interval read
    through EXTRACT; other databases keep a duration as Django does, a bigint of microseconds."""

    arity = 1
    output_field = FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        duration, params = compiler.compile(self.get_source_expressions()[0])
        return f"EXTRACT(EPOCH FROM {duration})::float8", tuple(params)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        duration, params = compiler.compile(self.get_source_expressions()[0])
        return f"({duration}) / 1000000.0", tuple(params)


class UnixSeconds(Func):
    """A moment in Unix seconds, a float (None for NULL), computed by the database: reading 20,000 timestamps as
    datetimes and converting them was a third of the scheduling cycle's read (psycopg parses each one's text with
    a regular expression). PostgreSQL reads it through EXTRACT; SQLite from the ISO text Django stores (UTC),
    whole seconds by strftime and the fraction as written (microseconds kept)."""

    arity = 1
    output_field = FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        moment, params = compiler.compile(self.get_source_expressions()[0])
        return f"EXTRACT(EPOCH FROM {moment})::float8", tuple(params)

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, tuple]:
        moment, params = compiler.compile(self.get_source_expressions()[0])
        return (
            f"(CAST(strftime('%%s', {moment}) AS REAL) + COALESCE(CAST(substr({moment}, 20) AS REAL), 0.0))",
            (*params, *params),
        )


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


def plain_rows(rows: QuerySet) -> list[tuple]:
    """A `values_list` queryset's rows as the database gives them, without Django's converter call per value: for
    aggregate reads of thousands of plain numbers (the history pages' sums), whose callers cast each value
    themselves (PostgreSQL's SUM of integers is a Decimal, SQLite's an int). Not for moments, JSON or booleans,
    which SQLite gives as text and 0/1."""
    sql, params = rows.query.get_compiler(using=rows.db).as_sql()
    return fetch_rows(sql, params)


def update_from_values(
    model: type[Model],
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    where: str = "",
) -> list[int]:
    """Write many rows' `columns` (each row: its primary key, then the columns' new values); the primary keys of
    the rows updated. `where`, an extra condition on the table (aliased `t`), guards the write: a row it excludes
    is not written nor returned.

    On PostgreSQL the rows are COPYed into a temporary table, then one `UPDATE ... FROM` it: a set-based write of
    thousands of rows. Django's bulk_update builds a CASE per column per row (seconds at 20,000 rows); arrays
    bound as parameters (`unnest(%s::int[], ...)`) were quoted value by value in Python, 0.9 s for a cycle's
    18,000 pending rows, which COPY streams in a tenth of that (bench/cluster_scale.py's first cycle). Elsewhere
    (SQLite, in process: no round trips) one guarded UPDATE per row."""
    if not rows:
        return []
    meta = model._meta
    fields = [meta.pk, *(meta.get_field(c) for c in columns)]
    if not postgresql():
        return _update_rows(meta.db_table, fields, rows, where=where)
    assign = ", ".join(f"{f.column} = v.{f.column}" for f in fields[1:])
    pk = meta.pk.column
    guard = f" AND ({where})" if where else ""
    with transaction.atomic(), connection.cursor() as cursor:  # the temporary table's rows live until commit
        values = _copy_to_temporary(cursor, fields, rows)
        cursor.execute(
            f"UPDATE {meta.db_table} AS t SET {assign} FROM {values} AS v WHERE t.{pk} = v.{pk}{guard} "
            f"RETURNING t.{pk}"
        )
        return [r[0] for r in cursor.fetchall()]


def insert_from_values(model: type[Model], columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Insert many rows of `columns` (field names; every value given, auto_now ones too). On PostgreSQL one COPY
    into the table (as update_from_values writes): Django's bulk_create builds a placeholder per value and
    prepares each the ORM's way, seconds for a cycle's 8,000 placements' events and slices. Elsewhere
    bulk_create."""
    if not rows:
        return
    meta = model._meta
    fields = [meta.get_field(c) for c in columns]
    if not postgresql():
        model.objects.bulk_create(
            [model(**{f.attname: v for f, v in zip(fields, row, strict=True)}) for row in rows],
            batch_size=2000,
        )
        return
    names = ", ".join(f.column for f in fields)
    with connection.cursor() as cursor:
        _copy_rows(cursor, f"COPY {meta.db_table} ({names}) FROM STDIN", fields, rows)


# Values of these types go to COPY as they are (the driver writes them); others as the ORM would save them. At
# 20,000 rows of five columns, preparing every value the ORM's way cost most of a second.
_DRIVER_TYPES = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "BigIntegerField",
        "BooleanField",
        "CharField",
        "DateTimeField",
        "ForeignKey",  # given as the primary key it points to
        "IntegerField",
        "PositiveIntegerField",
        "PositiveSmallIntegerField",
        "SmallIntegerField",
        "TextField",
    }
)


def _copy_rows(cursor: Any, copy_sql: str, fields: Sequence[Field], rows: Sequence[Sequence[Any]]) -> None:
    """Stream `rows` (values in `fields`' order) through one `COPY ... FROM STDIN`."""
    prepare = [(i, f) for i, f in enumerate(fields) if f.get_internal_type() not in _DRIVER_TYPES]
    # The driver's cursor under Django's wrapper; its errors raised as Django's (OperationalError, ...), as any
    # statement's are, so callers that retry on those retry a failed COPY too.
    with connection.wrap_database_errors, cursor.cursor.copy(copy_sql) as copy:
        for row in rows:
            if prepare:
                row = list(row)
                for i, f in prepare:
                    row[i] = f.get_db_prep_save(row[i], connection=connection)
            copy.write_row(row)


def _copy_to_temporary(cursor: Any, fields: Sequence[Field], rows: Sequence[Sequence[Any]]) -> str:
    """A temporary table of this session holding `rows` (a column per field, of its name and type), emptied at
    commit and kept for the next write of the same columns; its name. One table per column set, made once per
    connection: a table created and dropped per write is catalog rows written and vacuumed, and cache
    invalidations sent to every backend, several times a cycle."""
    columns = ", ".join(f"{f.column} {f.db_type(connection)}" for f in fields)
    name = f"tessera_values_{zlib.crc32(columns.encode()):08x}"
    cursor.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {name} ({columns}) ON COMMIT DELETE ROWS")
    cursor.execute(f"DELETE FROM {name}")  # an earlier write of the same columns in this transaction
    _copy_rows(cursor, f"COPY {name} FROM STDIN", fields, rows)
    return name


def _update_rows(
    table: str, fields: Sequence[Field], rows: Sequence[Sequence[Any]], *, where: str
) -> list[int]:
    """update_from_values' plain path: each row its own UPDATE, values prepared as the ORM saves them."""
    pk, values = fields[0], fields[1:]
    assign = ", ".join(f"{f.column} = %s" for f in values)
    guard = f" AND ({where})" if where else ""
    sql = f"UPDATE {table} AS t SET {assign} WHERE t.{pk.column} = %s{guard}"
    updated: list[int] = []
    with connection.cursor() as cursor:
        for row in rows:
            params = [
                f.get_db_prep_save(v, connection=connection) for f, v in zip(values, row[1:], strict=True)
            ]
            cursor.execute(sql, [*params, row[0]])
            if cursor.rowcount:
                updated.append(row[0])
    return updated
