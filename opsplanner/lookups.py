"""`field__any=[...]`: membership in a list, sent to PostgreSQL as one array parameter.

`field__in` with thousands of ids builds thousands of placeholders that Django and psycopg must
compile and split on every call; `= ANY(%s)` sends one array. Other databases get a plain IN.
Use it with lists of values only (not with subqueries).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject
from django.db.models.fields.related_lookups import RelatedIn
from django.db.models.lookups import In


def _any_sql(lookup: In, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
    lhs, lhs_params = lookup.process_lhs(compiler, connection)
    values = [value for value in lookup.rhs if value is not None]
    if not values:
        raise EmptyResultSet
    # Typed like the column: psycopg would send small ints as smallint[], which keeps PostgreSQL
    # from using the column's index.
    array_type = lookup.lhs.output_field.cast_db_type(connection)
    return f"{lhs} = ANY(%s::{array_type}[])", [*lhs_params, values]


@Field.register_lookup
class AnyOf(In):
    lookup_name = "any"

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return _any_sql(self, compiler, connection)


@ForeignObject.register_lookup
class RelatedAnyOf(RelatedIn):
    lookup_name = "any"

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return _any_sql(self, compiler, connection)
