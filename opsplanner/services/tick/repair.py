"""Invariant 4's failure path: a failed host is handed to a repair operation without returning to
service; after MAX_REPAIR_ATTEMPTS failed repairs in one drain it is escalated to a human.

A failed host's other train work is left for the train's next cycle (one drain per host per cycle).
Once repaired, the host may still catch up in the same drain, once: when a train's task waits for it
(the train re-submits what the drain missed, trains/services/catch_up.py) and the pool has room for
one more host out for planned work, the repair hands the host over instead of returning it.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, F, QuerySet

from fleet.models import Host, HostState
from opsplanner.models import REPAIR_PRIORITY, HostTask, Operation, OperationKind, OperationSource, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.prepared import IDS, PreparedQuery
from opsplanner.services.tick.context import SUBJECT_HOST, TaskRef, TickContext, task_refs, task_refs_by_id
from opsplanner.services.tick.headroom import pool_headroom
from opsplanner.services.tick.returning import hand_over, successors

MAX_REPAIR_ATTEMPTS = 3


def send_to_repair(ctx: TickContext, failed: list[tuple[TaskRef, str]]) -> None:
    """Invariant 4: a failed host is handed to a repair operation (it counts against the failure
    buffer); after MAX_REPAIR_ATTEMPTS failed repairs it is escalated to a human and stays out.
    `failed` pairs each failed task with why it failed."""
    if not failed:
        return
    defer_train_work(ctx, {task.host_id for task, _ in failed})
    failed_repairs = _failed_repairs(failed)
    escalate = [(t, r) for t, r in failed if failed_repairs.get(t.host_id, 0) >= MAX_REPAIR_ATTEMPTS]
    repair = [(t, r) for t, r in failed if failed_repairs.get(t.host_id, 0) < MAX_REPAIR_ATTEMPTS]
    _escalate(ctx, escalate, failed_repairs)
    if not repair:
        return
    takers = _create_repairs(ctx, repair)
    ctx.release_leases([t.id for t, _ in repair], reason="handed to repair")
    ctx.move_tasks(
        takers,
        expected=TaskState.PENDING,
        new=TaskState.RUNNING,
        admitted_at=ctx.now,
        reason="handed to repair without returning to service",
    )
    ctx.grant_leases(takers, reason="repair handover")
    ctx.move_hosts(
        [t.host_id for t in takers], expected=HostState.FAILED, new=HostState.REPAIR, reason="repair started"
    )
    ctx.add_execute_items(takers)
    ctx.counts.repairs_started += len(takers)


_CAUGHT_UP_DRAINS = PreparedQuery(  # drains whose repair already handed its host over once
    lambda *, keys: HostTask.objects.filter(
        drain_key__any=keys, operation__kind=OperationKind.REPAIR, state=TaskState.HANDED_OVER
    ).values_list("drain_key"),
    keys=IDS,
)


def catch_up_repaired(ctx: TickContext, repaired: list[TaskRef]) -> set[int]:
    """Hosts whose repair is applied that take a train's pending task in the same drain instead of
    returning (the hosts, from `repaired`). Only once per drain (a catch-up that fails again returns
    the host), and only while the pool has room for one more host out for planned work: the host
    leaves the failure buffer for the planned one. A host refused has its train tasks left for the
    train's next cycle, so its return is not followed by a second drain."""
    if not repaired:
        return set()
    by_host = {task.host_id: task for task in repaired}
    found = successors(ctx, by_host)
    takers = {host_id: task for host_id, task in found.takers.items() if task.source == OperationSource.TRAIN}
    # A host with train work it may not take now (held while its train is paused or autostopped,
    # or refused) returns without it, and that work is left to the next cycle as well: admitted
    # later, it would drain the host a second time in the cycle.
    defer_train_work(ctx, set(by_host) - set(takers), why="its repaired host returns without it, held or refused")
    if not takers:
        return set()
    again = {key for (key,) in _CAUGHT_UP_DRAINS.rows(keys={by_host[h].drain_key for h in takers})}
    once = {host_id for host_id in takers if by_host[host_id].drain_key in again}
    headroom = pool_headroom(ctx)
    taking: dict[int, TaskRef] = {}
    for host_id in sorted(set(takers) - once, key=lambda h: (-takers[h].priority, takers[h].queued_at, h)):
        if headroom.keep_out_refusal() is None:
            headroom.keep_out()
            taking[host_id] = takers[host_id]
    no_room = set(takers) - once - set(taking)
    defer_train_work(ctx, once, why="its repaired host returns: its drain caught up once already")
    defer_train_work(ctx, no_room, why=f"its repaired host returns: {headroom.keep_out_refusal()}")
    hand_over(ctx, [by_host[host_id] for host_id in taking], found)
    ctx.move_hosts(
        taking,
        expected=HostState.REPAIR,
        new=HostState.MAINTENANCE,
        reason="repaired; takes the train work its drain missed before it returns",
    )
    return set(taking)


def defer_train_work(ctx: TickContext, host_ids: set[int], *, why: str = "the host's drain failed") -> None:
    """One drain per host per cycle: a train's pending tasks of a host whose drain failed are left to
    the train's next cycle (cancelled, code deferred), not admitted again once the host is repaired
    and back in service. The next cycle's visit takes the host again: it is still below the target.
    Ad-hoc and emergency work stays pending: somebody asked for it now."""
    if not host_ids:
        return
    deferred = task_refs(pending_train_work(host_ids))
    ctx.move_tasks(
        deferred.values(),
        expected=TaskState.PENDING,
        new=TaskState.CANCELLED,
        failure_code=FailureCode.DEFERRED,
        failure_reason=deferred_reason(why),
        finished_at=ctx.now,
        waiting_code="",
        waiting_reason="",
    )


def pending_train_work(host_ids: set[int]) -> QuerySet[HostTask]:
    """The trains' pending tasks of these hosts: what one drain per host per cycle leaves to the next
    cycle when the host is out broken (its drain failed, or a human has it)."""
    return HostTask.objects.filter(
        host_id__any=sorted(host_ids), state=TaskState.PENDING, operation__source=OperationSource.TRAIN
    )


def deferred_reason(why: str) -> str:
    """The failure reason of a train task left to the next cycle (code FailureCode.DEFERRED)."""
    return f"left for the train's next cycle: {why}"[:500]


def _failed_repairs(failed: list[tuple[TaskRef, str]]) -> dict[int, int]:
    """{host: failed repairs}, counted within the current drain (repairs inherit its key), not over
    the host's life."""
    host_ids = [task.host_id for task, _ in failed]
    drains = {task.drain_key for task, _ in failed if task.drain_key is not None}
    return dict(
        HostTask.objects.filter(
            host_id__any=host_ids, drain_key__any=drains, operation__kind=OperationKind.REPAIR, state=TaskState.FAILED
        )
        .values("host_id")
        .annotate(n=Count("id"))
        .values_list("host_id", "n")
    )


def _escalate(ctx: TickContext, escalate: list[tuple[TaskRef, str]], failed_repairs: dict[int, int]) -> None:
    ctx.release_leases([t.id for t, _ in escalate], reason="escalated to a human")
    for task, reason in escalate:
        ctx.move_hosts(
            [task.host_id],
            expected=HostState.FAILED,
            new=HostState.ESCALATED,
            reason=f"{MAX_REPAIR_ATTEMPTS} repairs failed; a human must look (last: {reason})",
        )
        ctx.event(
            kind="host.escalated",
            subject_type=SUBJECT_HOST,
            subject_id=task.host_id,
            host_id=task.host_id,
            reason=reason,
            data={"failed_repairs": failed_repairs.get(task.host_id, 0)},
        )


def _create_repairs(ctx: TickContext, repair: list[tuple[TaskRef, str]]) -> list[TaskRef]:
    """A repair operation with one pending task per failed host, in the failed task's drain; the
    new tasks, in the order of `repair`."""
    hostnames = dict(Host.objects.filter(pk__any=[t.host_id for t, _ in repair]).values_list("id", "hostname"))
    executor = settings.REPAIR_EXECUTOR
    operations = Operation.objects.bulk_create(
        [
            Operation(
                kind=OperationKind.REPAIR,
                scope=f"hosts: {hostnames[task.host_id]}",
                priority=REPAIR_PRIORITY,
                source=OperationSource.REPAIR,
                requester="scheduler",
                reason=f"repair after: {reason}"[:500],
                needs_drain=True,
                executor=executor,
                drainer=task.drainer,
                created_at=ctx.now,
            )
            for task, reason in repair
        ]
    )
    new_tasks = HostTask.objects.bulk_create(
        [
            HostTask(
                operation=operation,
                host_id=task.host_id,
                pool_id=ctx.pool.pk,
                priority=REPAIR_PRIORITY,
                drain_key=task.drain_key,
                created_at=ctx.now,
                state_changed_at=ctx.now,
            )
            for operation, (task, _) in zip(operations, repair, strict=True)
        ]
    )
    for operation in operations:
        ctx.event(
            kind="operation.submitted",
            subject_type="opsplanner.operation",
            subject_id=operation.pk,
            reason=operation.reason,
            data={"kind": "repair", "scope": operation.scope, "hosts": 1},
        )
    # A host that failed outside a drain starts one with its repair: verification and return follow.
    HostTask.objects.filter(pk__any=[t.pk for t in new_tasks], drain_key__isnull=True).update(drain_key=F("id"))
    refs = task_refs_by_id(t.pk for t in new_tasks)
    return [refs[t.pk] for t in new_tasks]
