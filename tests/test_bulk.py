"""insert_missing writes small batches with one INSERT … VALUES and large ones with COPY through a
staging table: both must insert the same rows, skip the same conflicts and refuse the same bad values.
update_rows sets each row its own values in one statement per batch, guarded."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from django.db import DataError, transaction

from fleet.models import Component
from opsplanner.bulk import VALUES_BATCH, insert_missing, update_rows
from opsplanner.models import Event, HostTask, Operation, WorkItem
from tests.builders import make_host

pytestmark = pytest.mark.django_db

SIZES = [pytest.param(3, id="values"), pytest.param(VALUES_BATCH + 5, id="copy")]
COLUMNS = ["name", "display_name", "layer", "needs_reboot", "needs_drain"]


def components(count: int, prefix: str = "part") -> list[tuple[str, str, str, bool, bool]]:
    return [(f"{prefix}-{n}", f"Part {n}", "lower_level", True, n % 2 == 0) for n in range(count)]


@pytest.mark.parametrize("size", SIZES)
def test_it_inserts_new_rows_and_skips_the_ones_already_there(size: int) -> None:
    assert insert_missing(Component, COLUMNS, components(size)[:2]) == 2
    assert insert_missing(Component, COLUMNS, components(size)) == size - 2
    assert Component.objects.filter(name__startswith="part-").count() == size
    assert Component.objects.get(name="part-1").needs_drain is False


@pytest.mark.parametrize("size", SIZES)
def test_it_refuses_a_value_too_long_for_its_column_instead_of_cutting_it(size: int) -> None:
    rows = components(size)
    rows[-1] = ("x" * 64, "too long a name", "lower_level", True, True)
    # COPY raises psycopg's own error (it bypasses Django's cursor wrapper), VALUES Django's.
    with pytest.raises((DataError, psycopg.DataError), match="too long"), transaction.atomic():
        insert_missing(Component, COLUMNS, rows)
    assert not Component.objects.filter(name__startswith="part-").exists()


@pytest.mark.parametrize("size", SIZES)
def test_json_columns_take_json_text(size: int) -> None:
    at = dt.datetime(2030, 1, 7, tzinfo=dt.UTC)
    rows = [(at, "bulk.test", "tester", "test", n, "", f'{{"n": {n}, "tags": ["a"]}}') for n in range(size)]
    columns = ["created_at", "kind", "actor", "subject_type", "subject_id", "reason", "data"]
    assert insert_missing(Event, columns, rows) == size
    event = Event.objects.get(kind="bulk.test", subject_id=size - 1)
    assert event.data == {"n": size - 1, "tags": ["a"]}
    assert event.created_at == at


@pytest.mark.parametrize("size", SIZES)
def test_update_rows_gives_each_row_its_own_values_and_leaves_the_others(size: int) -> None:
    insert_missing(Component, COLUMNS, components(size))
    ids = dict(Component.objects.filter(name__startswith="part-").values_list("name", "id"))
    changed = [(ids[f"part-{n}"], f"Renamed {n}", n % 3 == 0) for n in range(size - 1)]

    update_rows(Component, ["display_name", "needs_drain"], changed)

    rows = dict(Component.objects.filter(name__startswith="part-").values_list("name", "display_name"))
    assert [rows[f"part-{n}"] for n in range(size)] == [*(f"Renamed {n}" for n in range(size - 1)), f"Part {size - 1}"]
    drains = dict(Component.objects.filter(name__startswith="part-").values_list("name", "needs_drain"))
    assert [drains[f"part-{n}"] for n in range(size - 1)] == [n % 3 == 0 for n in range(size - 1)]


def test_update_rows_changes_only_the_rows_its_guard_allows_and_takes_json_and_times() -> None:
    host = make_host()
    operation = Operation.objects.create(kind="reboot", reason="r", scope="s", requester="t", priority=100)
    task = HostTask.objects.create(operation=operation, host=host, pool_id=host.pool_id, priority=100)
    items = [
        WorkItem.objects.create(
            kind=kind, host=host, host_task=task, pool_id=host.pool_id, adapter="simulated", state=state
        )
        for kind, state in (("drain", "running"), ("execute", "ready"))
    ]
    at = dt.datetime(2026, 11, 24, 12, 30, tzinfo=dt.UTC)

    update_rows(
        WorkItem,
        ["state", "result", "finished_at"],
        [(item.pk, "failed", {"versions": {"bios": "2.16.0"}, "n": item.pk}, at) for item in items],
        where={"state": "running"},
    )

    first, second = (WorkItem.objects.get(pk=item.pk) for item in items)
    assert (first.state, first.result, first.finished_at) == (
        "failed",
        {"versions": {"bios": "2.16.0"}, "n": first.pk},
        at,
    )
    assert (second.state, second.result, second.finished_at) == ("ready", {}, None)
