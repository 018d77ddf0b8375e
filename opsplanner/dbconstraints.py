"""Constraints Django cannot declare, as migration operations that work on PostgreSQL and SQLite.

CompositeForeignKey makes (child.a, child.b) reference (parent.x, parent.y). It is how the database
itself guarantees, for instance, that a host's domain belongs to the host's pool. PostgreSQL gets a
real multi-column foreign key; SQLite, which cannot add one to an existing table, gets triggers
with the same effect.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import migrations
from django.db.backends.base.base import BaseDatabaseWrapper


class CompositeForeignKey(migrations.operations.base.Operation):
    reduces_to_sql = True
    reversible = True

    def __init__(
        self,
        *,
        name: str,
        table: str,
        columns: list[str],
        ref_table: str,
        ref_columns: list[str],
        message: str,
    ) -> None:
        self.name = name
        self.table = table
        self.columns = columns
        self.ref_table = ref_table
        self.ref_columns = ref_columns
        self.message = message

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (
            self.__class__.__qualname__,
            [],
            {
                "name": self.name,
                "table": self.table,
                "columns": self.columns,
                "ref_table": self.ref_table,
                "ref_columns": self.ref_columns,
                "message": self.message,
            },
        )

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        return f"Composite foreign key {self.name}"

    def _sqlite_statements(self) -> list[str]:
        message = self.message.replace("'", "''")
        match_parent = " AND ".join(
            f"p.{ref} = NEW.{col}" for col, ref in zip(self.columns, self.ref_columns, strict=True)
        )
        no_null = " AND ".join(f"NEW.{col} IS NOT NULL" for col in self.columns)
        child_check = (
            f"WHEN {no_null} AND NOT EXISTS (SELECT 1 FROM {self.ref_table} p WHERE {match_parent}) "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )
        cols = ", ".join(self.columns)
        ref_cols = ", ".join(self.ref_columns)
        # The parent side: changing a referenced column while children still point at the old pair.
        key = self.ref_columns[0]
        child_key = self.columns[self.ref_columns.index(key)]
        match_child = " AND ".join(
            f"c.{col} = OLD.{ref}" for col, ref in zip(self.columns, self.ref_columns, strict=True)
        )
        changed = " OR ".join(f"NEW.{ref} IS NOT OLD.{ref}" for ref in self.ref_columns)
        return [
            f"CREATE TRIGGER {self.name}_ins BEFORE INSERT ON {self.table} FOR EACH ROW {child_check}",
            f"CREATE TRIGGER {self.name}_upd BEFORE UPDATE OF {cols} ON {self.table} FOR EACH ROW {child_check}",
            f"CREATE TRIGGER {self.name}_parent_upd BEFORE UPDATE OF {ref_cols} ON {self.ref_table} "
            f"FOR EACH ROW WHEN ({changed}) AND EXISTS (SELECT 1 FROM {self.table} c "
            f"WHERE {match_child} AND c.{child_key} IS NOT NULL) "
            f"BEGIN SELECT RAISE(ABORT, '{message}'); END",
        ]

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            schema_editor.execute(
                f"ALTER TABLE {self.table} ADD CONSTRAINT {self.name} "
                f"FOREIGN KEY ({', '.join(self.columns)}) "
                f"REFERENCES {self.ref_table} ({', '.join(self.ref_columns)})"
            )
        elif vendor == "sqlite":
            for statement in self._sqlite_statements():
                schema_editor.execute(statement)
        else:
            raise NotImplementedError(f"CompositeForeignKey does not support {vendor}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE {self.table} DROP CONSTRAINT {self.name}")
        elif vendor == "sqlite":
            for suffix in ("ins", "upd", "parent_upd"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {self.name}_{suffix}")


class SqliteSuspendCompositeForeignKey(CompositeForeignKey):
    """Drop a composite key's SQLite triggers before a migration rebuilds the tables they name
    (SQLite's table remake breaks or loses them); pair with SqliteRestoreCompositeForeignKey.
    PostgreSQL's real foreign key needs neither."""

    def describe(self) -> str:
        return f"Suspend the SQLite triggers of {self.name}"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            CompositeForeignKey.database_backwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            CompositeForeignKey.database_forwards(self, app_label, schema_editor, from_state, to_state)


class SqliteRestoreCompositeForeignKey(CompositeForeignKey):
    def describe(self) -> str:
        return f"Restore the SQLite triggers of {self.name}"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            for suffix in ("ins", "upd", "parent_upd"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {self.name}_{suffix}")
            CompositeForeignKey.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "sqlite":
            CompositeForeignKey.database_backwards(self, app_label, schema_editor, from_state, to_state)


class AppendOnlyTable(migrations.operations.base.Operation):
    """Rows of `table` can be inserted, never updated or deleted: a trigger refuses both with
    `message`, on PostgreSQL and SQLite, whoever asks (the app, the admin, a psql session).
    TRUNCATE, a deliberate whole-table reset (test databases, simulation scratch lanes), still works.
    SQLite loses the triggers when a migration rebuilds the table: suspend and restore around it."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, *, name: str, table: str, message: str) -> None:
        self.name = name
        self.table = table
        self.message = message

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [], {"name": self.name, "table": self.table, "message": self.message})

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def describe(self) -> str:
        return f"Append-only table {self.table} ({self.name})"

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        vendor = schema_editor.connection.vendor
        message = self.message.replace("'", "''")
        if vendor == "postgresql":
            schema_editor.execute(
                f"CREATE FUNCTION {self.name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"RAISE EXCEPTION '{message}' USING ERRCODE = 'integrity_constraint_violation'; END $$"
            )
            schema_editor.execute(
                f"CREATE TRIGGER {self.name} BEFORE UPDATE OR DELETE ON {self.table} "
                f"FOR EACH ROW EXECUTE FUNCTION {self.name}()"
            )
        elif vendor == "sqlite":
            for action in ("update", "delete"):
                schema_editor.execute(
                    f"CREATE TRIGGER {self.name}_{action} BEFORE {action.upper()} ON {self.table} "
                    f"FOR EACH ROW BEGIN SELECT RAISE(ABORT, '{message}'); END"
                )
        else:
            raise NotImplementedError(f"AppendOnlyTable does not support {vendor}")

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        vendor = schema_editor.connection.vendor
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {self.name} ON {self.table}")
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {self.name}()")
        elif vendor == "sqlite":
            for action in ("update", "delete"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {self.name}_{action}")


@contextmanager
def sqlite_triggers_lifted(connection: BaseDatabaseWrapper, *, table: str) -> Iterator[None]:
    """On SQLite, drop the triggers of `table` for the block and put the same ones back after it
    (for a deliberate reset of a scratch database); elsewhere, nothing."""
    if connection.vendor != "sqlite":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [table])
        triggers = cursor.fetchall()
        for name, _ in triggers:
            cursor.execute(f'DROP TRIGGER "{name}"')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for _, sql in triggers:
                cursor.execute(sql)
