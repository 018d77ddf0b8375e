"""Set-based guarded updates for the fleet file: COPY into a temporary table, then one UPDATE … FROM
on PostgreSQL (a row per call elsewhere). The guard column must still hold the expected value, so a
row someone else changed meanwhile is not overwritten: the caller compares the count."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import connection, models


def json_value(value: Any) -> Any:
    """A JSON column's value as the bulk paths want it: JSON text for COPY, the object elsewhere."""
    return json.dumps(value, sort_keys=True) if connection.vendor == "postgresql" else value


def rows_update(
    model: type[models.Model],
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    guard: str | None = None,
) -> int:
    """Update rows given as (id, [expected value of guard], *values in the order of columns).
    Returns how many rows matched (id and guard)."""
    if not rows:
        return 0
    if connection.vendor != "postgresql":
        return _rows_update_each(model, columns, rows, guard=guard)
    table = model._meta.db_table
    quote = connection.ops.quote_name
    staging = quote(f"staging_update_{table}")
    selected = ["id", *([f"{quote(guard)} AS expected"] if guard else []), *(quote(c) for c in columns)]
    copied = ["id", *(["expected"] if guard else []), *(quote(c) for c in columns)]
    assignments = ", ".join(f"{quote(c)} = s.{quote(c)}" for c in columns)
    condition = f"t.id = s.id AND t.{quote(guard)} = s.expected" if guard else "t.id = s.id"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {staging}")
        cursor.execute(
            f"CREATE TEMP TABLE {staging} ON COMMIT DROP AS SELECT {', '.join(selected)} FROM {table} WITH NO DATA"
        )
        with cursor.cursor.copy(f"COPY {staging} ({', '.join(copied)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(f"UPDATE {table} t SET {assignments} FROM {staging} s WHERE {condition}")
        updated = cursor.rowcount
        cursor.execute(f"DROP TABLE {staging}")
    return updated


def _rows_update_each(
    model: type[models.Model], columns: Sequence[str], rows: Sequence[Sequence[Any]], *, guard: str | None
) -> int:
    updated = 0
    offset = 2 if guard else 1
    for row in rows:
        match: dict[str, Any] = {"pk": row[0], **({guard: row[1]} if guard else {})}
        values = dict(zip(columns, row[offset:], strict=True))
        updated += model._base_manager.filter(**match).update(**values)
    return updated
