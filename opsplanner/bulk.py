"""Set-based inserts that skip rows already present: COPY on PostgreSQL, bulk_create elsewhere.

Used where many rows are written at once (seeding a 100,000-host fleet, later the admission step).
Rows already present (by any unique constraint) are left untouched, which makes callers idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, models, transaction

SQLITE_BATCH = 500
# Up to this many rows, one INSERT … VALUES: the COPY path's temporary table costs more than it saves.
VALUES_BATCH = 200


def insert_missing(model: type[models.Model], columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Insert rows (tuples in the order of columns, which are column names); return how many were new."""
    rows = list(rows)
    if not rows:
        return 0
    if connection.vendor == "postgresql":
        if len(rows) <= VALUES_BATCH:
            return _values_insert_missing(model, columns, rows)
        return _copy_insert_missing(model._meta.db_table, columns, rows)
    before = model._default_manager.count()
    model._default_manager.bulk_create(
        [model(**dict(zip(columns, row, strict=True))) for row in rows],
        ignore_conflicts=True,
        batch_size=SQLITE_BATCH,
    )
    return model._default_manager.count() - before


def _values_insert_missing(model: type[models.Model], columns: Sequence[str], rows: list[Sequence[Any]]) -> int:
    """One INSERT … VALUES … ON CONFLICT DO NOTHING, each value cast to its column's type (JSON
    columns take JSON text, as with COPY)."""
    types = {field.column: _cast_type(field.db_type(connection) or "") for field in model._meta.concrete_fields}
    row_sql = "(" + ", ".join(f"%s::{types[column]}" for column in columns) + ")"
    quoted = ", ".join(connection.ops.quote_name(column) for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {model._meta.db_table} ({quoted}) VALUES {', '.join([row_sql] * len(rows))} "
            "ON CONFLICT DO NOTHING",
            [value for row in rows for value in row],
        )
        return cursor.rowcount


def _cast_type(db_type: str) -> str:
    """The type to cast a value to: without length or precision (an explicit cast to varchar(64)
    would cut a longer value where inserting it fails, as COPY does)."""
    base = db_type.split("(")[0].strip()
    return {"varchar": "text", "bigserial": "bigint", "serial": "integer", "smallserial": "smallint"}.get(base, base)


def _copy_insert_missing(table: str, columns: Sequence[str], rows: list[Sequence[Any]]) -> int:
    quoted = ", ".join(connection.ops.quote_name(column) for column in columns)
    staging = connection.ops.quote_name(f"staging_{table}")
    with transaction.atomic(), connection.cursor() as cursor:
        # A column-typed copy of the target without its constraints, dropped with the transaction.
        cursor.execute(f"DROP TABLE IF EXISTS {staging}")
        cursor.execute(f"CREATE TEMP TABLE {staging} ON COMMIT DROP AS SELECT {quoted} FROM {table} WITH NO DATA")
        with cursor.cursor.copy(f"COPY {staging} ({quoted}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM {staging} ON CONFLICT DO NOTHING")
        inserted = cursor.rowcount
        cursor.execute(f"DROP TABLE {staging}")
    return inserted


def copy_rows(model: type[models.Model], columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Insert rows as they are (a conflict raises): COPY on PostgreSQL, bulk_create elsewhere.
    JSON columns are given as JSON text."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        json_columns = {f.column for f in model._meta.fields if isinstance(f, models.JSONField)}
        model._default_manager.bulk_create(
            [
                model(**{c: (json.loads(v) if c in json_columns else v) for c, v in zip(columns, row, strict=True)})
                for row in rows
            ],
            batch_size=SQLITE_BATCH,
        )
        return
    quoted = ", ".join(connection.ops.quote_name(column) for column in columns)
    # One statement, atomic by itself: no savepoint (two more round trips) inside a caller's transaction.
    with (
        transaction.atomic(savepoint=False),
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {model._meta.db_table} ({quoted}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(row)


def update_rows(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    where: dict[str, Any] | None = None,
) -> None:
    """Set each row's own values: rows are (primary key, then one value per field, as Python values).
    One UPDATE … FROM (VALUES …) on PostgreSQL, one executemany elsewhere, not one UPDATE per row;
    `where` adds field = value conditions each row must also meet (a guard on its state)."""
    rows = list(rows)
    if not rows:
        return
    targets = [_field(model, model._meta.pk.name), *(_field(model, name) for name in fields)]
    guards = [(_field(model, name), value) for name, value in (where or {}).items()]
    quote, table, key = connection.ops.quote_name, model._meta.db_table, _column(targets[0])
    params = [[f.get_db_prep_save(value, connection) for f, value in zip(targets, row, strict=True)] for row in rows]
    guard_sql = "".join(f" AND t.{quote(_column(f))} = %s" for f, _ in guards)
    guard_values = [f.get_db_prep_save(value, connection) for f, value in guards]
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            assignments = ", ".join(f"{quote(_column(f))} = %s" for f in targets[1:])
            cursor.executemany(
                f"UPDATE {table} AS t SET {assignments} WHERE t.{quote(key)} = %s{guard_sql}",
                [[*row[1:], row[0], *guard_values] for row in params],
            )
            return
        names = ["pk", *(f"v{i}" for i in range(len(fields)))]
        row_sql = "(" + ", ".join(f"%s::{_cast_type(f.db_type(connection) or '')}" for f in targets) + ")"
        assignments = ", ".join(f"{quote(_column(f))} = v.{n}" for f, n in zip(targets[1:], names[1:], strict=True))
        for start in range(0, len(params), VALUES_BATCH):
            batch = params[start : start + VALUES_BATCH]
            cursor.execute(
                f"UPDATE {table} AS t SET {assignments} FROM (VALUES {', '.join([row_sql] * len(batch))}) "
                f"AS v({', '.join(names)}) WHERE t.{quote(key)} = v.pk{guard_sql}",
                [value for row in batch for value in row] + guard_values,
            )


def _field(model: type[models.Model], name: str) -> models.Field:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field), f"{model.__name__}.{name} is not a concrete field"
    return field


def _column(field: models.Field) -> str:
    assert field.column is not None  # a concrete field has a column
    return field.column
