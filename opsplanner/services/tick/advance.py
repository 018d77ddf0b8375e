"""Tick steps 1-3: expire stale work, advance tasks whose work finished, hand hosts over; step 4, the
verification and the return, is verification.py, and closing the finished operations closing.py.

Everything is set-based: a handful of queries per step, whatever the number of hosts.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections import defaultdict
from typing import Any

from django.db.models import QuerySet, Value

from fleet.models import HostState
from opsplanner.models import (
    HostTask,
    OperationKind,
    OperationSource,
    TaskState,
    WorkItem,
    WorkKind,
    WorkState,
)
from opsplanner.models.operations import FailureCode
from opsplanner.models.work_items import NOT_RUN_KEY, NotRunCode
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate
from opsplanner.services.tick.checks import withdrawn_targets
from opsplanner.services.tick.context import (
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
    successors,
    supersede_older_than_in_place,
    tasks_not_applied,
)
from opsplanner.services.tick.verification import (
    UNDRAIN_DEADLINE_S,
    is_repair,
    record_versions,
    returns_done,
    returns_failed,
    start_verification,
    undrain,
    verifications_finished,
)


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
            .values_list("id", "kind", "state", "host_task_id", "result", "outcome_reason", "attempts")[:limit]
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
    for _, kind, state, task_id, result, reason, _ in items:
        by_kind[(kind, state)].append((tasks[task_id], result or {}, reason))
    unclaimed = {row[3] for row in items if row[6] == 0}  # the tasks of items no executor ever took

    repair: list[tuple[TaskRef, str]] = []
    _drains_done(ctx, [t for t, _, _ in by_kind[(WorkKind.DRAIN, WorkState.DONE)]])
    _drains_failed(ctx, by_kind[(WorkKind.DRAIN, WorkState.FAILED)])
    applied = _executions_done(ctx, by_kind[(WorkKind.EXECUTE, WorkState.DONE)], repair)
    _executions_failed(ctx, by_kind[(WorkKind.EXECUTE, WorkState.FAILED)], repair, unclaimed=unclaimed)
    _hand_over_or_verify(ctx, applied)
    verified_tasks = {t.id: t for t, _, _ in by_kind[(WorkKind.VERIFY, WorkState.DONE)]}
    verified_tasks.update({t.id: t for t, _, _ in by_kind[(WorkKind.VERIFY, WorkState.FAILED)]})
    verifications_finished(ctx, list(verified_tasks.values()), repair)
    returns_done(ctx, [t for t, _, _ in by_kind[(WorkKind.UNDRAIN, WorkState.DONE)]])
    returns_failed(ctx, by_kind[(WorkKind.UNDRAIN, WorkState.FAILED)], repair)
    send_to_repair(ctx, repair)


def _drains_done(ctx: TickContext, tasks: list[TaskRef]) -> None:
    # Admission refuses a withdrawn target, but an upgrade offboarded while its hosts drained
    # withdrew it since: installed, it failed the pre-return gate and sent the host to repair.
    withdrawn = withdrawn_targets(tasks)
    ctx.move_tasks(tasks, expected=TaskState.DRAINING, new=TaskState.RUNNING)
    for_nothing = [task for task in tasks if task.id in withdrawn]
    back = _not_applied(ctx, for_nothing, withdrawn, host_state=HostState.DRAINING) if for_nothing else []
    ctx.move_hosts(
        [t.host_id for t in tasks if t not in back],
        expected=HostState.DRAINING,
        new=HostState.MAINTENANCE,
        reason="drained; work starts",
    )
    ctx.add_execute_items([t for t in tasks if t.id not in withdrawn])


def _not_applied(ctx: TickContext, tasks: list[TaskRef], why: dict[int, str], *, host_state: str) -> list[TaskRef]:
    """Running tasks whose target was withdrawn (`why`, by task) before they installed it: while
    their host drained (`host_state` draining) or before an executor claimed their install
    (maintenance: installs_stop, or the claim that found it, withdrawn_installs_stop). The task
    installs nothing and ends cancelled, saying why; its host goes on to its next pending task in
    the same drain (one drain for both, as after applied work),
    or back to service without the checks, as after a failed drain: nothing was done on it. One whose
    drain applied earlier work (handed over to this task) is verified first, carried by this task:
    the gate judges only that work, and the task ends cancelled there, passed or not (a failure is
    the drain's last applied task's: verification.verifications_finished); one that installs in
    place without a drain just stays in service. The tasks whose hosts go back unverified."""
    in_place = [task for task in tasks if task.drain_key is None]
    tasks_not_applied(ctx, in_place, why, then={task.id: "the host stays in service" for task in in_place})
    ctx.release_leases([task.id for task in in_place], reason="nothing applied; no drain to end")
    by_host = {task.host_id: task for task in tasks if task.drain_key is not None}
    found = successors(ctx, by_host, installed=host_state != HostState.DRAINING)
    hand_over(ctx, [by_host[host_id] for host_id in found.takers], found, not_applied=why)
    ending = [task for task in by_host.values() if task.host_id not in found.takers]
    _defer_held_train_work(ctx, ending, found)
    worked = _drains_with_applied_work(ending) if host_state != HostState.DRAINING else set()
    start_verification(ctx, [task for task in ending if task.drain_key in worked])
    back = [task for task in ending if task.drain_key not in worked]
    tasks_not_applied(ctx, back, why, then={task.id: "the host returns to service" for task in back})
    ctx.move_hosts(
        [task.host_id for task in back],
        expected=host_state,
        new=HostState.RETURNING,
        reason=f"{'drained' if host_state == HostState.DRAINING else 'its install not run'} for a target withdrawn "
        "meanwhile: nothing applied; returning the host to service",
    )
    undrain(ctx, back)
    return back


def _drains_with_applied_work(tasks: list[TaskRef]) -> set[int]:
    """The drains of these tasks that applied work before them (a task handed over in the drain)."""
    keys = {task.drain_key for task in tasks if task.drain_key is not None}
    return {key for (key,) in _APPLIED_DRAINS.rows(keys=keys)} if keys else set()


_APPLIED_DRAINS = PreparedQuery(
    lambda *, keys: (
        HostTask.objects.filter(drain_key__any=keys, state=TaskState.HANDED_OVER)
        .order_by()
        .values_list("drain_key")
        .distinct()
    ),
    keys=IDS,
)


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
    unknown = record_versions(ctx, versions)
    for task, result, _ in done:
        bad = [f"{c} {v}" for c, v in (result.get("versions") or {}).items() if (c, v) in unknown]
        if bad:
            why = f"executor reported versions not in the catalogue: {', '.join(bad)}"
            _fail_running(ctx, task, FailureCode.UNKNOWN_VERSION, why, repair)
        else:
            applied.append(task)
    no_drain = [t for t in applied if t.drain_key is None and not is_repair(t)]
    ctx.move_tasks(no_drain, expected=TaskState.RUNNING, new=TaskState.DONE, finished_at=ctx.now)
    ctx.release_leases([t.id for t in no_drain], reason="work done without a drain")
    supersede_older_than_in_place(ctx, no_drain)
    return [t for t in applied if t.drain_key is not None or is_repair(t)]


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
    ctx: TickContext,
    failed: list[tuple[TaskRef, dict[str, Any], str]],
    repair: list[tuple[TaskRef, str]],
    *,
    unclaimed: set[int],
) -> None:
    """A failed install sends its host to repair; but one that never ran on the host is not applied,
    as a drain for a target withdrawn meanwhile: stopped by a withdrawal before any executor claimed
    it (`NOT_RUN_KEY`, whatever became of the version since), or past its deadline still unclaimed
    with its target withdrawn."""
    never_ran = _never_ran(failed, unclaimed)
    # Those past their deadline carry no stop's mark (result): marked now, as the stop would have.
    late = {
        task.id: f"{reason}, never claimed: {never_ran[task.id]}"
        for task, result, reason in failed
        if task.id in never_ran and not result
    }
    _late_installs_not_run(ctx, late)
    _not_applied(
        ctx, [task for task, _, _ in failed if task.id in never_ran], never_ran, host_state=HostState.MAINTENANCE
    )
    for task, _, reason in failed:
        if task.id in never_ran:
            continue
        why = f"{task.kind} failed: {reason or 'no reason given'}"
        _fail_running(ctx, task, FailureCode.EXECUTE_FAILED, why, repair)


def _never_ran(failed: list[tuple[TaskRef, dict[str, Any], str]], unclaimed: set[int]) -> dict[int, str]:
    """{task: why} for the failed installs that never ran on their host (see _executions_failed),
    in the words of a drain for a target withdrawn meanwhile while it is withdrawn; a query only
    when there is one."""
    stopped = {  # never claimed: an executor's own result cannot say so
        task.id: reason
        for task, result, reason in failed
        if task.id in unclaimed and result.get(NOT_RUN_KEY) == NotRunCode.TARGET_WITHDRAWN
    }
    never_ran = [
        task
        for task, _, _ in failed
        if task.id in stopped
        or (task.id in unclaimed and task.kind == OperationKind.UPGRADE and task.target_withdrawn_at is not None)
    ]
    return {**stopped, **(withdrawn_targets(never_ran) if never_ran else {})}


def _late_installs_not_run(ctx: TickContext, late: dict[int, str]) -> None:
    """Mark the installs that passed their deadline unclaimed, their target withdrawn (`_never_ran`;
    `late`: by task, why), not run as a stop marks them (`NOT_RUN_KEY`), their reason saying so:
    their operation then closes cancelled as one whose install was stopped (tick/closing.py,
    install_stopped_for_withdrawn_target), not completed. A statement per reason, none without one."""
    by_reason: dict[str, list[int]] = defaultdict(list)
    for task_id, why in late.items():
        by_reason[why[:500]].append(task_id)
    for why, task_ids in by_reason.items():
        WorkItem.objects.filter(
            host_task_id__in=task_ids, kind=WorkKind.EXECUTE, state=WorkState.FAILED, attempts=0, consumed_at=ctx.now
        ).update(result={NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN}, outcome_reason=why)


def _hand_over_or_verify(ctx: TickContext, applied: list[TaskRef]) -> None:
    """A host whose task is applied passes to the next pending task for it without returning to
    service (handover); with nothing left, its pre-return verification starts."""
    if not applied:
        return
    # A repaired host is verified and returned, unless it catches up on the train work its drain
    # missed (once, with room in the planned buffer; repair.py).
    repaired = [task for task in applied if is_repair(task)]
    caught_up = catch_up_repaired(ctx, repaired)
    start_verification(ctx, [task for task in repaired if task.host_id not in caught_up])
    applied = [task for task in applied if not is_repair(task)]
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
