"""Superseded versions skipped: a host that has not yet received version N of a component when N+1
is pending for it gets N+1 directly, whatever the path (trains, ad-hoc operations, emergency trains).

Admission and handover both ask, before a pending upgrade task takes its host:
- is a newer target of the same component pending for the host (or applied in its drain)? The task
  is not applied: it is cancelled with the code `superseded`, its reason naming the newer version
  and its operation, once the newer one is applied: in the host's drain (at the handover after it),
  as it finishes in place, or at admission when the host runs it already. Until then the older one
  waits (`newer_pending` while the newer one waits, then for the host the newer one holds), so that
  the newer one cancelled, failed or withdrawn before the host has it leaves the host the older one,
  not neither (a drain for a target withdrawn meanwhile passes the host to it). It did nothing, so
  it is not `done`; but nobody cancelled its operation, which completes (not cancelled) once its
  tasks have finished, the superseded ones included. A gang's task is not held back at admission
  (its gang is judged whole) but is superseded as any once the newer one is applied on its host;
  the rest of its gang is then admitted without it.
- does the host already run its target (or something newer, not withdrawn, where the operation says
  the target or newer will do: `or_newer`, a train's upgrade, regular or emergency)? It finishes
  `done` without a drain: there is nothing to do. An operator's ad-hoc or emergency operation to an
  older version, and the repair flow's rollback, are deliberate downgrades and still run, but for
  one created before the host got the newer version (`overtaken`): N+1 reached the host while N
  waited, by whatever path (on hold, when nothing above judges it; from a drain before; reported by
  the host), so N ends `superseded` when it would take the host, at admission or at a handover.
  What the host ran when a task was asked, if above its target (`HostTask.downgrade_from`), counts
  as what it asked from: a downgrade asked from above whose host came down part way since still
  runs, and is overtaken only by a version above what the host ran then.
A withdrawn version supersedes nothing (`supersedes`, the one definition): it is to be rolled back,
so the host still wants the older version (a reopened upgrade's, say), applied after it in its drain.
Versions are compared by `ComponentVersion.sort_key` (fleet/versions.py), read with each task.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import NamedTuple

from fleet.models import ComponentVersion, InstalledVersion
from opsplanner.models import OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.tick.context import SortableTime, TaskRef, TickContext


class Installed(NamedTuple):
    sort_key: str
    label: str  # "bios 2.18.0"
    withdrawn: bool  # offboarded or withdrawn by hand: to be rolled back, so no newer version to keep
    since: float  # installed_at, as TaskRef.queued_at (the same SQL): only compared with it


def _is_upgrade(task: TaskRef) -> bool:
    return task.kind == OperationKind.UPGRADE and task.target_component_id is not None


def _slot(task: TaskRef) -> tuple[int, int]:
    """The (host, component) a task's target lands on."""
    return task.host_id, task.target_component_id or 0


def supersedes(newer: TaskRef, older: TaskRef) -> bool:
    """Whether `newer`'s target supersedes `older`'s: both upgrades of one component on one host, a
    newer target, and not a withdrawn one (rolled back, it is no version to keep: the host still
    wants the older one)."""
    return (
        _is_upgrade(newer)
        and _is_upgrade(older)
        and _slot(newer) == _slot(older)
        and newer.target_withdrawn_at is None
        and (newer.target_sort_key or "") > (older.target_sort_key or "")
    )


def newer_pending(tasks: Iterable[TaskRef], *, may_replace: Callable[[TaskRef, TaskRef], bool]) -> dict[int, TaskRef]:
    """{task id: the newest task that supersedes it} among pending upgrade tasks (`supersedes`) where
    `may_replace(older, newer)` (the newer one may take its place)."""
    by_slot: dict[tuple[int, int], list[TaskRef]] = defaultdict(list)
    for task in tasks:
        if _is_upgrade(task):
            by_slot[_slot(task)].append(task)
    newer: dict[int, TaskRef] = {}
    for group in by_slot.values():
        if len(group) < 2:
            continue
        for older in group:
            takers = [t for t in group if supersedes(t, older) and may_replace(older, t)]
            if takers:
                newer[older.id] = max(takers, key=lambda t: t.target_sort_key or "")
    return newer


def older_than_applied(tasks: Iterable[TaskRef], applied: Iterable[TaskRef]) -> dict[int, TaskRef]:
    """{task id: the newest upgrade of its component applied on its host in this drain} for pending
    upgrades it supersedes (`supersedes`): applying them would take the drained host back down.
    `applied` is every upgrade the drain applied, not only the one just finished: a reboot between
    the two changes nothing. One withdrawn since supersedes nothing: the older one is applied after it."""
    newest: dict[tuple[int, int], TaskRef] = {}
    for done in applied:
        kept = newest.get(_slot(done))
        if (
            _is_upgrade(done)
            and done.target_withdrawn_at is None
            and (kept is None or (done.target_sort_key or "") > (kept.target_sort_key or ""))
        ):
            newest[_slot(done)] = done
    newer: dict[int, TaskRef] = {}
    for task in tasks:
        latest = newest.get(_slot(task))
        if latest is not None and supersedes(latest, task):
            newer[task.id] = latest
    return newer


def installed_versions(tasks: Iterable[TaskRef]) -> dict[tuple[int, int], Installed]:
    """{(host, component): what the host runs} for the upgrade tasks' hosts and components (one query)."""
    upgrades = [t for t in tasks if _is_upgrade(t)]
    if not upgrades:
        return {}
    rows = (
        InstalledVersion.objects.filter(
            host_id__any={t.host_id for t in upgrades}, component_id__any={t.target_component_id for t in upgrades}
        )
        .annotate(since=SortableTime("installed_at"))
        .values_list(
            "host_id",
            "component_id",
            "version__sort_key",
            "component__name",
            "version__version",
            "version__withdrawn_at",
            "since",
        )
    )
    return {
        (host, component): Installed(key, f"{name} {version}", withdrawn is not None, since)
        for host, component, key, name, version, withdrawn, since in rows
    }


def at_or_past_target(tasks: Iterable[TaskRef], installed: dict[tuple[int, int], Installed]) -> set[int]:
    """The upgrade tasks whose host runs their target or a newer version not withdrawn: what an
    upgrade reported applied leaves (an executor may install newer than asked, or nothing)."""
    reached = set()
    for task in tasks:
        runs = installed.get(_slot(task)) if _is_upgrade(task) else None
        if runs is None or task.target_sort_key is None:
            continue
        if task.target_sort_key == runs.sort_key or (task.target_sort_key < runs.sort_key and not runs.withdrawn):
            reached.add(task.id)
    return reached


def nothing_to_do(tasks: Iterable[TaskRef], installed: dict[tuple[int, int], Installed]) -> dict[int, str]:
    """{task id: what the host runs} for upgrade tasks with nothing to do: the host runs the target, or
    a newer version when the operation says the target or newer will do (`or_newer`: a train's
    upgrade, regular or emergency; anyone else asking for an older version means to go down)."""
    found: dict[int, str] = {}
    for task in tasks:
        runs = installed.get(_slot(task)) if _is_upgrade(task) else None
        if runs is None or task.target_sort_key is None:
            continue
        if task.target_sort_key == runs.sort_key or (
            task.target_sort_key < runs.sort_key and task.or_newer and not runs.withdrawn
        ):
            found[task.id] = runs.label
    return found


def overtaken(tasks: Iterable[TaskRef], installed: dict[tuple[int, int], Installed]) -> dict[int, str]:
    """{task id: what the host runs} for upgrade tasks whose host got a newer version, not withdrawn,
    after the task was created, and newer too than what it ran when the task was asked (a version above
    the target, `downgrade_from`): applying them would take the host back down
    to a version superseded while they waited, whatever brought the newer one (a drain or an in-place
    install while they were held, a train, the host's own report). A task created after the host got
    it asks for a downgrade on purpose (an operator's ad-hoc or emergency operation): it is not here,
    and runs; so does one asked while the host ran something above its target that came down part way
    since (flashed by hand, rolled back): the host is still above what was asked. One whose host went
    above what it ran then, or moved up (twice or more) from below its target, is here. The version
    asked from is read only for the tasks the date alone would put here (one query, rarely)."""
    by_date: dict[int, tuple[TaskRef, Installed]] = {}
    for task in tasks:
        runs = installed.get(_slot(task)) if _is_upgrade(task) else None
        if runs is None or task.target_sort_key is None or runs.withdrawn:
            continue
        if task.target_sort_key < runs.sort_key and runs.since > task.queued_at:
            by_date[task.id] = (task, runs)
    asked_from = _versions_asked_from(task for task, _ in by_date.values())
    return {
        task_id: runs.label
        for task_id, (task, runs) in by_date.items()
        if runs.sort_key > asked_from.get(task.downgrade_from_id or 0, "")
    }


def _versions_asked_from(tasks: Iterable[TaskRef]) -> dict[int, str]:
    """{version id: its sort key} for the versions above their targets the tasks' hosts ran when they
    were asked: withdrawn since or not (an operator's downgrade asked from 2.18.0 still runs when the
    withdrawal of 2.18.0 rolls the host back to 2.16.0; a rollback records none, operations.py). One
    query, none if no task has one."""
    ids = {task.downgrade_from_id for task in tasks if task.downgrade_from_id is not None}
    if not ids:
        return {}
    rows = ComponentVersion.objects.filter(pk__any=ids).values_list("id", "sort_key")
    return dict(rows)


def by_what_hosts_run(tasks: list[TaskRef]) -> tuple[dict[int, str], dict[int, str]]:
    """What the hosts run already settles, for pending upgrades about to take their host: (those with
    nothing to do, those overtaken), each {task id: what the host runs}. One read, only for upgrades
    (and one for the versions downgrades were asked from, only when `overtaken` needs them). Both are
    asked wherever a task takes a host (admission, handover): the one place of this rule."""
    if not any(task.target_version_id for task in tasks):
        return {}, {}
    installed = installed_versions(tasks)
    runs = nothing_to_do(tasks, installed)
    return runs, overtaken([task for task in tasks if task.id not in runs], installed)


def finish_overtaken(ctx: TickContext, tasks: dict[int, TaskRef], runs: dict[int, str]) -> None:
    """Pending → cancelled with the code superseded (as any task a newer version superseded: the
    withdrawn version's rollback asks again for it, resubmission.py), naming what the host runs. One
    guarded UPDATE per version, an event per task."""
    by_label: dict[str, list[TaskRef]] = defaultdict(list)
    for task_id, label in runs.items():
        by_label[label].append(tasks[task_id])
    for label, group in by_label.items():
        ctx.move_tasks(
            group,
            expected=TaskState.PENDING,
            new=TaskState.CANCELLED,
            failure_code=FailureCode.SUPERSEDED,
            failure_reason=f"superseded by {label}, which the host got after this task was created"[:500],
            finished_at=ctx.now,
            waiting_code="",
            waiting_reason="",
        )


def _version_labels(tasks: Iterable[TaskRef]) -> dict[int, str]:
    """{version id: "bios 2.18.0"} for the tasks' targets (one query)."""
    versions = ComponentVersion.objects.filter(pk__any={t.target_version_id for t in tasks})
    return {version.pk: str(version) for version in versions.select_related("component")}


def waiting_for_newer(newer: dict[int, TaskRef]) -> dict[int, str]:
    """{task id: why it waits} for pending upgrades whose newer target, pending for the same host,
    has not taken it yet: they end superseded once it does, and are judged again if it is cancelled.
    Said without the version's name, which would cost a read every tick they wait."""
    return {
        task_id: f"a newer version of its component (operation #{taker.operation_id}) is pending for the host "
        "and takes its place"
        for task_id, taker in newer.items()
    }


def finish_superseded(ctx: TickContext, tasks: dict[int, TaskRef], newer: dict[int, TaskRef]) -> None:
    """Cancel each pending task with the code superseded and a reason naming the newer version and
    its operation: one guarded UPDATE per newer operation and version, an event per task."""
    if not newer:
        return
    labels = _version_labels(newer.values())
    groups: dict[tuple[int, int | None], list[TaskRef]] = defaultdict(list)
    for task_id, taker in newer.items():
        groups[(taker.operation_id, taker.target_version_id)].append(tasks[task_id])
    for (operation_id, version_id), group in groups.items():
        reason = f"superseded by {labels.get(version_id or 0, 'a newer version')} of operation #{operation_id}"
        ctx.move_tasks(
            group,
            expected=TaskState.PENDING,
            new=TaskState.CANCELLED,
            failure_code=FailureCode.SUPERSEDED,
            failure_reason=reason,
            finished_at=ctx.now,
            waiting_code="",
            waiting_reason="",
        )


def finish_nothing_to_do(ctx: TickContext, tasks: dict[int, TaskRef], runs: dict[int, str]) -> None:
    """Pending → done, without a lease, a drain or a work item: the host already runs the target
    or newer. One guarded UPDATE (through admitted, as every admitted task), an event per step."""
    if not runs:
        return
    ctx.move_tasks(
        [tasks[task_id] for task_id in runs],
        expected=TaskState.PENDING,
        via=TaskState.ADMITTED,
        new=TaskState.DONE,
        reason="nothing to do: the host already runs the target",
        reasons={task_id: f"nothing to do: the host already runs {label}" for task_id, label in runs.items()},
        admitted_at=ctx.now,
        finished_at=ctx.now,
        waiting_code="",
        waiting_reason="",
    )


class Settled(NamedTuple):
    """What `finish_admitted_with_nothing_to_do` left of the admitted tasks."""

    taking: list[TaskRef]  # they take their host
    overtaken: set[int]  # ended superseded by what their host got since: they took nothing


def finish_admitted_with_nothing_to_do(ctx: TickContext, admitted: list[TaskRef]) -> Settled:
    """The admitted upgrades whose host already runs their target (or newer) finish without a drain,
    those overtaken by what their host got since they were created end superseded (by_what_hosts_run);
    the others take their host. The host such a task claimed and the room it took are free again:
    admission then judges again what waits (admission.admit)."""
    runs, overtook = by_what_hosts_run(admitted)
    if not runs and not overtook:
        return Settled(admitted, set())
    by_id = {task.id: task for task in admitted}
    finish_nothing_to_do(ctx, by_id, runs)
    finish_overtaken(ctx, by_id, overtook)
    return Settled([task for task in admitted if task.id not in runs and task.id not in overtook], set(overtook))
