"""Rolling back a withdrawn version: every host that may serve with it goes back to the version it
ran before, through an ordinary upgrade operation at just below repair priority. The one rule for
both ways a version is withdrawn: an upgrade offboarded (trains) and a version withdrawn by hand or by
the fleet file with no upgrade active (fleet). Runs in the caller's transaction. And the installs of
a withdrawn version no executor has claimed yet are stopped (`installs_stop`), for both ways too;
one that the stop missed, by the claim that finds it (`withdrawn_installs_stop`)."""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import OperationalError, connection, transaction
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, OuterRef, Q, QuerySet

from fleet.models import ComponentVersion, HostState, InstalledVersion
from opsplanner import clock
from opsplanner.events import Actor, actor_fields, event_record, event_row, events_copy_rows
from opsplanner.models import (
    OPEN_TASK_STATES,
    REPAIR_PRIORITY,
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
from opsplanner.models.work_items import NOT_RUN_KEY, NotRunCode
from opsplanner.services.compatibility import Refusal, withdrawn_refusal
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick.context import SUBJECT_WORK

ROLLBACK_PRIORITY = REPAIR_PRIORITY - 100

# Hosts that may be in service with a withdrawn version without passing the pre-return gate or a
# repair (both of which take it off): those in service, those already past the gate on their way
# back, and those draining (a failed drain returns the host as it was). A host that the gate or a
# repair puts right after all ends its rollback as "nothing to do" at admission. Hosts elsewhere
# (in maintenance, in repair) meet the gate before they serve again.
MAY_SERVE_WITHDRAWN = (HostState.IN_SERVICE, HostState.RETURNING, HostState.DRAINING)


class VersionRollback(NamedTuple):
    operations: list[int]  # the rollback operations submitted, one per pool and previous version
    # Hosts that run the version but never recorded what they ran before: nothing to roll back to,
    # so the pre-return gate takes it off them at their next drain.
    without_previous: int


def _serving(version_ids: Iterable[int]) -> QuerySet[InstalledVersion]:
    """Installed versions among `version_ids` on hosts that may serve with them and are not already
    being put right: a host with an open repair task installing another version of the component (an
    earlier rollback: offboarding a version's upgrades in two pools rolls its hosts back once)."""
    in_repair = HostTask.objects.filter(
        host_id=OuterRef("host_id"),
        state__in=OPEN_TASK_STATES,
        operation__source=OperationSource.REPAIR,
        operation__component_version__component_id=OuterRef("component_id"),
    ).exclude(operation__component_version_id=OuterRef("version_id"))
    return InstalledVersion.objects.filter(
        version_id__in=list(version_ids), host__state__in=MAY_SERVE_WITHDRAWN
    ).exclude(Exists(in_repair))


class PlannedWithdrawals(NamedTuple):
    """Versions as a fleet file's apply will have them when its withdrawals' work runs, for its plan,
    which reads before anything is written (the apply writes every version first: writers.py), and
    what the withdrawals before the one read changed that it reads. A selector asked with the
    default reads them as they are."""

    withdrawn: Mapping[int, str] = {}  # version id -> the reason the file gives
    released: frozenset[int] = frozenset()
    # Completed upgrades an earlier withdrawal of the same apply makes active again (the apply runs
    # them one after another): no longer completed when a later one reads (trains' offboarding.py).
    reopened: frozenset[int] = frozenset()

    def refusal(self, version: ComponentVersion) -> Refusal | None:
        """`withdrawn_refusal` of the version as it will be."""
        if version.pk in self.released:
            return None
        if version.pk in self.withdrawn and version.withdrawn_at is None:
            version = copy.copy(version)
            version.withdrawn_at, version.withdrawn_reason = clock.now(), self.withdrawn[version.pk]
        return withdrawn_refusal(version)

    def withdrawn_q(self, field: str) -> Q:
        """The rows whose version `field` is withdrawn, as it will be."""
        live = Q(**{f"{field}__withdrawn_at__isnull": False})
        if self.released:
            live &= ~Q(**{f"{field}_id__in": sorted(self.released)})
        if self.withdrawn:
            live |= Q(**{f"{field}_id__in": sorted(self.withdrawn)})
        return live


AS_THEY_ARE = PlannedWithdrawals()


def going_back_below(target: Any, *, planned: PlannedWithdrawals = AS_THEY_ARE) -> Q:
    """InstalledVersion rows of a withdrawn version whose host its rollback takes below `target` (a
    sort key, or a reference to one): the version it ran before is older or withdrawn too, or there is
    none (the pre-return gate takes the withdrawn version off). What fell back with the withdrawal: a
    completed upgrade's hosts (trains/services/offboarding.py) or an ad-hoc operation's (resubmission.py).
    `planned`: the versions as a fleet file will have them (its plan)."""
    return (
        Q(previous_version__isnull=True)
        | Q(previous_version__sort_key__lt=target)
        | planned.withdrawn_q("previous_version")
    )


class RollbackGroup(NamedTuple):
    """Hosts that may serve with a withdrawn version, of one pool, and what they ran before: one
    rollback operation (`version_rollback`)."""

    version_id: int
    pool_id: int
    previous: ComponentVersion | None  # None: nothing to go back to (the pre-return gate takes it off)
    host_ids: list[int]
    refusal: Refusal | None  # why no rollback to `previous` is submitted: it is withdrawn too


def rollback_groups(version_ids: Iterable[int], *, planned: PlannedWithdrawals = AS_THEY_ARE) -> list[RollbackGroup]:
    """The rollbacks withdrawing these versions submits, by version, pool and previous version (in
    that order, the previous versions by name), each refused when its previous version is withdrawn
    (the submit path's refusal of a withdrawn target, read first so that a fleet file's plan counts
    it: `planned`, the versions as the file will have them). Hosts without a previous version are one
    group per version and pool (two queries). `version_rollback` submits them; the plan counts them."""
    groups: dict[tuple[int, int, int | None], list[int]] = defaultdict(list)
    for version_id, host_id, pool_id, ran_id in _serving(version_ids).values_list(
        "version_id", "host_id", "host__pool_id", "previous_version_id"
    ):
        groups[(version_id, pool_id, ran_id)].append(host_id)
    ran_before = ComponentVersion.objects.select_related("component").in_bulk(
        {key[2] for key in groups if key[2] is not None}
    )
    found = []
    for (version_id, pool_id, previous_id), host_ids in groups.items():
        previous = ran_before[previous_id] if previous_id is not None else None
        refusal = planned.refusal(previous) if previous is not None else None
        found.append(RollbackGroup(version_id, pool_id, previous, sorted(host_ids), refusal))
    return sorted(found, key=lambda g: (g.version_id, g.pool_id, g.previous is not None, str(g.previous or "")))


def version_rollback(
    *, version: ComponentVersion, scope: str, reason: str, actor: Actor, subject: Any, refused_kind: str
) -> VersionRollback:
    """Submit the rollback of `version` on every host that may serve with it: one operation per pool
    and previous version (`rollback_groups`; `scope` names what withdrew it, `reason` why). A refused
    operation (its previous version withdrawn too, or breaking a compatibility rule) is an event
    `refused_kind` on `subject` with the refusal and the hosts, not an error: the other pools'
    rollbacks stand."""
    operations = []
    without_previous = 0
    for group in rollback_groups([version.pk]):
        if group.previous is None:
            without_previous += len(group.host_ids)
            continue
        try:
            if group.refusal is not None:  # the submit path's refusal, read first (`rollback_groups`)
                raise group.refusal.error("component_version")
            operation = operation_submit(
                kind=OperationKind.UPGRADE,
                scope=f"rollback of {scope} on {len(group.host_ids)} hosts",
                host_ids=group.host_ids,
                component=version.component.name,
                version=group.previous.version,
                reason=reason,
                priority=ROLLBACK_PRIORITY,
                source=OperationSource.REPAIR,
                actor=actor,
            )
        except ValidationError as refusal:
            event_record(
                kind=refused_kind,
                subject=subject,
                actor=actor,
                reason="; ".join(refusal.messages),
                pool_id=group.pool_id,
                data={"hosts": group.host_ids},
            )
            continue
        operations.append(operation.pk)
    return VersionRollback(operations=operations, without_previous=without_previous)


def _unstarted_install(target: Q) -> Q:
    """Work items that are the install of an upgrade task under way to a version `target` picks (a Q
    on the task: `operation__component_version…`) that no executor ever claimed (ready, no attempt:
    one given back after a claim may have started on the host, so it runs on). The task is read by
    an EXISTS, so a locking query over the items joins (and locks) nothing else."""
    tasks = HostTask.objects.filter(
        target, pk=OuterRef("host_task_id"), state=TaskState.RUNNING, operation__kind=OperationKind.UPGRADE
    )
    return Q(kind=WorkKind.EXECUTE, state=WorkState.READY, attempts=0) & Q(Exists(tasks))


def _unstarted_installs(version_ids: Iterable[int]) -> QuerySet[WorkItem]:
    """The unstarted installs (`_unstarted_install`) of these versions."""
    return WorkItem.objects.filter(_unstarted_install(Q(operation__component_version_id__in=list(version_ids))))


def withdrawn_target_install() -> ExpressionWrapper:
    """Whether a work item is an unstarted install of a version withdrawn now, as a column: what a
    claim stops rather than hands out (`withdrawn_installs_stop`)."""
    withdrawn = _unstarted_install(Q(operation__component_version__withdrawn_at__isnull=False))
    return ExpressionWrapper(withdrawn, output_field=BooleanField())


def unstarted_installs_counts(version_ids: Iterable[int]) -> dict[int, int]:
    """{version: installs withdrawing it would stop} (`installs_stop`), for the fleet file's plan."""
    rows = (
        _unstarted_installs(version_ids)
        .values_list("host_task__operation__component_version_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


# How long the stop waits, in all, for the install rows other transactions hold: well under
# PostgreSQL's deadlock_timeout (1 s), so in a wait cycle with a tick the stop gives up first.
HELD_ROWS_WAIT_MS = 500
LOCK_NOT_AVAILABLE = "55P03"  # the SQLSTATE of a lock not granted within lock_timeout


def _stoppable(version_ids: Iterable[int]) -> list[tuple[int, int, int, int]]:
    """The unstarted installs locked for the stop (id, pool, host, operation): the free rows at once,
    then the rows other transactions hold, waited for up to HELD_ROWS_WAIT_MS in all. A refused
    report or heartbeat holds one for milliseconds and changes nothing (skipped, it was claimed and
    ran after the withdrawal); a claim holding one runs it (read again once it commits: running, it
    is no longer unstarted); another pool's tick may hold one while it needs a key share of the
    version's row the withdrawal holds (waiting for it deadlocked), and changes it itself. A row left
    to its holder and still ready, or an install that another pool's tick, having read the version
    before the withdrawal committed, makes ready after this read (an offboarding locks its own pool
    only), is not handed out either: the first claim to find it after the withdrawal committed stops
    it as this stop would (`withdrawn_installs_stop`); past its deadline unclaimed, it fails and its
    tick ends it not applied as its target is withdrawn."""
    columns = ("id", "pool_id", "host_id", "host_task__operation_id")
    installs = _unstarted_installs(version_ids).order_by("id")
    stopping = list(installs.select_for_update(of=("self",), skip_locked=True).values_list(*columns))
    taken = {row[0] for row in stopping}
    held = [pk for pk in installs.values_list("id", flat=True) if pk not in taken]
    if not held or connection.vendor != "postgresql":
        return stopping
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (before,) = cursor.fetchone()
    deadline = time.monotonic() + HELD_ROWS_WAIT_MS / 1000
    try:
        for pk in held:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            stopping += _held_row_lock(installs.filter(pk=pk), columns, wait_ms=left_ms)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])
    return sorted(stopping)


def _held_row_lock(row: QuerySet[WorkItem], columns: tuple[str, ...], *, wait_ms: int) -> list[Any]:
    """The row, locked, waiting at most `wait_ms` for it; nothing when it is still held then (left to
    the transaction that holds it), or no longer an unstarted install."""
    try:
        with transaction.atomic():  # a savepoint: a lock not granted in time leaves the rest as it was
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{wait_ms}ms"])
            return list(row.select_for_update(of=("self",)).values_list(*columns))
    except OperationalError as error:
        if getattr(error.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        return []


class StoppedInstalls(NamedTuple):
    """What `installs_stop` stopped: how many installs, and their operations."""

    installs: int
    operations: frozenset[int]


def stopped_operations_open(stopped: StoppedInstalls | None, *, only_pool: int | None = None) -> set[int]:
    """The operations whose installs `installs_stop` stopped that are still open and that nobody
    cancelled: the withdrawal cancels them, since they installed nothing there, with its reason and
    their pending tasks (one it cannot is closed cancelled by the tick once finished: tick/closing.py).
    With `only_pool`, those whose tasks are all in that pool: an offboarding holds
    its own pool's tick lock only, and cancelling takes the lock of every pool of the operation, after
    the install rows it stopped, which another pool's tick may want while it holds its pool."""
    if stopped is None or not stopped.operations:
        return set()
    still_open = Operation.objects.filter(
        pk__in=stopped.operations, state=OperationState.OPEN, cancelled_at__isnull=True
    )
    if only_pool is not None:
        elsewhere = HostTask.objects.filter(operation=OuterRef("pk")).exclude(pool_id=only_pool)
        still_open = still_open.exclude(Exists(elsewhere))
    return set(still_open.values_list("pk", flat=True))


def installs_stop(*, version_ids: Iterable[int], reason: str, actor: Actor) -> StoppedInstalls:
    """Stop the installs of withdrawn versions no executor has claimed (`_installs_not_run`). Runs in
    the withdrawal's transaction; the rows are locked as `_stoppable` says."""
    stopping = _stoppable(version_ids)
    if not stopping:
        return StoppedInstalls(0, frozenset())
    _installs_not_run([row[:3] for row in stopping], reason=reason, actor=actor)
    return StoppedInstalls(len(stopping), frozenset(row[3] for row in stopping))


def withdrawn_installs_stop(*, item_ids: Sequence[int], actor: Actor) -> None:
    """Stop the installs a claim locked and found to be of a withdrawn target
    (`withdrawn_target_install`) instead of handing them out, as `installs_stop` stops them, with the
    version's reason: those the withdrawal's stop did not (made ready by a tick that read the version
    before the withdrawal committed, or held by another transaction past HELD_ROWS_WAIT_MS). Runs in
    the claim's transaction; one query to read them, then the stop's own writes."""
    rows = WorkItem.objects.filter(pk__in=list(item_ids)).values_list(
        "id", "pool_id", "host_id", "host_task__operation__component_version__withdrawn_reason"
    )
    by_reason: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for item_id, pool_id, host_id, reason in rows.order_by("id"):
        by_reason[reason].append((item_id, pool_id, host_id))
    for reason, installs in by_reason.items():
        _installs_not_run(installs, reason=reason, actor=actor)


def _installs_not_run(installs: list[tuple[int, int, int]], *, reason: str, actor: Actor) -> None:
    """End these unstarted installs (id, pool, host), locked by the caller, of a target withdrawn
    (`reason` the withdrawal's): each item fails unclaimed (no attempt), marked not run (`NOT_RUN_KEY`
    in its result), and the pool's tick ends its task not applied, as for a host drained for a target
    withdrawn meanwhile (its host passes to its next task or goes back), not through repair, even if
    the version is released before that tick. The one way an install is stopped, whoever stops it."""
    now = clock.now()
    why = f"its install was stopped before any executor claimed it: its target was withdrawn ({reason})"[:500]
    WorkItem.objects.filter(pk__in=[row[0] for row in installs], state=WorkState.READY).update(
        state=WorkState.FAILED,
        finished_at=now,
        outcome_reason=why,
        result={NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN},
    )
    actor_id, label = actor_fields(actor)
    data = {"from": WorkState.READY, "to": WorkState.FAILED, "never_claimed": True}
    events_copy_rows(
        [
            event_row(
                kind="work_item.failed",
                subject_type=SUBJECT_WORK,
                subject_id=item_id,
                now=now,
                actor=label,
                actor_id=actor_id,
                reason=why,
                pool_id=pool_id,
                host_id=host_id,
                data=data,
            )
            for item_id, pool_id, host_id in installs
        ]
    )
