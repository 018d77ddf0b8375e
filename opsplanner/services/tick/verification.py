"""Tick step 4 and the versions executors report: a host whose work is applied is checked (three
verification classes), passes the pre-return gate, and is put back by the adapter that drained it;
a failure on the way sends it to repair.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from django.db.models import Exists, F, OuterRef, Q

from fleet.models import ComponentVersion, HostState, InstalledVersion
from opsplanner.bulk import insert_missing
from opsplanner.models import VERIFY_CLASSES, HostTask, OperationKind, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.models.operations import FailureCode
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate
from opsplanner.services.tick.checks import withdrawn_targets
from opsplanner.services.tick.context import SUBJECT_HOST, TaskRef, TickContext, task_refs_from_rows, task_rows
from opsplanner.services.tick.returning import pre_return_refusals, tasks_not_applied

VERIFY_DEADLINE_S = 3600
UNDRAIN_DEADLINE_S = 3600


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


def record_versions(ctx: TickContext, versions: list[tuple[int, str, str]]) -> set[tuple[str, str]]:
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


def is_repair(task: TaskRef) -> bool:
    """A host under repair stays in the repair state (and the failure buffer) until it is back."""
    return task.kind == OperationKind.REPAIR


def start_verification(ctx: TickContext, tasks: list[TaskRef]) -> None:
    ctx.move_tasks(tasks, expected=TaskState.RUNNING, new=TaskState.VERIFYING)
    ctx.move_hosts(
        [t.host_id for t in tasks if not is_repair(t)],
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


_VERIFY_OUTCOMES = PreparedQuery(  # and installs failed unclaimed: a task that installed nothing carries checks
    lambda *, ids: WorkItem.objects.filter(
        Q(kind=WorkKind.VERIFY) | Q(kind=WorkKind.EXECUTE, state=WorkState.FAILED, attempts=0), host_task_id__any=ids
    ).values_list("host_task_id", "kind", "verify_class", "state", "result", "outcome_reason", "consumed_at"),
    ids=IDS,
)
_DRAINED_BY = PreparedQuery(
    lambda *, ids: WorkItem.objects.filter(host_task_id__any=ids, kind=WorkKind.DRAIN).values_list(
        "host_task_id", "adapter"
    ),
    ids=IDS,
)
Outcome = tuple[str, str, dict[str, Any], str]  # a check's class, state, result and reason


def _outcomes(tasks: list[TaskRef]) -> tuple[dict[int, list[Outcome]], dict[int, str]]:
    """The tasks' checks, by task; and {task: its install's reason} for those whose install failed:
    verifying, they installed nothing (advance._not_applied) and carry their drain's checks."""
    outcomes: dict[int, list[Outcome]] = defaultdict(list)
    never_ran: dict[int, str] = {}
    rows = _VERIFY_OUTCOMES.rows(ids={t.id for t in tasks})
    for task_id, kind, verify_class, state, result, reason, consumed in rows:
        if kind == WorkKind.EXECUTE:
            never_ran[task_id] = reason
            continue
        # Only outcomes consumed by this tick or an earlier one count: an item that finished after
        # this tick read its batch is the next tick's, so the gate runs exactly once per task.
        outcomes[task_id].append((verify_class, state if consumed else WorkState.RUNNING, result or {}, reason))
    return outcomes, never_ran


def verifications_finished(ctx: TickContext, tasks: list[TaskRef], repair: list[tuple[TaskRef, str]]) -> None:
    """When all three verifications of a task are finished: the pre-return gate, or repair. A task
    that installed nothing only carries the checks of what its drain applied before it: the gate
    judges that alone, the task ends not applied, and a failure is the drain's last applied task's."""
    tasks = [t for t in tasks if t.state == TaskState.VERIFYING]
    if not tasks:
        return
    outcomes, never_ran = _outcomes(tasks)
    passed: list[TaskRef] = []
    failing: list[tuple[TaskRef, FailureCode, str]] = []
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
            failing.append((task, FailureCode.CHECK_FAILED, "verification failed: " + "; ".join(failures)))
        else:
            passed.append(task)
    record_versions(ctx, observed)
    refusals = pre_return_refusals(passed, installed_nothing=never_ran.keys())
    for task in passed:
        if task.id in refusals:
            code, reasons = refusals[task.id]
            failing.append((task, code, "not returned: " + "; ".join(reasons)))
    not_installed = _not_installed([*passed, *(task for task, _, _ in failing)], never_ran)
    _fail_applied_work(ctx, [f for f in failing if f[0].id in not_installed], not_installed, repair)
    for task, code, why in failing:
        if task.id not in not_installed:
            _fail_verifying(ctx, task, code, why, repair)
    returning = [t for t in passed if t.id not in refusals]
    carriers = [t for t in returning if t.id in not_installed]
    then = dict.fromkeys((t.id for t in carriers), "the host passed its drain's checks and returns to service")
    tasks_not_applied(ctx, carriers, not_installed, then=then, expected=TaskState.VERIFYING)
    ctx.move_hosts(
        [t.host_id for t in returning if not is_repair(t)],
        expected=HostState.VERIFYING,
        new=HostState.RETURNING,
        reason="verified: work applied, checks passed, versions compatible",
    )
    undrain(ctx, returning)


def _not_installed(tasks: list[TaskRef], never_ran: dict[int, str]) -> dict[int, str]:
    """{task: why} for the tasks among these that installed nothing (their install failed before it
    ran: `never_ran`), in the words of a drain for a target withdrawn meanwhile while it is withdrawn
    (as advance._never_ran); a query only when there is one."""
    carriers = [task for task in tasks if task.id in never_ran]
    if not carriers:
        return {}
    return {**{t.id: never_ran[t.id] for t in carriers}, **withdrawn_targets(carriers)}


# The tasks that applied work in these drains, the last of each last; not a repair (a catch-up after
# it stopped): a failed repair would count towards escalation, and hide from catch_up_repaired that
# its drain caught up once already.
_LAST_APPLIED = PreparedQuery(
    lambda *, keys: task_rows(
        HostTask.objects.filter(drain_key__any=keys, state=TaskState.HANDED_OVER).exclude(
            operation__kind=OperationKind.REPAIR
        )
    ).order_by("drain_key", "finished_at", "id"),
    keys=IDS,
)


def _fail_applied_work(
    ctx: TickContext,
    failing: list[tuple[TaskRef, FailureCode, str]],
    not_installed: dict[int, str],
    repair: list[tuple[TaskRef, str]],
) -> None:
    """Tasks that installed nothing whose host failed its drain's checks or the gate: the failure is
    the drain's last applied task's (handed over to the next), as if it had carried the checks (it
    fails with the code, and counts against its upgrade's policy; its finished_at is kept, its bar
    on the Gantt ends where it did); the task ends not applied, and the host it holds goes to repair.
    After a repair's catch-up, nothing but the repair applied: the failure counts against no upgrade
    (nor as a failed repair). One query, only when there is one."""
    if not failing:
        return
    rows = _LAST_APPLIED.rows(keys={task.drain_key for task, _, _ in failing if task.drain_key is not None})
    last = {task.drain_key: task for task in task_refs_from_rows(rows).values()}  # in order: the last wins
    for task, code, why in failing:
        applied = last.get(task.drain_key)
        if applied is not None:
            ctx.move_tasks(
                [applied],
                expected=TaskState.HANDED_OVER,
                new=TaskState.FAILED,
                failure_code=code,
                failure_reason=f"{why} (its drain's checks, carried by task {task.id}, which installed nothing)"[:500],
            )
        then = f"its drain's earlier work failed its checks ({why}); the host goes to repair"
        tasks_not_applied(ctx, [task], not_installed, then={task.id: then}, expected=TaskState.VERIFYING)
        ctx.move_hosts([task.host_id], expected=HostState.VERIFYING, new=HostState.FAILED, reason=why)
        repair.append((task, why))


def undrain(ctx: TickContext, returning: list[TaskRef]) -> None:
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
    expected = HostState.REPAIR if is_repair(task) else HostState.VERIFYING
    ctx.move_hosts([task.host_id], expected=expected, new=HostState.FAILED, reason=reason)
    repair.append((task, reason))


def returns_done(ctx: TickContext, tasks: list[TaskRef]) -> None:
    for expected in (HostState.RETURNING, HostState.REPAIR):
        ctx.move_hosts(
            [t.host_id for t in tasks if (expected == HostState.REPAIR) == is_repair(t)],
            expected=expected,
            new=HostState.IN_SERVICE,
            reason="returned to service",
        )
    # Those that installed nothing ended not applied at the gate (verifications_finished): not verifying.
    verified = [t for t in tasks if t.state == TaskState.VERIFYING]
    ctx.move_tasks(verified, expected=TaskState.VERIFYING, new=TaskState.DONE, finished_at=ctx.now)
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


def returns_failed(
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
        expected = HostState.REPAIR if is_repair(task) else HostState.RETURNING
        ctx.move_hosts([task.host_id], expected=expected, new=HostState.FAILED, reason=why)
        repair.append((task, why))
