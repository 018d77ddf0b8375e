"""Submitting and cancelling operations. The planner resolves the scope into host tasks."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import models, transaction

from fleet.models import ComponentVersion, Host, Pool
from opsplanner import clock
from opsplanner.adapters import DRAINERS, EXECUTORS, POOLS_ADAPTER, adapter_refusal
from opsplanner.events import Actor, actor_fields, actor_user, event_record, event_row, events_copy_rows
from opsplanner.models import (
    MAX_PRIORITY,
    OPEN_TASK_STATES,
    HostTask,
    Operation,
    OperationKind,
    OperationSource,
    OperationState,
    TaskState,
)
from opsplanner.models.operations import FailureCode
from opsplanner.scopes import parse_scope, resolve_scope, version_of
from opsplanner.services.compatibility import target_refusal, withdrawn_refusal
from opsplanner.services.tick.admission import queue_reason

SUBJECT_TASK = "opsplanner.hosttask"

log = logging.getLogger(__name__)


def _choice(field: str, value: str, choices: type[models.Choices]) -> None:
    if value not in choices.values:
        allowed = ", ".join(choices.values)
        raise ValidationError({field: f"{value!r} is not one of: {allowed}."})


@transaction.atomic
def operation_submit(
    *,
    kind: str,
    scope: str,
    reason: str,
    component: str = "",
    version: str = "",
    priority: int = 100,
    source: str = OperationSource.AD_HOC,
    actor: Actor = None,
    needs_drain: bool | None = None,
    gang: bool = False,
    estimated_duration_s: int = 1800,
    executor: str = POOLS_ADAPTER,
    drainer: str = POOLS_ADAPTER,
    max_attempts: int = 3,
    drain_timeout_s: int = 3600,
    host_ids: list[int] | None = None,
    hold_reason: str = "",
    override_buffers: bool = False,
) -> Operation:
    """Create an operation and one pending host task per host in scope, or refuse with the reason.

    Callers inside the product (trains, offboarding) that have already chosen the hosts pass them as
    host_ids; scope is then only the label the operation shows."""
    _, actor_label = actor_fields(actor)
    # Built as requested; _check_and_save refuses it or completes and normalises it before saving.
    operation = Operation(
        kind=kind,
        scope=scope,
        priority=priority,
        source=source,
        requested_by=actor_user(actor),
        requester=actor_label,
        reason=reason,
        gang=gang,
        estimated_duration_s=estimated_duration_s,
        executor=executor,
        drainer=drainer,
        max_attempts=max_attempts,
        drain_timeout_s=drain_timeout_s,
        hold_reason=hold_reason,
        override_buffers=override_buffers,
    )
    return _check_and_save(
        operation, component=component, version=version, needs_drain=needs_drain, host_ids=host_ids, actor=actor
    )


def _check_and_save(
    operation: Operation,
    *,
    component: str,
    version: str,
    needs_drain: bool | None,
    host_ids: list[int] | None,
    actor: Actor,
) -> Operation:
    """Refuse the requested operation with the reason, or save it (its target version resolved) with
    one pending task per host in scope and the submission event."""
    _check_request(operation)
    target = _target_version(kind=operation.kind, component=component, version=version)
    if needs_drain is None:
        needs_drain = target.component.needs_drain if target else True
    hosts = _hosts_in_scope(scope=operation.scope, host_ids=host_ids)
    if operation.gang:
        _check_gang(hosts.host_ids, hosts.pools, needs_drain)
    refusal = target_refusal(hosts.host_ids, target) if target is not None else None
    if refusal is not None:
        raise refusal.error("component_version")

    operation.component_version = target
    operation.needs_drain = needs_drain
    operation.scope, operation.reason = operation.scope.strip(), operation.reason.strip()
    operation.hold_reason = operation.hold_reason[:300]
    operation.created_at = clock.now()
    # The table's check constraints are checked above, in words (each would otherwise cost a query).
    operation.full_clean(validate_constraints=False)
    operation.save()
    _create_tasks(operation, hosts)
    _record_submission(operation, hosts, actor=actor)
    return operation


def _check_request(operation: Operation) -> None:
    """Refuse a request malformed on its own, before anything is read."""
    _choice("kind", operation.kind, OperationKind)
    _choice("source", operation.source, OperationSource)
    for refusal in (
        adapter_refusal(field="executor", value=operation.executor, allowed=EXECUTORS, blank=True),
        adapter_refusal(field="drainer", value=operation.drainer, allowed=DRAINERS, blank=True),
    ):
        if refusal:
            raise refusal
    priority, reason = operation.priority, operation.reason
    if not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise ValidationError({"priority": f"Priority must be a whole number from 0 to {MAX_PRIORITY}."})
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say why this operation is needed."})
    if operation.override_buffers and operation.source != OperationSource.EMERGENCY:
        raise ValidationError({"override_buffers": "Only an approved emergency may override the buffers."})


def _target_version(*, kind: str, component: str, version: str) -> ComponentVersion | None:
    """An upgrade's target version (refused if withdrawn); None for other kinds, which take none."""
    if kind != OperationKind.UPGRADE:
        if component or version:
            raise ValidationError({"component_version": f"A {kind} operation takes no component or version."})
        return None
    if not component or not version:
        raise ValidationError({"component_version": "An upgrade needs a component and a target version."})
    target = version_of(component, version)
    refusal = withdrawn_refusal(target)
    if refusal is not None:
        raise refusal.error("component_version")
    return target


@dataclass(frozen=True)
class _Scope:
    """The hosts in scope, in order, and each one's pool."""

    host_ids: list[int]
    pools: dict[int, int]  # host -> pool
    pool_names: dict[int, str]  # pool -> name


def _hosts_in_scope(*, scope: str, host_ids: list[int] | None) -> _Scope:
    """The scope's hosts, or host_ids when the caller chose them."""
    if host_ids is None:
        host_ids = resolve_scope(parse_scope(scope))
    elif not host_ids:
        raise ValidationError({"scope": "The scope has no hosts."})
    hosts = list(Host.objects.filter(pk__any=host_ids).values_list("id", "pool_id", "pool__name"))
    return _Scope(
        host_ids=host_ids,
        pools={host_id: pool_id for host_id, pool_id, _ in hosts},
        pool_names={pool_id: pool_name for _, pool_id, pool_name in hosts},
    )


def _create_tasks(operation: Operation, hosts: _Scope) -> None:
    """One pending task per host. A new task waits its turn, and says so until admission examines
    it (invariant 5)."""
    queued = {pool_id: queue_reason(pool_name) for pool_id, pool_name in hosts.pool_names.items()}
    HostTask.objects.bulk_create(
        [
            HostTask(
                operation=operation,
                host_id=host_id,
                pool_id=hosts.pools[host_id],
                priority=operation.priority,
                waiting_code=queued[hosts.pools[host_id]][0],
                waiting_reason=queued[hosts.pools[host_id]][1],
                created_at=operation.created_at,
                state_changed_at=operation.created_at,
            )
            for host_id in hosts.host_ids
        ],
        batch_size=5000,
    )


def _record_submission(operation: Operation, hosts: _Scope, *, actor: Actor) -> None:
    per_pool = Counter(hosts.pools.values())
    target = operation.component_version
    event_record(
        kind="operation.submitted",
        subject=operation,
        actor=actor,
        reason=operation.reason,
        pool_id=next(iter(per_pool)) if len(per_pool) == 1 else None,
        data={
            "kind": operation.kind,
            "target": str(target) if target else None,
            "scope": operation.scope,
            "hosts": len(hosts.host_ids),
            "hosts_per_pool": {str(pool): count for pool, count in per_pool.items()},
            "priority": operation.priority,
            "source": operation.source,
            "gang": operation.gang,
        },
    )
    log.info(
        "operation submitted",
        extra={
            "operation_id": operation.pk,
            "kind": operation.kind,
            "hosts": len(hosts.host_ids),
            "source": operation.source,
        },
    )


def _check_gang(host_ids: list[int], pools: dict[int, int], needs_drain: bool) -> None:
    pool_ids = set(pools.values())
    if len(pool_ids) != 1:
        raise ValidationError({"gang": "A gang operation must stay inside one pool (its hosts are taken at once)."})
    pool = Pool.objects.get(pk=pool_ids.pop())
    planned = pool.buffers_for(Host.objects.filter(pool=pool).count()).planned
    if needs_drain and len(host_ids) > planned:
        raise ValidationError(
            {
                "gang": f"A gang of {len(host_ids)} hosts can never fit in pool {pool.name}'s planned buffer "
                f"of {planned} hosts."
            }
        )


@transaction.atomic
def operation_cancel(*, operation_id: int, reason: str, actor: Actor = None) -> int:
    """Cancel an open operation's pending host tasks; tasks already under way finish. Returns how many."""
    if not reason:
        raise ValidationError({"reason": "Say why the operation is cancelled."})
    # Take the pools' tick locks first (in id order, as ticks do: pool, then operation), so a cancel
    # never races an admission and never deadlocks with a tick.
    pool_ids = set(HostTask.objects.filter(operation_id=operation_id).values_list("pool_id", flat=True))
    list(Pool.objects.select_for_update(no_key=True).filter(pk__any=pool_ids).order_by("pk").values_list("pk"))
    operation = Operation.objects.select_for_update().get(pk=operation_id)
    if operation.state != OperationState.OPEN:
        raise ValidationError(
            f"Operation #{operation_id} is {operation.state}; only open operations can be cancelled.",
            code="conflict",
        )
    _, actor_label = actor_fields(actor)
    now = clock.now()
    pending = list(
        HostTask.objects.filter(operation=operation, state=TaskState.PENDING).values_list("id", "host_id", "pool_id")
    )
    cancelled = HostTask.objects.filter(pk__any=[row[0] for row in pending], state=TaskState.PENDING).update(
        state=TaskState.CANCELLED,
        failure_code=FailureCode.CANCELLED,
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
                actor=actor_label,
                reason=reason,
                pool_id=pool_id,
                host_id=host_id,
                data={"from": TaskState.PENDING, "to": TaskState.CANCELLED, "operation": operation_id},
            )
            for task_id, host_id, pool_id in pending
        ]
    )
    closed = not HostTask.objects.filter(operation=operation, state__in=OPEN_TASK_STATES).exists()
    if closed:
        Operation.objects.filter(pk=operation_id, state=OperationState.OPEN).update(
            state=OperationState.CANCELLED, closed_at=now
        )
    # With tasks still under way the operation stays open until they finish (then it completes).
    event_record(
        kind="operation.cancelled" if closed else "operation.cancelling",
        subject=operation,
        actor=actor,
        reason=reason,
        data={"tasks": cancelled},
    )
    return cancelled
