"""The reads and writes of a pool's queue of pending tasks that admission (admission.py) makes each
tick, compiled once (see opsplanner.prepared): its head, the pages behind it, the hosts and their
holders, and the waiting reasons written set-based for the tasks beyond what was examined."""

from __future__ import annotations

import functools

from django.db.models import CharField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Concat, Left

from fleet.models import Host
from opsplanner.models import HostTask, Lease, Operation, OperationState, TaskState, WaitingCode
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate
from opsplanner.services.tick.context import task_rows

# The reads each pool's tick makes, compiled once (see opsplanner.prepared).
ANY_PENDING = PreparedQuery(
    lambda *, pool_id: (
        HostTask.objects.filter(pool_id=pool_id, state=TaskState.PENDING).order_by().values_list("id")[:1]
    ),
    pool_id=int,
)
IN_PLACE_OR_HELD_OPERATIONS = PreparedQuery(
    lambda: (
        Operation.objects.filter(Q(needs_drain=False) | ~Q(hold_reason=""), state=OperationState.OPEN)
        .order_by()
        .values_list("id", "needs_drain", "hold_reason")
    )
)
HOSTS_AND_HOLDERS = PreparedQuery(  # each host's state and the operation holding it, if any
    lambda *, ids: (
        Host.objects.filter(pk__any=ids)
        .order_by()
        .annotate(holder=Subquery(Lease.objects.filter(host_id=OuterRef("pk"), active=True).values("operation_id")[:1]))
        .values_list("id", "state", "holder")
    ),
    ids=IDS,
)


WAITING_REASON = PreparedUpdate(
    lambda *, ids, code, reason: HostTask.objects.filter(pk__any=ids, state=TaskState.PENDING),
    lambda *, ids, code, reason: {"waiting_code": code, "waiting_reason": reason},
    ids=IDS,
    code=str,
    reason=str,
)


# Tasks beyond the admission horizon. `examined` is never empty (the head was full) and `held` is
# passed only when it is not, so the prepared statements' "no ids, no rows" shortcut never applies.
def _beyond(*, pool_id: int, examined: frozenset[int], **_: object) -> QuerySet[HostTask]:
    return HostTask.objects.filter(pool_id=pool_id, state=TaskState.PENDING).exclude(pk__any=examined)


def _held_reason() -> Left:
    """f"held: {operation.hold_reason}"[:300], as the examined tasks of a held operation say it."""
    hold = Subquery(Operation.objects.filter(pk=OuterRef("operation_id")).order_by().values("hold_reason")[:1])
    return Left(Concat(Value("held: "), hold, output_field=CharField()), 300)


QUEUED_BEYOND = PreparedUpdate(
    lambda *, code, reason, **params: _beyond(**params).exclude(waiting_code=code, waiting_reason=reason),
    lambda *, code, reason, **_: {"waiting_code": code, "waiting_reason": reason},
    pool_id=int,
    examined=IDS,
    code=str,
    reason=str,
)
QUEUED_BEYOND_BUT_HELD = PreparedUpdate(
    lambda *, code, reason, held, **params: (
        _beyond(**params).exclude(operation_id__any=held).exclude(waiting_code=code, waiting_reason=reason)
    ),
    lambda *, code, reason, **_: {"waiting_code": code, "waiting_reason": reason},
    pool_id=int,
    examined=IDS,
    code=str,
    reason=str,
    held=IDS,
)
HELD_BEYOND = PreparedUpdate(  # every held operation's tasks at once, each with its own reason
    lambda *, held, **params: (
        _beyond(**params)
        .filter(operation_id__any=held)
        .exclude(waiting_code=WaitingCode.HELD, waiting_reason=_held_reason())
    ),
    lambda **_: {"waiting_code": WaitingCode.HELD, "waiting_reason": _held_reason()},
    pool_id=int,
    examined=IDS,
    held=IDS,
)


def queue_reason(pool_name: str) -> tuple[str, str]:
    """Why a task waits that admission has not examined: a new task (operation_submit gives it
    this reason) or one behind the head of its pool's queue. True until the task reaches the
    head, and the same tick after tick: it is not rewritten as the queue moves."""
    reason = f"waiting its turn in the queue of pool {pool_name} (higher priority first, then older first)"
    return WaitingCode.QUEUED, reason[:300]


def pending_queue(pool_id: int) -> QuerySet[HostTask]:
    # Pending tasks belong to open operations (cancelling or closing one leaves none pending), so
    # the queue is read from the partial index alone, without a join.
    return HostTask.objects.filter(pool_id=pool_id, state=TaskState.PENDING).order_by("-priority", "created_at", "id")


@functools.lru_cache(maxsize=64)
def queue_head(limit: int) -> PreparedQuery:
    return PreparedQuery(lambda *, pool_id: task_rows(pending_queue(pool_id))[:limit], pool_id=int)


@functools.lru_cache(maxsize=64)
def queue_head_unheld(limit: int) -> PreparedQuery:
    """The head of the queue without the tasks of the `held` operations."""
    return PreparedQuery(
        lambda *, pool_id, held: task_rows(pending_queue(pool_id).exclude(operation_id__any=held))[:limit],
        pool_id=int,
        held=IDS,
    )


def _after(*, pool_id: int, priority: int, after: int) -> QuerySet[HostTask]:
    """The queue behind task `after` (of priority `priority`), in order: the index's range from it."""
    created = Subquery(HostTask.objects.filter(pk=after).order_by().values("created_at")[:1])
    return pending_queue(pool_id).filter(
        Q(priority__lt=priority) | Q(created_at__gt=created) | Q(created_at=created, pk__gt=after),
        priority__lte=priority,
    )


@functools.lru_cache(maxsize=64)
def queue_after(limit: int, *, unheld: bool) -> PreparedQuery:
    """The next `limit` pending tasks behind task `after`, without the `held` operations' tasks if
    `unheld` (two statements: an empty `held` would make the prepared one match nothing)."""
    if not unheld:
        return PreparedQuery(lambda **p: task_rows(_after(**p))[:limit], pool_id=int, priority=int, after=int)
    return PreparedQuery(
        lambda *, held, **p: task_rows(_after(**p).exclude(operation_id__any=held))[:limit],
        pool_id=int,
        priority=int,
        after=int,
        held=IDS,
    )
