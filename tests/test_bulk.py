"""insert_missing writes small batches with one INSERT … VALUES and large ones with COPY through a
staging table: both must insert the same rows, skip the same conflicts and refuse the same bad values."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from django.db import DataError, transaction

from fleet.models import Component
from opsplanner.bulk import VALUES_BATCH, insert_missing
from opsplanner.models import Event

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
