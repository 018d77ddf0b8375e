"""`field__any=[...]`: membership in a list, sent to PostgreSQL as one array parameter.

`field__in` with thousands of ids builds thousands of placeholders that Django and psycopg must
compile and split on every call; `= ANY(%s)` sends one array. Other databases get a plain IN.
Use it with collections of values only (not with subqueries). Django inspects each element of a
list or tuple before the lookup sees it (about 1 µs each): hot paths with thousands of ids pass a
set, which it leaves alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import EmptyResultSet
from django.db.models import Field, ForeignObject, IntegerField
from django.db.models.fields.related_lookups import RelatedIn
from django.db.models.lookups import In


def _all_ints(values: Any) -> bool:
    return isinstance(values, list | tuple | set | frozenset) and all(type(value) is int for value in values)


def _integer_column(lookup: Any) -> bool:
    field = getattr(lookup.lhs, "output_field", None)
    field = getattr(field, "target_field", field)  # a foreign key compares its target's values
    return isinstance(field, IntegerField)


def _any_sql(lookup: In, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
    lhs, lhs_params = lookup.process_lhs(compiler, connection)
    ints = getattr(lookup, "prepared_ints", False)
    values = lookup.rhs if ints else [value for value in lookup.rhs if value is not None]
    if not values:
        raise EmptyResultSet
    # Typed like the column: psycopg would send small ints as smallint[], which keeps PostgreSQL
    # from using the column's index.
    array_type = lookup.lhs.output_field.cast_db_type(connection)
    if ints or _all_ints(values):
        # Ids, the common case (thousands per tick): the array literal as text is one join, where
        # psycopg would dump element by element.
        return f"{lhs} = ANY(%s::{array_type}[])", [*lhs_params, "{" + ",".join(map(str, values)) + "}"]
    return f"{lhs} = ANY(%s::{array_type}[])", [*lhs_params, values]


if TYPE_CHECKING:
    _LookupMixinBase = In  # what the mixin is combined with below
else:
    _LookupMixinBase = object


class _AnyArray(_LookupMixinBase):
    """`= ANY(array)` on PostgreSQL, a plain IN elsewhere."""

    lookup_name = "any"

    def get_prep_lookup(self) -> Any:
        if _integer_column(self) and _all_ints(self.rhs):  # ints for an integer column need no preparing
            self.prepared_ints = True  # checked once, not again when the SQL is written
            return list(self.rhs)
        return super().get_prep_lookup()

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        return _any_sql(self, compiler, connection)


@Field.register_lookup
class AnyOf(_AnyArray, In):
    pass


@ForeignObject.register_lookup
class RelatedAnyOf(_AnyArray, RelatedIn):
    pass
