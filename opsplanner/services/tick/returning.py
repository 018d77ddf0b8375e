"""Before a host leaves its drain: the pending task it is handed over to, or the checks it must pass
to return to service (invariant 3).

Both are set-based: a handful of queries per call, whatever the number of hosts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from typing import NamedTuple

from fleet.models import ComponentVersion, InstalledVersion
from fleet.selectors.compatibility import host_incompatibilities
from opsplanner.models import DRAIN_READ_STATES, HostTask, OperationKind, OperationState, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.prepared import IDS, PreparedQuery
from opsplanner.services.tick import supersede
from opsplanner.services.tick.checks import incompatible_targets
from opsplanner.services.tick.context import TaskRef, TickContext, task_refs_from_rows, task_rows

# Asked whenever a host's work is applied: compiled once (opsplanner/prepared.py). A gang's tasks
# are read too: none takes a host alone (its gang is admitted whole), but one older than a target
# applied on its host is superseded all the same, else its gang would take the host back down.
_PENDING_ON_HOSTS = PreparedQuery(
    lambda *, hosts: task_rows(
        HostTask.objects.filter(
            host_id__any=hosts,
            state=TaskState.PENDING,
            operation__state=OperationState.OPEN,
        ).order_by("host_id", "-priority", "created_at", "id")
    ),
    hosts=IDS,
)
_APPLIED_IN_DRAINS = PreparedQuery(  # the upgrades the drains applied before the tasks now finishing
    lambda *, keys: task_rows(
        HostTask.objects.filter(drain_key__any=keys, state=TaskState.HANDED_OVER, operation__kind=OperationKind.UPGRADE)
    ),
    keys=IDS,
)


def _applied_in_drains(applied: dict[int, TaskRef]) -> list[TaskRef]:
    """The tasks just applied and every upgrade their drains handed over before them."""
    keys = {task.drain_key for task in applied.values() if task.drain_key is not None}
    earlier = task_refs_from_rows(_APPLIED_IN_DRAINS.rows(keys=keys)) if keys else {}
    return [*applied.values(), *earlier.values()]


class Successors(NamedTuple):
    """What takes each drained host next (`takers`, by host). The older upgrades a taker supersedes
    stay pending: superseded once it is applied (older_than_applied, at the next handover), so that
    a host handed to no one, or to other work, or whose taker ends without its version, keeps them."""

    takers: dict[int, TaskRef]
    held: frozenset[int]  # the hosts with pending work of a held operation (a stopped train's), never a taker


def successors(ctx: TickContext, applied: dict[int, TaskRef], *, installed: bool = True) -> Successors:
    """The pending task that takes each host next, in (priority, age) order. The next task takes the
    host only if admission would let it: not one whose target became incompatible (it keeps waiting,
    with the reason, and the host is verified and returned). Upgrades the drained host must not get
    end here instead: one older than a newer target of the component applied in its drain
    (superseded, a gang's member too, though it never takes the host alone), one at or below what
    the host runs (nothing to do), one older than what the host got after it was created (overtaken:
    a held task's hold lifted since, say); one older than a newer target pending for the host waits
    (superseded once that one is applied, or the host runs it already).
    `installed` False: the tasks ending (the first of their drains) installed nothing, and nothing
    in their drains is applied yet."""
    pending = task_refs_from_rows(_PENDING_ON_HOSTS.rows(hosts=set(applied)))
    held = frozenset(task.host_id for task in pending.values() if task.hold_reason and not task.gang)
    candidates = {task_id: task for task_id, task in pending.items() if not task.hold_reason}
    applied_newer: dict[int, TaskRef] = {}
    if installed and any(task.target_version_id for task in candidates.values()):  # only upgrades can be older
        applied_newer = supersede.older_than_applied(candidates.values(), _applied_in_drains(applied))
    # Every candidate not refused is applied in this drain, in turn: the newest of a component may
    # replace the older ones whatever their order. A gang's task takes no host alone, nor waits here.
    left = [task for task in candidates.values() if not task.gang and task.id not in applied_newer]
    incompatible = incompatible_targets(left)
    pending_newer = supersede.newer_pending(left, may_replace=lambda _, new: new.id not in incompatible)
    left = [task for task in left if task.id not in pending_newer]
    runs, overtaken = supersede.by_what_hosts_run(left)
    takers: dict[int, TaskRef] = {}
    for task in left:
        if task.id not in incompatible and task.id not in runs and task.id not in overtaken:
            takers.setdefault(task.host_id, task)
    # The host already runs what supersedes them: nothing to wait for.
    settled = {older: newer for older, newer in pending_newer.items() if newer.id in runs}
    supersede.finish_superseded(ctx, candidates, {**applied_newer, **settled})
    supersede.finish_nothing_to_do(ctx, candidates, runs)
    supersede.finish_overtaken(ctx, candidates, overtaken)
    return Successors(takers, held)


def supersede_older_than_in_place(ctx: TickContext, applied: list[TaskRef]) -> None:
    """Upgrades just applied in place (no drain, so no handover after them) supersede the older
    pending upgrades of their component on their hosts, a gang's included: admission kept those
    waiting for the host they held (_settle_superseded), so that one failed or cancelled leaves the
    host the older one. Only where the host now runs the target or newer: an executor may report
    its work done and the host on another version (no pre-return gate checks work done in place).
    Two reads, only when an upgrade finishes in place; a held task is left, as at the handover: it
    ends superseded once its hold lifts, when it would take the host (supersede.overtaken)."""
    upgrades = [task for task in applied if task.target_version_id]
    if upgrades:
        reached = supersede.at_or_past_target(upgrades, supersede.installed_versions(upgrades))
        upgrades = [task for task in upgrades if task.id in reached]
    if not upgrades:
        return
    pending = task_refs_from_rows(_PENDING_ON_HOSTS.rows(hosts={task.host_id for task in upgrades}))
    candidates = {task_id: task for task_id, task in pending.items() if not task.hold_reason}
    supersede.finish_superseded(ctx, candidates, supersede.older_than_applied(candidates.values(), upgrades))


def hand_over(
    ctx: TickContext, givers: list[TaskRef], found: Successors, *, not_applied: dict[int, str] | None = None
) -> None:
    """Each giver (a running task whose work was applied) passes its host to the pending task that
    takes it next (`found.takers`, by host) without returning it to service: the giver ends handed
    over, saying to which task; the taker runs at once, in the giver's drain (the older upgrades it
    supersedes end superseded once it is applied: successors). A giver in `not_applied` ({task:
    why}) installed nothing: it ends cancelled, saying why."""
    if not givers:
        return
    takers = found.takers
    handed = {task.id: f"host handed over to task {nxt.id} of operation {nxt.operation_id}"
              for task in givers for nxt in [takers[task.host_id]]}  # fmt: skip
    if not_applied is None:
        ctx.move_tasks(
            givers,
            expected=TaskState.RUNNING,
            new=TaskState.HANDED_OVER,
            finished_at=ctx.now,
            reason="applied; host handed over",
            reasons={task_id: f"applied; {said}" for task_id, said in handed.items()},
        )
    else:
        tasks_not_applied(ctx, givers, not_applied, then=handed)
    ctx.release_leases([t.id for t in givers], reason="handed over without returning to service")
    taking = [takers[giver.host_id] for giver in givers]
    ctx.move_tasks(
        taking,
        expected=TaskState.PENDING,
        new=TaskState.RUNNING,
        admitted_at=ctx.now,
        waiting_code="",
        waiting_reason="",
        reason="handed over: the host is already drained",
    )
    for giver in givers:
        takers[giver.host_id].drain_key = giver.drain_key
    HostTask.objects.bulk_update([HostTask(id=t.id, drain_key=t.drain_key) for t in taking], ["drain_key"])
    ctx.grant_leases(taking, reason="handover")
    ctx.add_execute_items(taking)
    ctx.counts.handovers += len(taking)


def tasks_not_applied(
    ctx: TickContext,
    tasks: list[TaskRef],
    why: dict[int, str],
    *,
    then: dict[int, str],
    expected: str = TaskState.RUNNING,
) -> None:
    """Tasks that installed nothing (`why`, by task: their target was withdrawn while their host
    drained or before an executor claimed their install) end cancelled, saying why and what became
    of their host (`then`, by task). Running, or verifying: the checks of work their drain applied
    before them passed (verification.returns_done)."""
    by_reason: dict[str, list[TaskRef]] = defaultdict(list)
    for task in tasks:
        by_reason[why[task.id]].append(task)
    for reason, group in by_reason.items():
        ctx.move_tasks(
            group,
            expected=expected,
            new=TaskState.CANCELLED,
            failure_code=FailureCode.CANCELLED,
            failure_reason=f"not applied: {reason}"[:500],
            finished_at=ctx.now,
            reasons={task.id: f"not applied: {reason}; {then[task.id]}"[:500] for task in group},
        )


# The pre-return gate's reads, compiled once (opsplanner/prepared.py): every verified host asks.
_DRAIN_UPGRADES = PreparedQuery(
    lambda *, keys: HostTask.objects.filter(
        drain_key__any=keys,
        state__in=DRAIN_READ_STATES,  # every state host_task_drain_idx holds
        operation__kind="upgrade",
    ).values_list(
        "id",
        "drain_key",
        "host_id",
        "operation__component_version_id",
        "operation__component_version__component_id",
        "operation__component_version__sort_key",
        "operation__component_version__withdrawn_at",
        "state",
    ),
    keys=IDS,
)
_INSTALLED = PreparedQuery(
    lambda *, hosts: InstalledVersion.objects.filter(host_id__any=hosts).values_list(
        "host_id", "component_id", "version_id"
    ),
    hosts=IDS,
)
_VERSION_NAMES = PreparedQuery(
    lambda *, ids: ComponentVersion.objects.filter(pk__any=ids).values_list("id", "version"), ids=IDS
)
_RUNNING_WITHDRAWN = PreparedQuery(  # the withdrawn versions the hosts run
    lambda *, ids: InstalledVersion.objects.filter(host_id__any=ids, version__withdrawn_at__isnull=False).values_list(
        "host_id", "component__name", "version__version", "version__withdrawn_reason"
    ),
    ids=IDS,
)


class GateRefusal(NamedTuple):
    """Why the pre-return gate keeps a host out, and the code its task fails with: RUNS_WITHDRAWN when
    the host's only fault is a withdrawn version it runs (no upgrade's failure policy counts that),
    NOT_RETURNABLE otherwise."""

    code: FailureCode
    reasons: list[str]


def pre_return_refusals(tasks: list[TaskRef], *, installed_nothing: Collection[int] = ()) -> dict[int, GateRefusal]:
    """Invariant 3: every upgrade of this drain is at its target, the versions are compatible and
    none is withdrawn; the tasks whose host it refuses, with why. The drain is what it applied:
    not the targets of `installed_nothing` (tasks whose install never ran, which carry the checks
    of the work their drain applied before them: advance._not_applied), withdrawn or not."""
    problems, withdrawn = _pre_return_problems(tasks, frozenset(installed_nothing))
    refusals = {task_id: GateRefusal(FailureCode.NOT_RETURNABLE, reasons) for task_id, reasons in problems.items()}
    for task in tasks:
        if task.host_id in withdrawn:
            code, reasons = refusals.get(task.id, GateRefusal(FailureCode.RUNS_WITHDRAWN, []))
            refusals[task.id] = GateRefusal(code, [*reasons, *withdrawn[task.host_id]])
    return refusals


def _pre_return_problems(
    tasks: list[TaskRef], installed_nothing: frozenset[int]
) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Every upgrade of this drain at its target and the versions compatible: what is not, by task;
    and the withdrawn versions the hosts run, by host."""
    if not tasks:
        return {}, {}
    by_key = {task.drain_key: task for task in tasks}
    chain = _DRAIN_UPGRADES.rows(keys={key for key in by_key if key is not None})
    # Two upgrades of one component in a drain: the newest target is the one the host must run,
    # whatever order they were applied in (the handover applies no older one after a newer one),
    # but for a withdrawn one, which supersedes nothing (supersede.supersedes): the host runs the
    # newest other, or, with none, none in particular.
    newest: dict[tuple[int, int], tuple[str, tuple[int, int, int, int]]] = {}
    # An upgrade of the drain that failed after applying its version (a failed check sent the host
    # to repair) leaves that version installed: the repaired host may return with it, not be sent
    # back to repair for running something newer than the task it superseded. A withdrawn target the
    # host still runs is no missed target either: the gate refuses it as withdrawn (runs_withdrawn).
    tolerated: dict[tuple[int, int], set[int]] = defaultdict(set)
    for task_id, drain_key, host_id, target_id, component_id, sort_key, withdrawn_at, state in chain:
        if drain_key is None or task_id in installed_nothing:  # filtered on drain_key: never null
            continue
        if state == TaskState.FAILED or withdrawn_at is not None:
            tolerated[(drain_key, component_id)].add(target_id)
        elif (drain_key, component_id) not in newest or sort_key > newest[(drain_key, component_id)][0]:
            newest[(drain_key, component_id)] = (sort_key, (drain_key, host_id, target_id, component_id))
    targets = [target for _, target in newest.values()]
    installed = {
        (host_id, component_id): version_id
        for host_id, component_id, version_id in _INSTALLED.rows(hosts={t.host_id for t in tasks})
    }
    names = dict(_VERSION_NAMES.rows(ids=set(installed.values()) | {row[2] for row in targets}))
    problems: dict[int, list[str]] = defaultdict(list)
    for drain_key, host_id, target_id, component_id in targets:
        actual = installed.get((host_id, component_id))
        if actual != target_id and actual not in tolerated[(drain_key, component_id)]:
            problems[by_key[drain_key].id].append(
                f"version {names.get(actual, 'none') if actual else 'none'} installed where the target is "
                f"{names.get(target_id)}"
            )
    incompatible = host_incompatibilities([t.host_id for t in tasks])
    withdrawn: dict[int, list[str]] = defaultdict(list)
    for host_id, component, version, why in _RUNNING_WITHDRAWN.rows(ids={t.host_id for t in tasks}):
        withdrawn[host_id].append(f"runs withdrawn {component} {version} ({why})")
    for task in tasks:
        problems[task.id].extend(incompatible.get(task.host_id, []))
    return {task_id: reasons for task_id, reasons in problems.items() if reasons}, withdrawn
