"""Closing the operations whose last task finished: in a pool's tick, those it touched; otherwise a
sweep of every open operation.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import NamedTuple

from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet

from opsplanner import clock
from opsplanner.events import EventRow, events_copy_rows
from opsplanner.models import OPEN_TASK_STATES, HostTask, Operation, OperationState
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate
from opsplanner.services.tick.context import ACTOR, SUBJECT_OPERATION, TickContext


class _Finished(NamedTuple):
    id: int
    cancelled: bool  # someone cancelled it while tasks were under way: it closes cancelled


def _finished_operations(ids: Collection[int] | None = None) -> QuerySet[Operation, tuple[int, bool]]:
    """The open operations with no open task left (among `ids`, when given), locked, skipping those
    another transaction holds; each with whether it was cancelled."""
    still_open = HostTask.objects.filter(operation=OuterRef("pk"), state__in=OPEN_TASK_STATES)
    finished = Operation.objects.filter(state=OperationState.OPEN).exclude(Exists(still_open))
    if ids is not None:
        finished = finished.filter(pk__any=ids)
    cancelled = ExpressionWrapper(Q(cancelled_at__isnull=False), output_field=BooleanField())
    return (
        finished.select_for_update(skip_locked=True, no_key=True)
        .annotate(cancelled=cancelled)
        .values_list("id", "cancelled")
    )


# A pool's tick closes the operations it touched: compiled once (opsplanner/prepared.py).
_FINISHED_AMONG = PreparedQuery(lambda *, ids: _finished_operations(ids), ids=IDS)


def _operations_close(state: OperationState) -> PreparedUpdate:
    return PreparedUpdate(
        lambda *, ids, now: Operation.objects.filter(pk__any=ids, state=OperationState.OPEN),
        lambda *, ids, now: {"state": state, "closed_at": now},
        ids=IDS,
        now=dt.datetime,
    )


# How a finished operation closes, by whether it was cancelled: the tick's counter, the update, the event.
_CLOSED_AS = {
    False: ("operations_completed", _operations_close(OperationState.COMPLETED), "operation.completed"),
    True: ("operations_cancelled", _operations_close(OperationState.CANCELLED), "operation.cancelled"),
}


def operations_close_finished(*, ctx: TickContext | None = None) -> int:
    """Close the open operations with no open task left, with an event each; return how many. They
    complete, or end cancelled when someone cancelled them while tasks were under way.
    In a pool's tick (`ctx`) only the operations whose tasks it finished, their events written with
    the tick's; without, a sweep of every open operation (one over several pools whose last tasks
    finished in two ticks at once). Rows another transaction holds are skipped: it, or the next
    sweep, closes them."""
    if ctx is not None and not ctx.touched_operations:
        return 0
    with transaction.atomic(savepoint=False):  # inside a tick: its transaction, no savepoint
        rows = _finished_operations() if ctx is None else _FINISHED_AMONG.rows(ids=ctx.touched_operations)
        finished = [_Finished(*row) for row in rows]
        if not finished:
            return 0
        now = ctx.now if ctx is not None else clock.now()
        stamp, pool_id = (ctx.stamp, ctx.pool.pk) if ctx is not None else (now, None)
        events = []
        for cancelled, (counter, close, kind) in _CLOSED_AS.items():
            ids = [f.id for f in finished if f.cancelled == cancelled]
            if not ids:
                continue
            close.count(ids=ids, now=now)
            events += [EventRow(stamp, kind, None, ACTOR, SUBJECT_OPERATION, i, pool_id, None, "", "{}") for i in ids]
            if ctx is not None:
                setattr(ctx.counts, counter, getattr(ctx.counts, counter) + len(ids))
        if ctx is None:
            events_copy_rows(events)
        else:
            ctx.events.extend(events)  # written with the tick's own, after its task events
    return len(finished)
