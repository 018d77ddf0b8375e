"""Closing the operations whose last task finished: in a pool's tick, those it touched; otherwise a
sweep of every open operation.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Collection
from typing import NamedTuple

from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet, Subquery

from opsplanner import clock
from opsplanner.events import EventRow, events_copy_rows
from opsplanner.models import OPEN_TASK_STATES, HostTask, Operation, OperationState, TaskState, WorkItem
from opsplanner.models.work_items import NOT_RUN_KEY, NotRunCode, install_stopped_for_withdrawn_target
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate
from opsplanner.services.tick.context import ACTOR, SUBJECT_OPERATION, TickContext


class _Finished(NamedTuple):
    id: int
    cancelled: bool  # someone cancelled it while tasks were under way: it closes cancelled
    # The stop's words when an install of it was stopped, its target withdrawn, before any executor
    # claimed it (decided by the code: install_stopped_for_withdrawn_target); None otherwise.
    stopped: str | None


def _stopped_install() -> Subquery:
    """The reason of the operation's first install stopped for its withdrawn target, or NULL. Its
    task ended not applied (cancelled), so only those tasks are read (host_task_operation_state_idx)."""
    stopped = WorkItem.objects.filter(
        install_stopped_for_withdrawn_target(),
        host_task__operation=OuterRef("pk"),
        host_task__state=TaskState.CANCELLED,
    )
    return Subquery(stopped.order_by("id").values("outcome_reason")[:1])


def _finished_operations(ids: Collection[int] | None = None) -> QuerySet[Operation, tuple[int, bool, str | None]]:
    """The open operations with no open task left (among `ids`, when given), locked, skipping those
    another transaction holds; each with whether it was cancelled, and whether an install of it was
    stopped for its withdrawn target (read for these rows only)."""
    still_open = HostTask.objects.filter(operation=OuterRef("pk"), state__in=OPEN_TASK_STATES)
    finished = Operation.objects.filter(state=OperationState.OPEN).exclude(Exists(still_open))
    if ids is not None:
        finished = finished.filter(pk__any=ids)
    cancelled = ExpressionWrapper(Q(cancelled_at__isnull=False), output_field=BooleanField())
    return (
        finished.select_for_update(skip_locked=True, no_key=True)
        .annotate(cancelled=cancelled, stopped=_stopped_install())
        .values_list("id", "cancelled", "stopped")
    )


# A pool's tick closes the operations it touched: compiled once (opsplanner/prepared.py).
_FINISHED_AMONG = PreparedQuery(lambda *, ids: _finished_operations(ids), ids=IDS)


def _operations_close(state: OperationState, *, cancelling: bool = False) -> PreparedUpdate:
    return PreparedUpdate(
        lambda *, ids, now: Operation.objects.filter(pk__any=ids, state=OperationState.OPEN),
        lambda *, ids, now: {"state": state, "closed_at": now, **({"cancelled_at": now} if cancelling else {})},
        ids=IDS,
        now=dt.datetime,
    )


class _Close(NamedTuple):
    counter: str  # the tick's counter
    update: PreparedUpdate
    kind: str  # the event
    says_stop: bool = False  # the event gives the stop's words and code


class _How(enum.Enum):
    COMPLETED = "completed"
    CANCELLED = "cancelled"  # someone cancelled it while tasks were under way
    # An install of it was stopped, its target withdrawn, before any executor claimed it, and nobody
    # cancelled it (the claim that stopped it cannot: it holds item rows and takes no pool lock; nor
    # an offboarding, an operation with tasks in other pools): cancelled, dated now, as the
    # withdrawal cancels the operations whose installs it stops, whatever their other hosts did.
    INSTALL_STOPPED = "install_stopped"


_CLOSED_AS = {
    _How.COMPLETED: _Close("operations_completed", _operations_close(OperationState.COMPLETED), "operation.completed"),
    _How.CANCELLED: _Close("operations_cancelled", _operations_close(OperationState.CANCELLED), "operation.cancelled"),
    _How.INSTALL_STOPPED: _Close(
        "operations_cancelled",
        _operations_close(OperationState.CANCELLED, cancelling=True),
        "operation.cancelled",
        says_stop=True,
    ),
}
_STOPPED_DATA = json.dumps({NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN})


def _said(finished: _Finished, says_stop: bool) -> tuple[str, str]:
    """The closing event's reason and data (JSON text)."""
    return (finished.stopped or "", _STOPPED_DATA) if says_stop else ("", "{}")


def _how(finished: _Finished) -> _How:
    if finished.cancelled:
        return _How.CANCELLED
    return _How.COMPLETED if finished.stopped is None else _How.INSTALL_STOPPED


def operations_close_finished(*, ctx: TickContext | None = None) -> int:
    """Close the open operations with no open task left, with an event each; return how many. They
    complete, or end cancelled when someone cancelled them while tasks were under way, or when an
    install of theirs was stopped as its target was withdrawn (`_How.INSTALL_STOPPED`, saying why).
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
        for how, (counter, close, kind, says_stop) in _CLOSED_AS.items():
            closing = [f for f in finished if _how(f) == how]
            if not closing:
                continue
            ids = [f.id for f in closing]
            close.count(ids=ids, now=now)
            events += [
                EventRow(stamp, kind, None, ACTOR, SUBJECT_OPERATION, f.id, pool_id, None, *_said(f, says_stop))
                for f in closing
            ]
            if ctx is not None:
                setattr(ctx.counts, counter, getattr(ctx.counts, counter) + len(ids))
        if ctx is None:
            events_copy_rows(events)
        else:
            ctx.events.extend(events)  # written with the tick's own, after its task events
    return len(finished)
