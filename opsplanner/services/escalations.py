"""What an operator does with an escalated host (three repairs failed in one drain; it stays out
until a human acts): retry the repair, or release it after fixing it by hand.

Neither puts the host back in service directly (invariant 3: returned only when verified). Both
start a new repair operation that takes the host at once, under the pool's tick lock, through the
tick's own guarded transitions: the host goes escalated → repair (still counted against the
failure buffer) and the repair opens a new drain, so it gets three attempts again.
- retry: the repair's execute item is queued, as for any repair; then verification and return.
- release: the operator says the host was fixed by hand, so nothing is executed: the repair goes
  straight to its pre-return verification (the three checks); it returns only if they pass, and a
  failed check sends the host back to repair like any failed verification.
Each writes an event with the operator and their reason."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from fleet.models import Host, HostState, Pool
from opsplanner import clock
from opsplanner.events import Actor, event_record
from opsplanner.models import REPAIR_PRIORITY, HostTask, Lease, Operation, OperationKind, OperationSource, TaskState
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick.context import ConcurrentChange, TaskRef, TickContext, task_refs
from opsplanner.services.tick.verification import start_verification

RETRY, RELEASE = "retry", "release"
DONE = {RETRY: "retried", RELEASE: "released"}


@transaction.atomic
def host_escalation_retry(*, host_id: int, reason: str, actor: Actor = None) -> Operation:
    """Submit a new repair of an escalated host and start it now (it has three attempts again)."""
    return _take_escalated(host_id=host_id, reason=reason, actor=actor, action=RETRY)


@transaction.atomic
def host_escalation_release(*, host_id: int, reason: str, actor: Actor = None) -> Operation:
    """The operator fixed an escalated host by hand: verify it, and return it only if it passes."""
    return _take_escalated(host_id=host_id, reason=reason, actor=actor, action=RELEASE)


def _take_escalated(*, host_id: int, reason: str, actor: Actor, action: str) -> Operation:
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError({"reason": "Say what was done to the host, or why the repair is worth another try."})
    reason = reason.strip()
    host = Host.objects.filter(pk=host_id).only("id", "pool_id", "hostname", "state").first()
    if host is None:
        raise ValidationError(f"There is no host #{host_id}.", code="not_found")
    # The pool's tick lock first, as ticks take it: no admission or repair of this host races us.
    pool = Pool.objects.select_for_update(no_key=True).get(pk=host.pool_id)
    state = Host.objects.values_list("state", flat=True).get(pk=host_id)
    if state != HostState.ESCALATED:
        raise ValidationError(
            f"Host {host.hostname} is {state}, not escalated: only an escalated host can be {DONE[action]}.",
            code="conflict",
        )
    holder = Lease.objects.filter(host_id=host_id, active=True).values_list("operation_id", flat=True).first()
    if holder is not None:
        raise ValidationError(f"Host {host.hostname} is held by operation #{holder}.", code="conflict")
    words = "fixed by hand, verify before return" if action == RELEASE else "repair retried by an operator"
    operation = operation_submit(
        kind=OperationKind.REPAIR,
        scope=f"hosts: {host.hostname}",
        host_ids=[host_id],
        reason=f"{words}: {reason}"[:500],
        priority=REPAIR_PRIORITY,
        source=OperationSource.REPAIR,
        needs_drain=True,
        executor=settings.REPAIR_EXECUTOR,
        actor=actor,
    )
    ctx = TickContext(pool=pool, now=clock.now())
    tasks = list(task_refs(HostTask.objects.filter(operation=operation)).values())
    try:
        _start_repair(ctx, tasks, action=action)
    except ConcurrentChange as change:
        raise ValidationError(
            f"Host {host.hostname} changed meanwhile; try again ({change}).", code="conflict"
        ) from None
    ctx.flush()
    event_record(
        kind=f"host.escalation_{DONE[action]}",
        subject=host,
        actor=actor,
        reason=reason,
        pool_id=host.pool_id,
        host_id=host_id,
        data={"operation": operation.pk, "task": tasks[0].id},
    )
    return operation


def _start_repair(ctx: TickContext, tasks: list[TaskRef], *, action: str) -> None:
    """Lease the host to the new repair, open its drain, escalated → repair; then execute the
    repair (retry) or go straight to the pre-return verification (release)."""
    ctx.grant_leases(tasks, reason=f"admitted: escalated host {DONE[action]} by an operator")
    ctx.move_tasks(
        tasks,
        expected=TaskState.PENDING,
        via=TaskState.ADMITTED,
        new=TaskState.RUNNING,
        reason="repairing an escalated host" if action == RETRY else "fixed by hand: nothing to execute",
        drain_key=F("id"),
        admitted_at=ctx.now,
        waiting_code="",
        waiting_reason="",
    )
    for task in tasks:
        task.drain_key = task.id  # a new drain: failed repairs are counted afresh
    ctx.move_hosts(
        [t.host_id for t in tasks],
        expected=HostState.ESCALATED,
        new=HostState.REPAIR,
        reason="repair retried by an operator" if action == RETRY else "released by an operator: verifying",
    )
    if action == RETRY:
        ctx.add_execute_items(tasks)
    else:
        start_verification(ctx, tasks)
