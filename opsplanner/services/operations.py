"""Submitting and cancelling operations. The planner resolves the scope into host tasks."""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Required, TypedDict, Unpack

from django.core.exceptions import ValidationError
from django.db import models, transaction

from fleet.models import ComponentVersion, Host, InstalledVersion, Pool
from fleet.selectors.compatibility import PlannedHosts
from opsplanner import clock
from opsplanner.adapters import DRAINERS, EXECUTORS, POOLS_ADAPTER, adapter_refusal
from opsplanner.events import Actor, actor_fields, actor_user, event_row, events_copy_rows
from opsplanner.models import (
    MAX_PRIORITY,
    HostTask,
    Operation,
    OperationKind,
    OperationSource,
)
from opsplanner.scopes import parse_scope, resolve_scope, versions_of
from opsplanner.services.compatibility import targets_refusals, withdrawn_refusal
from opsplanner.services.tick.context import SUBJECT_OPERATION
from opsplanner.services.tick.queue_reads import queue_reason

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = logging.getLogger(__name__)


def _choice(field: str, value: str, choices: type[models.Choices]) -> None:
    if value not in choices.values:
        allowed = ", ".join(choices.values)
        raise ValidationError({field: f"{value!r} is not one of: {allowed}."})


@dataclass(frozen=True)
class OperationRequest:
    """One operation as asked for (operation_submit's keywords); operations_submit checks and saves
    a batch of them. Callers inside the product (trains, offboarding) that have already chosen the
    hosts pass them as host_ids; scope is then only the label the operation shows."""

    kind: str
    scope: str
    reason: str
    component: str = ""
    version: str = ""
    priority: int = 100
    source: str = OperationSource.AD_HOC
    needs_drain: bool | None = None
    gang: bool = False
    estimated_duration_s: int = 1800
    executor: str = POOLS_ADAPTER
    drainer: str = POOLS_ADAPTER
    max_attempts: int = 3
    drain_timeout_s: int = 3600
    host_ids: Sequence[int] | None = None
    hold_reason: str = ""
    override_buffers: bool = False
    or_newer: bool = False  # the target or a newer release will do (tick/supersede.py)
    resubmission_of: int | None = None  # the operation whose lost work this asks for again (resubmission.py)


class OperationFields(TypedDict, total=False):
    """operation_submit's keywords: OperationRequest's fields by name and type. Their defaults are
    set only there; mypy holds the two lists to each other where operation_submit builds one."""

    kind: Required[str]
    scope: Required[str]
    reason: Required[str]
    component: str
    version: str
    priority: int
    source: str
    needs_drain: bool | None
    gang: bool
    estimated_duration_s: int
    executor: str
    drainer: str
    max_attempts: int
    drain_timeout_s: int
    host_ids: Sequence[int] | None
    hold_reason: str
    override_buffers: bool
    or_newer: bool
    resubmission_of: int | None


def operation_submit(*, actor: Actor = None, **fields: Unpack[OperationFields]) -> Operation:
    """Create an operation and one pending host task per host in scope, or refuse with the reason
    (OperationRequest says what each keyword asks)."""
    return operations_submit(requests=[OperationRequest(**fields)], actor=actor)[0]


@transaction.atomic
def operations_submit(*, requests: Sequence[OperationRequest], actor: Actor = None) -> list[Operation]:
    """Create the operations, each with one pending task per host in scope, in order, or refuse the
    first that is wrong with the reason and write nothing. The batch is checked as a whole (its
    target versions in one query, its hosts in one, its compatibility in one pass) and written in
    three statements: a sliding train releasing a host that takes twenty upgrades pays once."""
    for request in requests:
        _check_request(request)
    targets = _target_versions(requests)
    scopes = _hosts_in_scopes(requests)
    drains = [
        request.needs_drain if request.needs_drain is not None else target.component.needs_drain if target else True
        for request, target in zip(requests, targets, strict=True)
    ]
    for request, hosts, needs_drain in zip(requests, scopes, drains, strict=True):
        if request.gang:
            _check_gang(hosts.host_ids, hosts.pools, needs_drain)
    _check_compatibility(targets, scopes)
    now = clock.now()
    user = actor_user(actor)
    operations = [
        _operation(request, target=target, needs_drain=needs_drain, user=user, actor=actor, now=now)
        for request, target, needs_drain in zip(requests, targets, drains, strict=True)
    ]
    Operation.objects.bulk_create(operations)
    _create_tasks(operations, scopes)
    _record_submissions(operations, scopes, actor=actor)
    return operations


# Whose operations each source but ad hoc marks: an operator submits ad-hoc ones only. The API's
# intent and the console's form take no source (theirs are ad hoc); the command line, which takes
# one, refuses the others (`operator_source_refusal`).
_NOT_BY_HAND: dict[str, str] = {
    OperationSource.TRAIN: "a maintenance train's",
    OperationSource.EMERGENCY: "an emergency train's, which a second operator approves",
    OperationSource.REPAIR: "the repair flow's own (failures, escalations, rollbacks), which other rules treat apart",
}


def operator_source_refusal(source: str) -> str | None:
    """Why an operator may not submit an operation of this source by hand, in one line; None for ad hoc."""
    if source == OperationSource.AD_HOC:
        return None
    whose = _NOT_BY_HAND.get(source, "not a source")
    by_hand = "an operator submits ad-hoc operations only, as through the API and the console"
    return f"{by_hand}: {source} operations are {whose}"


def _check_request(request: OperationRequest) -> None:
    """Refuse a request malformed on its own, before anything is read."""
    _choice("kind", request.kind, OperationKind)
    _choice("source", request.source, OperationSource)
    for refusal in (
        adapter_refusal(field="executor", value=request.executor, allowed=EXECUTORS, blank=True),
        adapter_refusal(field="drainer", value=request.drainer, allowed=DRAINERS, blank=True),
    ):
        if refusal:
            raise refusal
    priority, reason = request.priority, request.reason
    if not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
        raise ValidationError({"priority": f"Priority must be a whole number from 0 to {MAX_PRIORITY}."})
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say why this operation is needed."})
    if request.override_buffers and request.source != OperationSource.EMERGENCY:
        raise ValidationError({"override_buffers": "Only an approved emergency may override the buffers."})
    if request.kind != OperationKind.UPGRADE:
        if request.component or request.version:
            raise ValidationError({"component_version": f"A {request.kind} operation takes no component or version."})
    elif not request.component or not request.version:
        raise ValidationError({"component_version": "An upgrade needs a component and a target version."})


def _target_versions(requests: Sequence[OperationRequest]) -> list[ComponentVersion | None]:
    """Each upgrade's target version (refused if withdrawn); None for other kinds, which take none."""
    upgrades = [(r.component, r.version) for r in requests if r.kind == OperationKind.UPGRADE]
    found = versions_of(upgrades)
    for target in found.values():
        refusal = withdrawn_refusal(target)
        if refusal is not None:
            raise refusal.error("component_version")
    return [found[(r.component, r.version)] if r.kind == OperationKind.UPGRADE else None for r in requests]


@dataclass(frozen=True)
class _Scope:
    """The hosts in scope, in order, and each one's pool."""

    host_ids: list[int]
    pools: dict[int, int]  # host -> pool
    pool_names: dict[int, str]  # pool -> name


def _hosts_in_scopes(requests: Sequence[OperationRequest]) -> list[_Scope]:
    """Each request's hosts (its scope's, or host_ids when the caller chose them) with their pools,
    read in one query."""
    chosen = []
    for request in requests:
        if request.host_ids is None:
            chosen.append(resolve_scope(parse_scope(request.scope)))
        elif not request.host_ids:
            raise ValidationError({"scope": "The scope has no hosts."})
        else:
            chosen.append(list(request.host_ids))
    every = sorted({host_id for host_ids in chosen for host_id in host_ids})
    hosts = Host.objects.filter(pk__any=every).values_list("id", "pool_id", "pool__name")
    rows = {host_id: (pool_id, name) for host_id, pool_id, name in hosts}
    if missing := [host_id for host_id in every if host_id not in rows]:
        raise ValidationError({"scope": f"There is no host with id {missing[0]}."})
    return [
        _Scope(
            host_ids=host_ids,
            pools={host_id: rows[host_id][0] for host_id in host_ids},
            pool_names={rows[host_id][0]: rows[host_id][1] for host_id in host_ids},
        )
        for host_ids in chosen
    ]


def _check_compatibility(targets: list[ComponentVersion | None], scopes: list[_Scope]) -> None:
    """Refuse the first upgrade that would break a compatibility rule on its hosts (one pass for all)."""
    groups = [PlannedHosts(hosts.host_ids, [target]) for target, hosts in zip(targets, scopes, strict=True) if target]
    for refusal in targets_refusals(groups):
        if refusal is not None:
            raise refusal.error("component_version")


def _operation(
    request: OperationRequest,
    *,
    target: ComponentVersion | None,
    needs_drain: bool,
    user: User | None,
    actor: Actor,
    now: dt.datetime,
) -> Operation:
    """The operation to save, its target resolved and its text normalised; its fields checked."""
    _, actor_label = actor_fields(actor)
    operation = Operation(
        kind=request.kind,
        scope=request.scope.strip(),
        component_version=target,
        needs_drain=needs_drain,
        priority=request.priority,
        source=request.source,
        requested_by=user,
        requester=actor_label,
        reason=request.reason.strip(),
        gang=request.gang,
        estimated_duration_s=request.estimated_duration_s,
        executor=request.executor,
        drainer=request.drainer,
        max_attempts=request.max_attempts,
        drain_timeout_s=request.drain_timeout_s,
        hold_reason=request.hold_reason[:300],
        override_buffers=request.override_buffers,
        or_newer=request.or_newer,
        resubmission_of_id=request.resubmission_of,
        created_at=now,
    )
    # The table's check constraints are checked above, in words (each would otherwise cost a query),
    # and so are the references: the target was read in this transaction, the user is the actor, the
    # operation resubmitted was read by the resubmission.
    operation.full_clean(validate_constraints=False, exclude=["component_version", "requested_by", "resubmission_of"])
    return operation


def _create_tasks(operations: list[Operation], scopes: list[_Scope]) -> None:
    """One pending task per host of each operation. A new task waits its turn, and says so until
    admission examines it (invariant 5)."""
    queued = {pool_id: queue_reason(name) for hosts in scopes for pool_id, name in hosts.pool_names.items()}
    above = _versions_above_targets(operations, scopes)
    HostTask.objects.bulk_create(
        [
            HostTask(
                operation=operation,
                host_id=host_id,
                pool_id=hosts.pools[host_id],
                priority=operation.priority,
                waiting_code=queued[hosts.pools[host_id]][0],
                waiting_reason=queued[hosts.pools[host_id]][1],
                downgrade_from_id=above.get((index, host_id)),
                created_at=operation.created_at,
                state_changed_at=operation.created_at,
            )
            for index, (operation, hosts) in enumerate(zip(operations, scopes, strict=True))
            for host_id in hosts.host_ids
        ],
        batch_size=5000,
    )


def _versions_above_targets(operations: list[Operation], scopes: list[_Scope]) -> dict[tuple[int, int], int]:
    """{(operation's index, host): the version the host runs} where an upgrade is asked while its host
    runs a version of the component above the target: a downgrade asked from above, which the host
    coming down part way before it runs does not supersede (`HostTask.downgrade_from`, tick/supersede.py
    `overtaken`). Not for an operation that takes its target or newer (it never goes down), nor for
    a rollback (rollback.py, the repair flow's): it is asked from the version being withdrawn, no
    version to keep, so a newer one the host gets meanwhile overtakes it. One query, none without
    such an upgrade."""
    downgrades = [
        (index, operation.component_version, hosts)
        for index, (operation, hosts) in enumerate(zip(operations, scopes, strict=True))
        if operation.component_version is not None
        and not operation.or_newer
        and operation.source != OperationSource.REPAIR
    ]
    if not downgrades:
        return {}
    rows = InstalledVersion.objects.filter(
        host_id__any={host_id for _, _, hosts in downgrades for host_id in hosts.host_ids},
        component_id__any={target.component_id for _, target, _ in downgrades},
    ).values_list("host_id", "component_id", "version_id", "version__sort_key")
    runs = {(host_id, component_id): (version_id, key) for host_id, component_id, version_id, key in rows}
    above = {}
    for index, target, hosts in downgrades:
        for host_id in hosts.host_ids:
            version_id, key = runs.get((host_id, target.component_id), (None, ""))
            if version_id is not None and key > target.sort_key:
                above[(index, host_id)] = version_id
    return above


def _record_submissions(operations: list[Operation], scopes: list[_Scope], *, actor: Actor) -> None:
    actor_id, actor_label = actor_fields(actor)
    rows = []
    for operation, hosts in zip(operations, scopes, strict=True):
        per_pool = Counter(hosts.pools.values())
        target = operation.component_version
        data = {
            "kind": operation.kind,
            "target": str(target) if target else None,
            "scope": operation.scope,
            "hosts": len(hosts.host_ids),
            "hosts_per_pool": {str(pool): count for pool, count in per_pool.items()},
            "priority": operation.priority,
            "source": operation.source,
            "gang": operation.gang,
        }
        pool_id = next(iter(per_pool)) if len(per_pool) == 1 else None
        rows.append(
            event_row(
                kind="operation.submitted",
                subject_type=SUBJECT_OPERATION,
                subject_id=operation.pk,
                now=operation.created_at,
                actor=actor_label,
                actor_id=actor_id,
                reason=operation.reason,
                pool_id=pool_id,
                data=data,
            )
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
    events_copy_rows(rows)


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
