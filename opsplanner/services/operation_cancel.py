"""Cancelling operations: an operator's (the API, the console), a withdrawal's and an offboarding's,
with the resubmissions of their work (resubmission.py) and the hosts whose repair they cancel."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from functools import partial
from typing import NamedTuple

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Value
from django.db.models.functions import Coalesce

from fleet.models import Host, HostState, Pool
from fleet.services.hosts import host_transition
from opsplanner import clock
from opsplanner.events import Actor, actor_fields, event_record, event_row, events_copy_rows
from opsplanner.models import OPEN_TASK_STATES, HostTask, Operation, OperationSource, OperationState, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.tick.context import ACTOR, SUBJECT_TASK
from opsplanner.services.tick.repair import deferred_reason, pending_train_work


def operation_cancel(*, operation_id: int, reason: str, actor: Actor = None) -> int:
    """Cancel an open operation's pending host tasks; tasks already under way finish. Its open
    resubmissions (the work a withdrawal asked for again, resubmission.py; theirs too, transitively)
    are cancelled with it, each with its events: cancelling the original means the work should not
    happen. Returns how many tasks, theirs included."""
    return _cancel_with_resubmissions(operation_id, reason=reason, actor=actor, within_pool=None).tasks


def operations_cancel(
    *, operation_ids: Iterable[int], reason: str, actor: Actor = None, within_pool: int | None = None
) -> dict[int, int]:
    """Cancel these open operations in id order, each as `operation_cancel`; one an earlier one took
    with it as its resubmission is not cancelled again (closed, it would refuse, and the withdrawal
    with it). `within_pool`: a tick's (an offboarding's), which must take no other pool's lock, so
    a resubmission with tasks in another pool (its hosts moved pools since) is left to after the
    commit, an event saying so (`resubmissions_left_cancel`). {id: how many tasks it cancelled, its
    resubmissions' included}."""
    taken: set[int] = set()
    cancelled: dict[int, int] = {}
    for pk in sorted(set(operation_ids)):
        if pk in taken:
            cancelled[pk] = 0
            continue
        done = _cancel_with_resubmissions(pk, reason=reason, actor=actor, within_pool=within_pool)
        cancelled[pk] = done.tasks
        taken.update(done.resubmissions)
    return cancelled


class _Cancelled(NamedTuple):
    tasks: int  # pending tasks cancelled, its resubmissions' included
    resubmissions: list[int]  # the resubmissions cancelled with it


def resubmissions_left_cancel(*, operation_id: int) -> int:
    """Cancel the open resubmissions a cancel `within_pool` of this operation left (theirs too), every
    pool's lock taken now that the tick committed, as `operation_cancel` would have with it; how many
    tasks. Harmless twice: none is open the second time, nor for an operation never cancelled."""
    why = "a tick of another pool cancelled it, and left this one to after its commit"
    return _cancel_with_resubmissions(operation_id, reason=why, actor=ACTOR, within_pool=None, left_only=True).tasks


@transaction.atomic
def _cancel_with_resubmissions(
    operation_id: int, *, reason: str, actor: Actor, within_pool: int | None, left_only: bool = False
) -> _Cancelled:
    """`left_only`: the operation is cancelled already, only its resubmissions (`resubmissions_left_cancel`)."""
    if not reason:
        raise ValidationError({"reason": "Say why the operation is cancelled."})
    # Take the pools' tick locks first (in id order, as ticks do: pool, then operation), so a cancel
    # never races an admission and never deadlocks with a tick; its resubmissions' pools too.
    family = _with_resubmissions(operation_id, within_pool)
    pool_ids = _task_pools(family)
    list(Pool.objects.select_for_update(no_key=True).filter(pk__any=pool_ids).order_by("pk").values_list("pk"))
    # Read again once they are held: a withdrawal (it holds every pool) may have resubmitted it meanwhile.
    if (again := _with_resubmissions(operation_id, within_pool)) != family and not _task_pools(again) <= pool_ids:
        raise ValidationError("Some tasks changed while cancelling; try again.", code="conflict")
    operation = Operation.objects.select_for_update().get(pk=operation_id)
    if left_only and operation.cancelled_at is None:
        return _Cancelled(0, [])
    if not left_only and operation.state != OperationState.OPEN:
        raise ValidationError(
            f"Operation #{operation_id} is {operation.state}; only open operations can be cancelled.",
            code="conflict",
        )
    # Newer than the original, so after it in id order; one its operator already cancelled keeps that.
    resubmissions = list(
        Operation.objects.select_for_update()
        .filter(pk__any=again[1:], state=OperationState.OPEN, cancelled_at__isnull=True)
        .order_by("pk")
    )
    now = clock.now()
    data: dict[str, object] = {"resubmissions": [r.pk for r in resubmissions]} if resubmissions else {}
    cancelled = 0 if left_only else _open_cancel(operation, reason=reason, now=now, actor=actor, data=data)
    why = f"operation #{operation_id}, whose work it asks for again, is cancelled: {reason}"[:500]
    for resubmission in resubmissions:
        cancelled += _open_cancel(resubmission, reason=why, now=now, actor=actor, data={"with": operation_id})
    if within_pool is not None:
        _left_defer(operation_id, again, within_pool=within_pool, actor=actor)
    return _Cancelled(cancelled, [r.pk for r in resubmissions])


CANCEL_DEFERRED = "operation.cancel_deferred"  # on a resubmission a cancel `within_pool` left (_left_defer)


def _left_defer(operation_id: int, taken: list[int], *, within_pool: int, actor: Actor) -> None:
    """The open resubmissions of the operation a cancel `within_pool` left (not in `taken`: tasks in
    another pool, whose lock a tick may not take), each with an event saying why; cancelled after the
    commit, by a worker (a task carrying the id, acked late), or here without workers (KICK_TASKS off:
    the simulator ticks in-process). Nothing is left open silently."""
    left = list(
        Operation.objects.filter(
            pk__any=[pk for pk in _with_resubmissions(operation_id) if pk not in taken],
            state=OperationState.OPEN,
            cancelled_at__isnull=True,
        ).order_by("pk")
    )
    why = (
        f"operation #{operation_id}, whose work it asks for again, is cancelled by a tick of pool #{within_pool}, "
        "which may not take the lock of the other pools its tasks are in: cancelled after its commit"
    )
    data = {"with": operation_id, "within_pool": within_pool}
    for resubmission in left:
        event_record(kind=CANCEL_DEFERRED, subject=resubmission, actor=actor, reason=why, data=data)
    if left:
        transaction.on_commit(partial(_left_cancel_after_commit, operation_id), robust=True)


def _left_cancel_after_commit(operation_id: int) -> None:
    if settings.KICK_TASKS:
        from opsplanner.tasks import resubmissions_left_cancel as task

        task.delay(operation_id)
    else:
        resubmissions_left_cancel(operation_id=operation_id)


def _with_resubmissions(operation_id: int, within_pool: int | None = None) -> list[int]:
    """The operation's id, then its resubmissions' and theirs (every one, whatever its state; a
    query per generation, in practice one or two); `within_pool`: only those with no task elsewhere
    (and theirs)."""
    family, generation = [operation_id], [operation_id]
    while generation:
        found = Operation.objects.filter(resubmission_of_id__any=generation)
        if within_pool is not None:
            found = found.exclude(
                Exists(HostTask.objects.filter(operation=OuterRef("pk")).exclude(pool_id=within_pool))
            )
        generation = list(found.order_by("pk").values_list("pk", flat=True))
        family += generation
    return family


def _task_pools(operation_ids: list[int]) -> set[int]:
    return set(HostTask.objects.filter(operation_id__any=operation_ids).values_list("pool_id", flat=True))


def _open_cancel(operation: Operation, *, reason: str, now: dt.datetime, actor: Actor, data: dict[str, object]) -> int:
    """Cancel this open operation (its row locked) with its pending tasks, and its event (`data`
    added); how many tasks. It closes now if no task of it is under way; otherwise the tick closes
    it cancelled once they finish."""
    _, actor_label = actor_fields(actor)
    pending = list(
        HostTask.objects.filter(operation=operation, state=TaskState.PENDING).values_list(
            "id", "host_id", "pool_id", "operation_id"
        )
    )
    cancelled = _pending_cancel(pending, code=FailureCode.CANCELLED, why="", reason=reason, now=now, actor=actor_label)
    if operation.source == OperationSource.REPAIR:
        escalated = _escalate_unrepaired({row[1] for row in pending}, reason=reason, actor=actor)
        if escalated:
            # A human has these hosts for as long as it takes: their train work waits for the next cycle
            # (as when the tick escalates a host), or its visit, and the train's cycle, waited for them.
            deferred = list(pending_train_work(escalated).values_list("id", "host_id", "pool_id", "operation_id"))
            why = deferred_reason("its host is escalated to a human")
            _pending_cancel(deferred, code=FailureCode.DEFERRED, why=why, reason=why, now=now, actor=actor_label)
    closed = not HostTask.objects.filter(operation=operation, state__in=OPEN_TASK_STATES).exists()
    # With tasks still under way the operation stays open until they finish; then the tick closes it
    # cancelled, as its cancellation is dated (operations_close_finished). A second cancel keeps the first date.
    Operation.objects.filter(pk=operation.pk, state=OperationState.OPEN).update(
        cancelled_at=Coalesce(F("cancelled_at"), Value(now)),
        **({"state": OperationState.CANCELLED, "closed_at": now} if closed else {}),
    )
    event_record(
        kind="operation.cancelled" if closed else "operation.cancelling",
        subject=operation,
        actor=actor,
        reason=reason,
        data={"tasks": cancelled, **data},
    )
    return cancelled


def _pending_cancel(
    pending: list[tuple[int, int, int, int]], *, code: str, why: str, reason: str, now: dt.datetime, actor: str
) -> int:
    """Cancel these pending tasks (id, host, pool, operation) with `code` and `why` as their failure
    reason, each with its event; how many. Any that changed meanwhile refuses the whole cancel."""
    cancelled = HostTask.objects.filter(pk__any=[row[0] for row in pending], state=TaskState.PENDING).update(
        state=TaskState.CANCELLED,
        failure_code=code,
        failure_reason=why,
        finished_at=now,
        state_changed_at=now,
        waiting_code="",
        waiting_reason="",
    )
    if cancelled != len(pending):
        raise ValidationError("Some tasks changed while cancelling; try again.", code="conflict")
    events_copy_rows(
        [
            event_row(
                kind="task.state_changed",
                subject_type=SUBJECT_TASK,
                subject_id=task_id,
                now=now,
                actor=actor,
                reason=reason,
                pool_id=pool_id,
                host_id=host_id,
                data={"from": TaskState.PENDING, "to": TaskState.CANCELLED, "operation": operation_id},
            )
            for task_id, host_id, pool_id, operation_id in pending
        ]
    )
    return cancelled


def _escalate_unrepaired(host_ids: set[int], *, reason: str, actor: Actor) -> set[int]:
    """A broken host whose repair was cancelled goes to a human (failed → escalated: retry or release
    it, opsplanner.services.escalations) instead of staying failed with nothing left to repair it.
    The hosts escalated."""
    escalated = set()
    repaired = HostTask.objects.filter(
        host_id__any=host_ids, state__in=OPEN_TASK_STATES, operation__source=OperationSource.REPAIR
    ).values_list("host_id", flat=True)
    for host_id in (
        Host.objects.filter(pk__any=host_ids, state=HostState.FAILED)
        .exclude(pk__in=repaired)
        .values_list("id", flat=True)
    ):
        if host_transition(
            host_id=host_id,
            expected=HostState.FAILED,
            new=HostState.ESCALATED,
            reason=f"its repair was cancelled ({reason}); retry or release it",
            actor=actor,
        ):
            host = Host.objects.only("id", "pool_id").get(pk=host_id)
            event_record(  # as the tick's escalation writes it (opsplanner/services/tick/repair.py)
                kind="host.escalated", subject=host, actor=actor, reason=reason, pool_id=host.pool_id, host_id=host_id
            )
            escalated.add(host_id)
    return escalated
