"""Tick steps 1-4: expire stale work, advance tasks whose work finished, hand hosts over, return them.

Everything is set-based: a handful of queries per step, whatever the number of hosts.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections import defaultdict
from collections.abc import Collection
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, F, OuterRef, Q, QuerySet, Value

from fleet.models import ComponentVersion, HostState, InstalledVersion
from opsplanner import clock
from opsplanner.bulk import insert_missing
from opsplanner.events import EventRow, events_copy_rows
from opsplanner.models import (
    OPEN_TASK_STATES,
    VERIFY_CLASSES,
    HostTask,
    Operation,
    OperationKind,
    OperationSource,
    OperationState,
    TaskState,
    WorkItem,
    WorkKind,
    WorkState,
)
from opsplanner.models.operations import FailureCode
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate
from opsplanner.services.tick.checks import withdrawn_targets
from opsplanner.services.tick.context import (
    ACTOR,
    SUBJECT_HOST,
    SUBJECT_OPERATION,
    SUBJECT_WORK,
    ConcurrentChange,
    TaskRef,
    TickContext,
    task_refs_by_id,
)
from opsplanner.services.tick.repair import catch_up_repaired, defer_train_work, send_to_repair
from opsplanner.services.tick.returning import (
    Successors,
    hand_over,
    pre_return_refusals,
    successors,
    tasks_not_applied,
)

VERIFY_DEADLINE_S = 3600
UNDRAIN_DEADLINE_S = 3600


# --- 1. expire --------------------------------------------------------------------------------------
def _overdue_items(*, pool_id: int, now: dt.datetime) -> QuerySet[WorkItem]:
    """Items whose executor stopped heartbeating (stale) and items past their deadline, in one
    round trip, each through its own partial index."""
    columns = ("id", "host_id", "attempts", "max_attempts", "claimed_by", "kind", "state", "created_at", "deadline_at")
    in_pool = WorkItem.objects.filter(pool_id=pool_id).order_by()
    stale = in_pool.filter(state=WorkState.RUNNING, lease_expires_at__lt=now).annotate(stale=Value(True))
    late = in_pool.filter(
        state__in=[WorkState.WAITING, WorkState.READY, WorkState.RUNNING], deadline_at__lt=now
    ).annotate(stale=Value(False))
    return stale.values_list(*columns, "stale").union(late.values_list(*columns, "stale"), all=True)


_OVERDUE_ITEMS = PreparedQuery(_overdue_items, pool_id=int, now=dt.datetime)


@functools.lru_cache(maxsize=16)
def _finished_items(limit: int) -> PreparedQuery:
    """Finished work not yet acted on, oldest first, up to limit (a LIMIT is part of the SQL)."""
    return PreparedQuery(
        lambda *, pool_id: (
            WorkItem.objects.filter(
                pool_id=pool_id, state__in=[WorkState.DONE, WorkState.FAILED], consumed_at__isnull=True
            )
            .order_by("id")
            .values_list("id", "kind", "state", "host_task_id", "result", "outcome_reason")[:limit]
        ),
        pool_id=int,
    )


_CONSUME = PreparedUpdate(
    lambda *, ids, now: WorkItem.objects.filter(pk__any=ids, consumed_at__isnull=True),
    lambda *, ids, now: {"consumed_at": now},
    ids=IDS,
    now=dt.datetime,
)


def expire(ctx: TickContext) -> None:
    """Take back items whose executor stopped heartbeating; fail items past their deadline."""
    overdue = _OVERDUE_ITEMS.rows(pool_id=ctx.pool.pk, now=ctx.now)
    stale = [row[:5] for row in overdue if row[-1]]
    late = [row for row in overdue if not row[-1]]
    retry = [row for row in stale if row[2] < row[3]]
    give_up = [row for row in stale if row[2] >= row[3]]
    retaken = []
    for row in retry:  # one guarded update each: a report that committed first wins
        if WorkItem.objects.filter(pk=row[0], state=WorkState.RUNNING, lease_expires_at__lt=ctx.now).update(
            state=WorkState.READY, claimed_by="", claimed_at=None, lease_expires_at=None, due_at=None
        ):
            retaken.append(row)
    for item_id, host_id, attempts, _, worker in retaken:
        ctx.event(
            kind="work_item.retaken",
            subject_type=SUBJECT_WORK,
            subject_id=item_id,
            host_id=host_id,
            reason=f"{worker} stopped heartbeating; attempt {attempts} given back to the queue",
        )
    for item_id, host_id, attempts, _, worker in give_up:
        _fail_item(
            ctx,
            item_id,
            host_id,
            f"{worker} stopped heartbeating on the last attempt ({attempts})",
            expected=WorkState.RUNNING,
            stale_at=ctx.now,
        )

    now_ready = {row[0] for row in retaken}
    failed = {row[0] for row in give_up}
    late = [row for row in late if row[0] not in failed]
    for item_id, host_id, _, _, _, kind, state, created, deadline, _ in late:
        limit = int((deadline - created).total_seconds())
        expected = WorkState.READY if item_id in now_ready else state
        _fail_item(ctx, item_id, host_id, f"{kind} did not finish within its deadline of {limit} s", expected=expected)
    ctx.counts.work_items_retaken += len(retaken)
    ctx.counts.work_items_expired += len(give_up) + len(late)


def _fail_item(
    ctx: TickContext, item_id: int, host_id: int, reason: str, *, expected: str, stale_at: dt.datetime | None = None
) -> None:
    items = WorkItem.objects.filter(pk=item_id, state=expected)
    if stale_at is not None:  # failed for a lapsed lease: a heartbeat committed since the read keeps it
        items = items.filter(lease_expires_at__lt=stale_at)
    changed = items.update(state=WorkState.FAILED, finished_at=ctx.now, outcome_reason=reason[:500])
    if changed:
        ctx.event(
            kind="work_item.failed",
            subject_type=SUBJECT_WORK,
            subject_id=item_id,
            host_id=host_id,
            reason=reason,
            data={"from": expected, "to": WorkState.FAILED},
        )


# --- 2-4. advance, hand over, return -----------------------------------------------------------------
def advance(ctx: TickContext, *, budget: int) -> None:
    items = _finished_items(budget).rows(pool_id=ctx.pool.pk)
    if not items:
        return
    consumed = _CONSUME.count(ids={row[0] for row in items}, now=ctx.now)
    if consumed != len(items):
        raise ConcurrentChange("work items consumed by someone else")
    tasks = task_refs_by_id(row[3] for row in items)
    by_kind: dict[tuple[str, str], list[tuple[TaskRef, dict[str, Any], str]]] = defaultdict(list)
    for _, kind, state, task_id, result, reason in items:
        by_kind[(kind, state)].append((tasks[task_id], result or {}, reason))

    repair: list[tuple[TaskRef, str]] = []
    _drains_done(ctx, [t for t, _, _ in by_kind[(WorkKind.DRAIN, WorkState.DONE)]])
    _drains_failed(ctx, by_kind[(WorkKind.DRAIN, WorkState.FAILED)])
    applied = _executions_done(ctx, by_kind[(WorkKind.EXECUTE, WorkState.DONE)], repair)
    _executions_failed(ctx, by_kind[(WorkKind.EXECUTE, WorkState.FAILED)], repair)
    _hand_over_or_verify(ctx, applied)
    verified_tasks = {t.id: t for t, _, _ in by_kind[(WorkKind.VERIFY, WorkState.DONE)]}
    verified_tasks.update({t.id: t for t, _, _ in by_kind[(WorkKind.VERIFY, WorkState.FAILED)]})
    _verifications_finished(ctx, list(verified_tasks.values()), repair)
    _returns_done(ctx, [t for t, _, _ in by_kind[(WorkKind.UNDRAIN, WorkState.DONE)]])
    _returns_failed(ctx, by_kind[(WorkKind.UNDRAIN, WorkState.FAILED)], repair)
    send_to_repair(ctx, repair)


def _drains_done(ctx: TickContext, tasks: list[TaskRef]) -> None:
    # Admission refuses a withdrawn target, but an upgrade offboarded while its hosts drained
    # withdrew it since: installed, it failed the pre-return gate and sent the host to repair.
    withdrawn = withdrawn_targets(tasks)
    ctx.move_tasks(tasks, expected=TaskState.DRAINING, new=TaskState.RUNNING)
    for_nothing = [task for task in tasks if task.id in withdrawn]
    back = _drained_for_nothing(ctx, for_nothing, withdrawn) if for_nothing else []
    ctx.move_hosts(
        [t.host_id for t in tasks if t not in back],
        expected=HostState.DRAINING,
        new=HostState.MAINTENANCE,
        reason="drained; work starts",
    )
    ctx.add_execute_items([t for t in tasks if t.id not in withdrawn])


def _drained_for_nothing(ctx: TickContext, tasks: list[TaskRef], why: dict[int, str]) -> list[TaskRef]:
    """Hosts drained for a target withdrawn meanwhile (`why`, by task): the task installs nothing and
    ends cancelled, saying why; its host goes on to its next pending task in the same drain (one
    drain for both, as after applied work), or back to service without the checks, as after a failed
    drain: nothing was done on it. The tasks whose hosts go back."""
    by_host = {task.host_id: task for task in tasks}
    found = successors(ctx, by_host, installed=False)
    hand_over(ctx, [by_host[host_id] for host_id in found.takers], found, not_applied=why)
    back = [task for task in tasks if task.host_id not in found.takers]
    _defer_held_train_work(ctx, back, found)
    tasks_not_applied(ctx, back, why, then={task.id: "the host returns to service" for task in back})
    ctx.move_hosts(
        [task.host_id for task in back],
        expected=HostState.DRAINING,
        new=HostState.RETURNING,
        reason="drained for a target withdrawn meanwhile: nothing applied; returning the host to service",
    )
    _undrain(ctx, back)
    return back


def _drains_failed(ctx: TickContext, failed: list[tuple[TaskRef, dict[str, Any], str]]) -> None:
    """A drain that failed or timed out: the task fails with the reason and the host goes back. The
    host's other train work is left to the next cycle, as after any failed drain: admitted once the
    host is back, it drained the host again in the cycle (and likely failed again)."""
    defer_train_work(ctx, {task.host_id for task, _, _ in failed})
    for task, _, reason in failed:
        why = f"drain failed: {reason or 'no reason given'}"
        ctx.move_tasks(
            [task],
            expected=TaskState.DRAINING,
            new=TaskState.FAILED,
            failure_code=FailureCode.DRAIN_FAILED,
            failure_reason=why[:500],
            finished_at=ctx.now,
        )
        ctx.move_hosts(
            [task.host_id],
            expected=HostState.DRAINING,
            new=HostState.RETURNING,
            reason=f"{why}; returning the host to service",
        )
        ctx.add_item(task, kind=WorkKind.UNDRAIN, adapter=task.drainer, deadline_s=UNDRAIN_DEADLINE_S)


def _executions_done(
    ctx: TickContext, done: list[tuple[TaskRef, dict[str, Any], str]], repair: list[tuple[TaskRef, str]]
) -> list[TaskRef]:
    """Record the versions executors report; returns the tasks whose work is applied."""
    applied: list[TaskRef] = []
    versions: list[tuple[int, str, str]] = []
    for task, result, _ in done:
        reported = result.get("versions") or {}
        versions.extend((task.host_id, component, version) for component, version in reported.items())
    unknown = _record_versions(ctx, versions)
    for task, result, _ in done:
        bad = [f"{c} {v}" for c, v in (result.get("versions") or {}).items() if (c, v) in unknown]
        if bad:
            why = f"executor reported versions not in the catalogue: {', '.join(bad)}"
            _fail_running(ctx, task, FailureCode.UNKNOWN_VERSION, why, repair)
        else:
            applied.append(task)
    no_drain = [t for t in applied if t.drain_key is None and not _is_repair(t)]
    ctx.move_tasks(no_drain, expected=TaskState.RUNNING, new=TaskState.DONE, finished_at=ctx.now)
    ctx.release_leases([t.id for t in no_drain], reason="work done without a drain")
    return [t for t in applied if t.drain_key is not None or _is_repair(t)]


_VERSION_INSTALLED = PreparedUpdate(  # once per version an executor reports: compiled once
    lambda *, hosts, component_id, version_id, now: InstalledVersion.objects.filter(
        host_id__any=hosts, component_id=component_id
    ).exclude(version_id=version_id),
    # The old version is kept as the one a rollback restores.
    lambda *, hosts, component_id, version_id, now: {
        "previous_version_id": F("version_id"),
        "version_id": version_id,
        "installed_at": now,
    },
    hosts=IDS,
    component_id=int,
    version_id=int,
    now=dt.datetime,
)


def _record_versions(ctx: TickContext, versions: list[tuple[int, str, str]]) -> set[tuple[str, str]]:
    """Set the installed versions reported by executors; return the (component, version) pairs unknown."""
    if not versions:
        return set()
    catalogue = {
        (name, version): (component_id, version_id)
        for name, version, component_id, version_id in ComponentVersion.objects.filter(
            component__name__in={c for _, c, _ in versions}
        ).values_list("component__name", "version", "component_id", "id")
    }
    unknown = {(c, v) for _, c, v in versions if (c, v) not in catalogue}
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for host_id, component, version in versions:
        if (component, version) in catalogue:
            groups[catalogue[(component, version)]].append(host_id)
    for (component_id, version_id), host_ids in groups.items():
        _VERSION_INSTALLED.count(hosts=host_ids, component_id=component_id, version_id=version_id, now=ctx.now)
        insert_missing(
            InstalledVersion,
            ["host_id", "component_id", "version_id", "installed_at"],
            [(host_id, component_id, version_id, ctx.now) for host_id in host_ids],
        )
    for host_id, component, version in versions:
        if (component, version) in catalogue:
            ctx.event(
                kind="host.version_installed",
                subject_type=SUBJECT_HOST,
                subject_id=host_id,
                host_id=host_id,
                data={"component": component, "to": version},
            )
    return unknown


def _out_state(task: TaskRef) -> str:
    """The host state while this task runs on it."""
    if task.kind == OperationKind.REPAIR:
        return HostState.REPAIR
    return HostState.MAINTENANCE if task.drain_key is not None else HostState.IN_SERVICE


def _fail_running(
    ctx: TickContext, task: TaskRef, code: FailureCode, reason: str, repair: list[tuple[TaskRef, str]]
) -> None:
    ctx.move_tasks(
        [task],
        expected=TaskState.RUNNING,
        new=TaskState.FAILED,
        failure_code=code,
        failure_reason=reason[:500],
        finished_at=ctx.now,
    )
    ctx.move_hosts([task.host_id], expected=_out_state(task), new=HostState.FAILED, reason=reason)
    repair.append((task, reason))


def _executions_failed(
    ctx: TickContext, failed: list[tuple[TaskRef, dict[str, Any], str]], repair: list[tuple[TaskRef, str]]
) -> None:
    for task, _, reason in failed:
        why = f"{task.kind} failed: {reason or 'no reason given'}"
        _fail_running(ctx, task, FailureCode.EXECUTE_FAILED, why, repair)


def _hand_over_or_verify(ctx: TickContext, applied: list[TaskRef]) -> None:
    """A host whose task is applied passes to the next pending task for it without returning to
    service (handover); with nothing left, its pre-return verification starts."""
    if not applied:
        return
    # A repaired host is verified and returned, unless it catches up on the train work its drain
    # missed (once, with room in the planned buffer; repair.py).
    repaired = [task for task in applied if _is_repair(task)]
    caught_up = catch_up_repaired(ctx, repaired)
    start_verification(ctx, [task for task in repaired if task.host_id not in caught_up])
    applied = [task for task in applied if not _is_repair(task)]
    by_host = {task.host_id: task for task in applied}
    found = successors(ctx, by_host)
    handing = [by_host[host_id] for host_id in found.takers]
    hand_over(ctx, handing, found)

    finishing = [task for task in applied if task.host_id not in found.takers]
    _defer_held_train_work(ctx, finishing, found)
    start_verification(ctx, finishing)


def _defer_held_train_work(ctx: TickContext, ending: list[TaskRef], found: Successors) -> None:
    """One drain per host per cycle: a host whose train drain ends while its train is stopped (its
    work held: paused, or autostopped) returns without the held work, which is left for the train's
    next cycle. Admitted after the train resumed, it drained the host a second time in the cycle.
    A train drain: a train task is in it, the one ending or one handed over before (an ad-hoc task
    may end it); a drain of other work only has not had the train's visit."""
    held = [task for task in ending if task.host_id in found.held]
    others = {task.drain_key for task in held if task.source != OperationSource.TRAIN and task.drain_key is not None}
    train_drains = {key for (key,) in _TRAIN_DRAINS.rows(keys=others)} if others else set()
    hosts = {task.host_id for task in held if task.source == OperationSource.TRAIN or task.drain_key in train_drains}
    defer_train_work(ctx, hosts, why="its host's drain ended while its train was stopped")


_TRAIN_DRAINS = PreparedQuery(  # the drains among these with a train task handed over in them
    lambda *, keys: (
        HostTask.objects.filter(
            drain_key__any=keys, state=TaskState.HANDED_OVER, operation__source=OperationSource.TRAIN
        )
        .order_by()
        .values_list("drain_key")
        .distinct()
    ),
    keys=IDS,
)


def _is_repair(task: TaskRef) -> bool:
    """A host under repair stays in the repair state (and the failure buffer) until it is back."""
    return task.kind == OperationKind.REPAIR


def start_verification(ctx: TickContext, tasks: list[TaskRef]) -> None:
    ctx.move_tasks(tasks, expected=TaskState.RUNNING, new=TaskState.VERIFYING)
    ctx.move_hosts(
        [t.host_id for t in tasks if not _is_repair(t)],
        expected=HostState.MAINTENANCE,
        new=HostState.VERIFYING,
        reason="work applied; pre-return verification",
    )
    for task in tasks:
        for verify_class in VERIFY_CLASSES:
            ctx.add_item(
                task,
                kind=WorkKind.VERIFY,
                verify_class=verify_class,
                adapter=task.executor,
                deadline_s=VERIFY_DEADLINE_S,
                params={"class": verify_class},
            )


_VERIFY_OUTCOMES = PreparedQuery(
    lambda *, ids: WorkItem.objects.filter(host_task_id__any=ids, kind=WorkKind.VERIFY).values_list(
        "host_task_id", "verify_class", "state", "result", "outcome_reason", "consumed_at"
    ),
    ids=IDS,
)
_DRAINED_BY = PreparedQuery(
    lambda *, ids: WorkItem.objects.filter(host_task_id__any=ids, kind=WorkKind.DRAIN).values_list(
        "host_task_id", "adapter"
    ),
    ids=IDS,
)


def _verifications_finished(ctx: TickContext, tasks: list[TaskRef], repair: list[tuple[TaskRef, str]]) -> None:
    """When all three verifications of a task are finished: the pre-return gate, or repair."""
    tasks = [t for t in tasks if t.state == TaskState.VERIFYING]
    if not tasks:
        return
    outcomes: dict[int, list[tuple[str, str, dict[str, Any], str]]] = defaultdict(list)
    for task_id, verify_class, state, result, reason, consumed in _VERIFY_OUTCOMES.rows(ids={t.id for t in tasks}):
        # Only outcomes consumed by this tick or an earlier one count: an item that finished after
        # this tick read its batch is the next tick's, so the gate runs exactly once per task.
        outcomes[task_id].append((verify_class, state if consumed else WorkState.RUNNING, result or {}, reason))
    passed: list[TaskRef] = []
    observed: list[tuple[int, str, str]] = []
    for task in tasks:
        rows = outcomes[task.id]
        if len(rows) < len(VERIFY_CLASSES) or any(
            state not in (WorkState.DONE, WorkState.FAILED) for _, state, _, _ in rows
        ):
            continue  # some verifications still running
        failures = [
            f"{cls}: {reason or result.get('detail') or 'failed'}"
            for cls, state, result, reason in rows
            if state == WorkState.FAILED or not result.get("passed", False)
        ]
        for _, _, result, _ in rows:
            observed.extend((task.host_id, c, v) for c, v in (result.get("versions") or {}).items())
        if failures:
            why = "verification failed: " + "; ".join(failures)
            _fail_verifying(ctx, task, FailureCode.CHECK_FAILED, why, repair)
        else:
            passed.append(task)
    _record_versions(ctx, observed)
    refusals = pre_return_refusals(passed)
    for task in passed:
        if task.id in refusals:
            code, reasons = refusals[task.id]
            _fail_verifying(ctx, task, code, "not returned: " + "; ".join(reasons), repair)
    returning = [t for t in passed if t.id not in refusals]
    ctx.move_hosts(
        [t.host_id for t in returning if not _is_repair(t)],
        expected=HostState.VERIFYING,
        new=HostState.RETURNING,
        reason="verified: work applied, checks passed, versions compatible",
    )
    _undrain(ctx, returning)


def _undrain(ctx: TickContext, returning: list[TaskRef]) -> None:
    """Put the hosts of these tasks back: the adapter that took a host out puts it back, whichever
    task of the drain ends it (even if the pool's drainer changed since): the drain item's own adapter."""
    if not returning:
        return
    drained_by = dict(_DRAINED_BY.rows(ids={t.drain_key for t in returning if t.drain_key is not None}))
    for task in returning:
        adapter = drained_by.get(task.drain_key, task.drainer) if task.drain_key is not None else task.drainer
        ctx.add_item(task, kind=WorkKind.UNDRAIN, adapter=adapter, deadline_s=UNDRAIN_DEADLINE_S)


def _fail_verifying(
    ctx: TickContext, task: TaskRef, code: FailureCode, reason: str, repair: list[tuple[TaskRef, str]]
) -> None:
    ctx.move_tasks(
        [task],
        expected=TaskState.VERIFYING,
        new=TaskState.FAILED,
        failure_code=code,
        failure_reason=reason[:500],
        finished_at=ctx.now,
    )
    expected = HostState.REPAIR if _is_repair(task) else HostState.VERIFYING
    ctx.move_hosts([task.host_id], expected=expected, new=HostState.FAILED, reason=reason)
    repair.append((task, reason))


def _returns_done(ctx: TickContext, tasks: list[TaskRef]) -> None:
    for expected in (HostState.RETURNING, HostState.REPAIR):
        ctx.move_hosts(
            [t.host_id for t in tasks if (expected == HostState.REPAIR) == _is_repair(t)],
            expected=expected,
            new=HostState.IN_SERVICE,
            reason="returned to service",
        )
    ctx.move_tasks(
        [t for t in tasks if t.state == TaskState.VERIFYING],
        expected=TaskState.VERIFYING,
        new=TaskState.DONE,
        finished_at=ctx.now,
    )
    ctx.release_leases([t.id for t in tasks], reason="host back in service")
    # The drain's earlier tasks (handed over) stay so; that their host came back is what makes their
    # work a success (trains/services/upgrades.py: phase_successes), whatever happens to it later.
    keys = frozenset(t.drain_key for t in tasks if t.drain_key is not None)
    if keys:
        _DRAIN_RETURNED.count(keys=keys, now=ctx.now)


_DRAIN_RETURNED = PreparedUpdate(
    # Not the tasks a failed check came after: the checks ran with their work applied too, so they
    # prove none of it (the host came back through repair; the failure is the last task's). Those
    # handed over after it, in the repair's catch-up (the drain's key), passed checks of their own.
    lambda *, keys, now: HostTask.objects.filter(drain_key__any=keys, state=TaskState.HANDED_OVER).exclude(
        Exists(
            HostTask.objects.filter(
                drain_key=OuterRef("drain_key"),
                state=TaskState.FAILED,
                failure_code=FailureCode.CHECK_FAILED,
                finished_at__gte=OuterRef("finished_at"),
            )
        )
    ),
    lambda *, keys, now: {"drain_returned_at": now},
    keys=IDS,
    now=dt.datetime,
)


def _returns_failed(
    ctx: TickContext, failed: list[tuple[TaskRef, dict[str, Any], str]], repair: list[tuple[TaskRef, str]]
) -> None:
    for task, _, reason in failed:
        why = f"return to service failed: {reason or 'no reason given'}"
        if task.state == TaskState.VERIFYING:
            ctx.move_tasks(
                [task],
                expected=TaskState.VERIFYING,
                new=TaskState.FAILED,
                failure_code=FailureCode.RETURN_FAILED,
                failure_reason=why[:500],
                finished_at=ctx.now,
            )
        expected = HostState.REPAIR if _is_repair(task) else HostState.RETURNING
        ctx.move_hosts([task.host_id], expected=expected, new=HostState.FAILED, reason=why)
        repair.append((task, why))


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
