"""Queries the ORM builds once per process, then runs again with new parameters.

Building and compiling a queryset costs Django 1-2 ms of CPU on this project's machine, whatever
the query; the scheduler tick runs about fifteen per pool, every few seconds, for every pool, so
that was about half of its Python time. A PreparedQuery compiles its queryset once, with markers
in place of its parameters, records where each marker went, and afterwards only puts the values
in and runs the SQL, converting the rows as the ORM would. The queryset is still written with the
ORM, in one place; only its compiling is kept. PreparedUpdate does the same for an UPDATE, and
PreparedModels for a queryset of model instances (with select_related).

PostgreSQL plans a statement again each time it gets its text with the values written in, as the
ORM sends it (the connection binds in the client), and planning was a third of its time in a
simulation. So a compiled query is sent with its parameters apart, through a cursor that binds on
the server, and psycopg prepares it after DATABASE_PREPARE_THRESHOLD runs on a connection;
its constants (states, flags) stay written in the SQL, so the plan PostgreSQL keeps for every
value of the parameters knows them (it plans anew for each value when that plan is no better).

Only on PostgreSQL: elsewhere (the embedded SQLite) the queryset is simply built and run each time.
Parameters are ints, datetimes, strings, or collections of ints (for `field__any`).
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import psycopg
from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Model, QuerySet
from django.db.models.query import ModelIterable, get_related_populators
from django.db.models.sql import UpdateQuery

_MARK = -7_391_000_000_000  # far outside any id, count or version the project stores
_SMALL_MARK = 31_013  # inside any small integer column's range (positive ones too), unlikely as a constant
ParamKind = type[int] | type[dt.datetime] | type[str] | type[Collection[int]]
IDS: type[Collection[int]] = frozenset  # the kind of a parameter that is a collection of ints


@dataclass(frozen=True)
class _Compiled:
    # The SQL with its constants written in as literals, markers left for the parameters only, and
    # per marker the (parameter name, how to fill it).
    sql: str
    slots: tuple[tuple[str, str], ...]
    converters: dict[int, tuple[list[Any], Any]]
    empty: bool  # the query can match nothing whatever the values (Django raised EmptyResultSet)
    shape: _ModelShape | None = None  # how rows become model instances (PreparedModels)


class _Attempt(NamedTuple):
    """One compiling with markers: the statement, or why not (parameters whose markers did not
    reach the SQL; both None: Django found the query can match nothing)."""

    compiled: _Compiled | None
    missing: set[str] | None


def _places(slots: tuple[tuple[str, str] | None, ...]) -> tuple[int, ...]:
    return tuple(i for i, slot in enumerate(slots) if slot)


@dataclass(frozen=True)
class _ModelShape:
    """What Django's ModelIterable works out from the compiler before its first row, kept."""

    model: type[Model]
    init_list: list[str]
    start: int
    end: int
    populators: list[Any]  # django.db.models.query.RelatedPopulator, one per select_related model
    annotations: dict[str, int]

    @classmethod
    def of(cls, compiler: Any, alias: str) -> _ModelShape:
        select, klass_info = compiler.select, compiler.klass_info
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        return cls(
            model=klass_info["model"],
            init_list=[column[0].target.attname for column in select[start:end]],
            start=start,
            end=end,
            populators=get_related_populators(klass_info, select, alias),  # type: ignore[call-arg]  # stubs: Django 6
            annotations=dict(compiler.annotation_col_map or {}),
        )

    def instances(self, rows: list[tuple[Any, ...]], alias: str, *, share_related: bool = False) -> list[Any]:
        """The rows as model instances, their select_related objects set. With `share_related`, a row
        whose related row is the previous row's gets the previous row's instance (one object per
        related row, built once) where the ORM builds one per row."""
        objects = []
        previous: list[tuple[tuple[Any, ...], Any]] = [((), None)] * len(self.populators)
        for row in rows:
            obj = self.model.from_db(alias, self.init_list, row[self.start : self.end])
            for i, populator in enumerate(self.populators):
                if not share_related:
                    populator.populate(row, obj)
                    continue
                key = row[populator.cols_start : populator.cols_end]
                related = previous[i][1] if previous[i][0] == key else _related(populator, row)
                previous[i] = (key, related)
                populator.local_setter(obj, related)
                if related is not None:
                    populator.remote_setter(related, obj)
            for name, position in self.annotations.items():
                setattr(obj, name, row[position])
            objects.append(obj)
        return objects


def _related(populator: Any, row: tuple[Any, ...]) -> Any:
    """The related object a RelatedPopulator would set from `row` (None: no related row), with its
    own related objects set: what RelatedPopulator.populate builds, returned instead of set."""
    reorder = populator.reorder_for_init
    data = reorder(row) if reorder else row[populator.cols_start : populator.cols_end]
    if data[populator.pk_idx] is None:
        return None
    related = populator.model_cls.from_db(populator.db, populator.init_list, data)
    for nested in populator.related_populators:
        nested.populate(row, related)
    return related


class PreparedQuery:
    """`build(**params)` returns a values_list() queryset; `rows(**params)` runs it."""

    _models = False  # rows become model instances (PreparedModels)

    def __init__(self, build: Callable[..., QuerySet[Any]], **kinds: ParamKind) -> None:
        self._build = build
        self._kinds = kinds
        self._compiled: dict[str, _Compiled] = {}  # by database alias
        self._lock = threading.Lock()

    def rows(self, **params: Any) -> list[tuple[Any, ...]]:
        self._check(params)
        if connections["default"].vendor != "postgresql":
            return list(self._build(**params))
        return self._fetched(params)[0]

    def _check(self, params: dict[str, Any]) -> None:
        if set(params) != set(self._kinds):
            raise TypeError(f"expected parameters {sorted(self._kinds)}, got {sorted(params)}")

    def _fetched(self, params: dict[str, Any]) -> tuple[list[tuple[Any, ...]], _Compiled | None]:
        """The rows, converted as the ORM converts them, and the statement that gave them (None:
        nothing could match, and the database was not asked)."""
        # An empty collection of ids matches nothing (`= ANY('{}')`), as the ORM decides without asking.
        connection, compiled, values = self._ready(params)
        if compiled is None:
            return [], None
        with _server_cursor(connection) as cursor:
            cursor.execute(compiled.sql, values)
            rows = cursor.fetchall()
        if compiled.converters:
            rows = [_convert(row, compiled.converters, connection) for row in rows]
        return rows, compiled

    def _compile(self, alias: str) -> _Compiled:
        """The statement, its parameters' places found by compiling with markers in their place:
        first markers far outside any stored value, then, where Django dropped a comparison for
        a marker out of a small integer column's range (EmptyResultSet for `=`, `<`; no condition
        for `>`), markers inside it. Matching nothing with both, the query can match nothing."""
        tried: list[_Attempt] = []
        for base in (_MARK, _SMALL_MARK):
            attempt = self._attempt(alias, base)
            if attempt.compiled is not None:
                return attempt.compiled
            tried.append(attempt)
        if all(attempt.missing is None for attempt in tried):
            return _Compiled("", (), {}, empty=True)
        missing = next(attempt.missing for attempt in tried if attempt.missing is not None)
        raise ValueError(f"parameters {sorted(missing)} do not reach the SQL as values; prepare another way")

    def _attempt(self, alias: str, base: int) -> _Attempt:
        markers = {name: _marker(kind, position, base) for position, (name, kind) in enumerate(self._kinds.items())}
        compiler = self._compiler(alias, markers)
        try:
            sql, sql_params = compiler.as_sql()
        except EmptyResultSet:
            return _Attempt(None, None)
        slots = self._slots(markers, sql_params)
        missing = set(markers) - {slot[0] for slot in slots if slot}
        if missing:
            return _Attempt(None, missing)
        if base == _SMALL_MARK and self._slot_places(alias, base - 1000) != _places(slots):
            # A marker inside a column's range may equal a constant of the query: the places where
            # other markers give other values are the parameters' places; elsewhere, a constant.
            raise ValueError("a constant of the query equals a marker of its parameters; prepare another way")
        converters = {}
        if getattr(compiler, "select", None) is not None:
            select = [column[0] for column in compiler.select[: compiler.col_count]]
            converters = compiler.get_converters(select)
        shape = _ModelShape.of(compiler, alias) if self._models else None
        compiled = _Compiled(
            _constants_inlined(connections[alias], sql, slots, sql_params),
            tuple(slot for slot in slots if slot),
            converters,
            empty=False,
            shape=shape,
        )
        return _Attempt(compiled, None)

    def _slots(self, markers: dict[str, Any], sql_params: Any) -> tuple[tuple[str, str] | None, ...]:
        """Per parameter of the SQL, the prepared parameter it is (name, how to fill it), or None."""
        found: dict[Any, tuple[str, str]] = {}
        for name, marker in markers.items():
            if self._kinds[name] is IDS:
                (value,) = marker
                found["{" + str(value) + "}"] = (name, "array")
            else:
                found[marker] = (name, "value")
        return tuple(found.get(param) if _hashable(param) else None for param in sql_params)

    def _slot_places(self, alias: str, base: int) -> tuple[int, ...]:
        markers = {name: _marker(kind, position, base) for position, (name, kind) in enumerate(self._kinds.items())}
        _, sql_params = self._compiler(alias, markers).as_sql()
        return _places(self._slots(markers, sql_params))

    def _compiler(self, alias: str, markers: dict[str, Any]) -> Any:
        return self._build(**markers).query.get_compiler(using=alias)

    def _ready(self, params: dict[str, Any]) -> tuple[Any, _Compiled | None, list[Any]]:
        """The connection, the compiled statement (None: nothing can match) and its values."""
        alias = "default"
        connection = connections[alias]
        if any(self._kinds[name] is IDS and not params[name] for name in params):
            return connection, None, []
        compiled = self._compiled.get(alias)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(alias) or self._compile(alias)
                self._compiled[alias] = compiled
        if compiled.empty:
            return connection, None, []
        values = [_fill(how, params[name]) for name, how in compiled.slots]
        return connection, compiled, values


class PreparedUpdate(PreparedQuery):
    """`build(**params)` returns the queryset to update and `values(**params)` what to set (values
    or expressions such as F("id")); `count(**params)` runs the UPDATE and returns how many rows
    it changed, as QuerySet.update() does."""

    def __init__(
        self, build: Callable[..., QuerySet[Any]], values: Callable[..., dict[str, Any]], **kinds: ParamKind
    ) -> None:
        super().__init__(build, **kinds)
        self._values = values

    def count(self, **params: Any) -> int:
        self._check(params)
        if connections["default"].vendor != "postgresql":
            return self._build(**params).update(**self._values(**params))
        connection, compiled, values = self._ready(params)
        if compiled is None:
            return 0
        with _server_cursor(connection) as cursor:
            cursor.execute(compiled.sql, values)
            return cursor.rowcount

    def rows(self, **params: Any) -> list[tuple[Any, ...]]:
        raise TypeError("a PreparedUpdate counts the rows it changes: call count()")

    def _compiler(self, alias: str, markers: dict[str, Any]) -> Any:
        # chain(klass) returns a klass instance; django-stubs types it as the base Query.
        query = cast(UpdateQuery, self._build(**markers).query.chain(UpdateQuery))
        query.add_update_values(self._values(**markers))
        return query.get_compiler(using=alias)


class PreparedModels(PreparedQuery):
    """`build(**params)` returns a queryset of model instances (select_related and slicing allowed,
    not prefetch_related); `objects(**params)` runs it and returns what list(queryset) would.

    With `share_related`, consecutive rows with the same select_related row share one instance of
    it (on PostgreSQL; elsewhere the ORM builds one per row): for a query whose rows repeat their
    related row (an upgrade's phases, each with its upgrade), which is then built once, not per row."""

    _models = True

    def __init__(self, build: Callable[..., QuerySet[Any]], *, share_related: bool = False, **kinds: ParamKind) -> None:
        super().__init__(build, **kinds)
        self._share_related = share_related

    def objects(self, **params: Any) -> list[Any]:
        self._check(params)
        if connections["default"].vendor != "postgresql":
            return list(self._build(**params))
        rows, compiled = self._fetched(params)
        if compiled is None:
            return []
        return cast(_ModelShape, compiled.shape).instances(rows, "default", share_related=self._share_related)

    def rows(self, **params: Any) -> list[tuple[Any, ...]]:
        raise TypeError("a PreparedModels query returns model instances: call objects()")

    def _compiler(self, alias: str, markers: dict[str, Any]) -> Any:
        queryset = self._build(**markers)
        if queryset._iterable_class is not ModelIterable:
            raise TypeError("a PreparedModels query returns model instances: build it without values()")
        if getattr(queryset, "_prefetch_related_lookups", ()):
            raise ValueError("prefetch_related runs more queries; prepare each of them")
        return queryset.query.get_compiler(using=alias)


_PLACEHOLDER = re.compile(r"%%|%s")


def _constants_inlined(connection: Any, sql: str, slots: tuple[Any, ...], params: list[Any]) -> str:
    """The SQL with each constant parameter written in as the literal the client-side binding would
    send (Django's compose_sql), the parameters' markers kept. PostgreSQL then plans a prepared
    statement knowing the constants (the states, the flags), so its generic plan is the one it would
    choose each time."""
    values = iter(zip(slots, params, strict=True))  # slots has one entry per parameter

    def written(match: re.Match[str]) -> str:
        if match.group() == "%%":
            return "%%"
        slot, value = next(values)
        return "%s" if slot is not None else connection.ops.compose_sql("%s", [value]).replace("%", "%%")

    sql = _PLACEHOLDER.sub(written, sql)
    if next(values, None) is not None:
        raise ValueError(f"the SQL has fewer markers than its {len(params)} parameters: {sql}")
    return sql


@contextmanager
def _server_cursor(connection: Any) -> Iterator[Any]:
    """A cursor of the Django connection that binds its parameters on the server (the connection's
    own binds them in the client), so psycopg prepares a statement run again (its prepare_threshold),
    wrapped as Django wraps its cursors."""
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = connection.connection
    # Only these cursors read it: the connection's own, binding in the client, never prepare.
    raw.prepare_threshold = settings.DATABASE_PREPARE_THRESHOLD or None
    cursor = psycopg.Cursor(raw)
    wrapper = _LoggedWithValues if connection.queries_logged else CursorWrapper
    with wrapper(cursor, connection) as wrapped:
        yield wrapped


class _LoggedWithValues(CursorDebugWrapper):
    """Where queries are logged (DEBUG, tests counting them), the statement is logged with its
    values written in, as the ORM's own are, not with the server's $1 markers."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(self.db.ops.compose_sql(sql, params)):
            return CursorWrapper.execute(self, sql, params)


def _marker(kind: ParamKind, position: int, base: int) -> Any:
    if kind is int:
        return base - position if base < 0 else base + position
    if kind is dt.datetime:
        return dt.datetime(1901, 2, 3, 4, 5, 6, position + 1, tzinfo=dt.UTC)
    if kind is str:
        return f"\ufffeprepared-{position}"
    if kind is IDS:
        return frozenset({_marker(int, position + 100, base)})
    raise TypeError(f"a prepared parameter is an int, a datetime, a str or IDS, not {kind!r}")


def _fill(how: str, value: Any) -> Any:
    if how == "array":
        return "{" + ",".join(str(int(item)) for item in value) + "}"
    return value


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _convert(row: tuple[Any, ...], converters: dict[int, tuple[list[Any], Any]], connection: Any) -> tuple[Any, ...]:
    values = list(row)
    for position, (functions, expression) in converters.items():
        value = values[position]
        for function in functions:
            value = function(value, expression, connection)
        values[position] = value
    return tuple(values)
