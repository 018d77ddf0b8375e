"""The typed contracts between the tick's parts: task references built by name, event rows, the tick's
counters, and the time line the Gantt and the simulation report share."""

from __future__ import annotations

import dataclasses
import datetime as dt

from drawing.timeline import Scale, bar_rect, calendar_ticks, nice_ticks
from opsplanner.events import EVENT_COLUMNS, EventRow, event_row
from opsplanner.models import Event, TaskState
from opsplanner.services.tick.context import OPERATION_FIELDS, TASK_FIELDS, TaskRef, TickCounts


def test_every_taskref_field_is_read_once_by_name() -> None:
    names = [attribute.name for attribute in dataclasses.fields(TaskRef)]
    assert sorted([*TASK_FIELDS, *OPERATION_FIELDS]) == sorted(names)


def test_event_rows_name_the_event_tables_columns() -> None:
    columns = {field.column for field in Event._meta.concrete_fields}
    assert set(EVENT_COLUMNS) <= columns
    row = event_row(kind="x.y", subject_type="fleet.host", subject_id=3, now="2026-01-01T00:00:00", pool_id=2)
    assert isinstance(row, EventRow)
    assert (row.subject_id, row.pool_id, row.actor, row.data) == (3, 2, "scheduler", "{}")


def test_tick_counts_are_fields_and_read_flat_as_logged() -> None:
    counts = TickCounts()
    counts.tasks[TaskState.DONE] += 2
    counts.tasks[TaskState.DRAINING] += 1
    counts.hosts["draining"] += 1
    counts.work_items_created += 4
    assert (counts.tasks_finished, counts.hosts_moved) == (2, 1)
    assert counts["task_done"] == 2
    assert counts["host_draining"] == 1
    assert counts["work_items_created"] == 4
    assert counts["task_failed"] == 0
    assert "task_draining" in list(counts)


def test_the_time_line_scales_ticks_and_bars() -> None:
    scale = Scale(0.0, 100.0, 10.0, 200.0, clamp=True)
    assert (scale(50), scale(-5), scale(500)) == (110.0, 10.0, 210.0)
    assert Scale(10.0, 0.0, 0.0, 100.0)(10.0) == 0.0  # an upward axis: the high value at the top
    ticks = nice_ticks(0.0, 9.5, outward=True)
    assert ticks[0].at <= 0
    assert ticks[-1].at >= 9.5
    assert 4 <= len(ticks) <= 8
    start = dt.datetime(2026, 1, 10, 3, 17, tzinfo=dt.UTC)
    hourly = calendar_ticks(start, start + dt.timedelta(hours=5))
    assert [tick.label for tick in hourly] == ["04:00", "05:00", "06:00", "07:00", "08:00"]
    assert hourly[0].at == 43 * 60
    bar = bar_rect(css="bar done", x1=10.0, x2=10.2, y=1.0, height=4.0, title="a <b>", min_width=2.0)
    assert 'width="2"' in bar
    assert "<title>a &lt;b&gt;</title>" in bar
