"""What one pool's tick accumulates before it writes: events, new work items, counters."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import operator
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, models

from fleet.models import ComponentVersion, Host, InstalledVersion, Pool
from fleet.models.hosts import HOST_TRANSITIONS
from opsplanner.bulk import copy_rows
from opsplanner.events import EventRow, events_copy_rows
from opsplanner.models import TERMINAL_TASK_STATES, HostTask, Lease, Operation, WorkItem, WorkKind, WorkState
from opsplanner.prepared import IDS, PreparedQuery, PreparedUpdate

WORK_ITEM_COLUMNS = (
    "kind",
    "verify_class",
    "host_id",
    "host_task_id",
    "pool_id",
    "adapter",
    "state",
    "params",
    "attempts",
    "max_attempts",
    "claimed_by",
    "deadline_at",
    "report_key",
    "result",
    "outcome_reason",
    "created_at",
)
SUBJECT_TASK = "opsplanner.hosttask"
SUBJECT_HOST = "fleet.host"
SUBJECT_WORK = "opsplanner.workitem"
SUBJECT_LEASE = "opsplanner.lease"
SUBJECT_OPERATION = Operation._meta.label_lower  # the one definition (services.operations uses it too)
ACTOR = "scheduler"


class ConcurrentChange(RuntimeError):
    """A guarded update changed fewer rows than expected: roll the tick back, the next one retries."""


class IllegalTransition(RuntimeError):
    """A host move HOST_TRANSITIONS does not allow: a bug, not a race. The tick rolls back (with a
    `tick.rolled_back` event naming the move) rather than write it."""


@dataclass
class TickCounts:
    """What one pool's tick did, counted by name; tasks and hosts by the state they entered."""

    tasks: Counter[str] = field(default_factory=Counter)  # TaskState entered -> tasks
    hosts: Counter[str] = field(default_factory=Counter)  # HostState entered -> hosts
    leases_granted: int = 0
    leases_released: int = 0
    work_items_created: int = 0
    work_items_retaken: int = 0
    work_items_expired: int = 0
    handovers: int = 0
    repairs_started: int = 0
    operations_completed: int = 0
    operations_cancelled: int = 0  # cancelled while tasks were under way, closed once they finished
    waiting: int = 0  # examined tasks left waiting, with their reasons
    waiting_reasons_changed: int = 0

    @property
    def tasks_finished(self) -> int:
        return sum(n for state, n in self.tasks.items() if state in TERMINAL_TASK_STATES)

    @property
    def hosts_moved(self) -> int:
        return sum(self.hosts.values())

    def as_dict(self) -> dict[str, int]:
        """Flat, for logs: every counter, then task_<state> and host_<state> for the states entered."""
        flat = {
            attribute.name: getattr(self, attribute.name)
            for attribute in dataclasses.fields(self)
            if attribute.name not in ("tasks", "hosts")
        }
        flat.update((f"task_{state}", n) for state, n in self.tasks.items())
        flat.update((f"host_{state}", n) for state, n in self.hosts.items())
        return flat

    def __getitem__(self, name: str) -> int:
        """A counter by its flat name (as logged): 0 for one that never counted."""
        return self.as_dict().get(name, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())


@dataclass
class TaskRef:
    """What the tick needs to know of one host task (read once, set-based)."""

    id: int
    host_id: int
    operation_id: int
    state: str
    drain_key: int | None
    needs_drain: bool
    kind: str
    executor: str
    drainer: str
    max_attempts: int
    drain_timeout_s: int
    estimated_duration_s: int
    source: str
    target_version_id: int | None
    target_component_id: int | None  # the target's component and its place in the version order,
    target_sort_key: str | None  # to skip a target older than another for the host (tick/supersede.py)
    target_withdrawn_at: dt.datetime | None  # a withdrawn target supersedes nothing (tick/supersede.py)
    gang: bool
    hold_reason: str
    override_buffers: bool
    or_newer: bool
    waiting_reason: str
    priority: int
    queued_at: float  # when the task was created, as a number: only ever compared, never shown
    downgrade_from_id: int | None  # asked while the host ran this version, above the target (tick/supersede.py)


class SortableTime(models.Func):
    """A timestamp as a number that sorts like it: reading thousands of timestamps as datetime
    objects costs the tick more than anything else it reads."""

    output_field = models.FloatField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8", **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        return self.as_sql(compiler, connection, template="(julianday(%(expressions)s) * 86400.0)", **extra)


# TaskRef's fields read from the task's own row (the column names are the fields' names) ...
TASK_FIELDS = (
    "id",
    "host_id",
    "operation_id",
    "state",
    "drain_key",
    "waiting_reason",
    "priority",
    "queued_at",
    "downgrade_from_id",
)
# ... and those read from its operation: {TaskRef field: Operation column or lookup}. TaskRef is built by
# name from both (_pick_fields), so reordering any of the three cannot shift a value.
OPERATION_FIELDS = {
    "needs_drain": "needs_drain",
    "kind": "kind",
    "executor": "executor",
    "drainer": "drainer",
    "max_attempts": "max_attempts",
    "drain_timeout_s": "drain_timeout_s",
    "estimated_duration_s": "estimated_duration_s",
    "source": "source",
    "target_version_id": "component_version_id",
    "target_component_id": "component_version__component_id",
    "target_sort_key": "component_version__sort_key",
    "target_withdrawn_at": "component_version__withdrawn_at",
    "gang": "gang",
    "hold_reason": "hold_reason",
    "override_buffers": "override_buffers",
    "or_newer": "or_newer",
}


def task_rows(queryset: models.QuerySet[HostTask]) -> models.QuerySet[HostTask, tuple[Any, ...]]:
    """The queryset as the rows task_refs_from_rows() takes: TASK_FIELDS, in that order."""
    return queryset.annotate(queued_at=SortableTime("created_at")).values_list(*TASK_FIELDS)


def task_refs(queryset: models.QuerySet[HostTask]) -> dict[int, TaskRef]:
    return task_refs_from_rows(list(task_rows(queryset)))


_TASKS_BY_ID = PreparedQuery(lambda *, ids: task_rows(HostTask.objects.filter(pk__any=ids)), ids=IDS)


def task_refs_by_id(ids: Iterable[int]) -> dict[int, TaskRef]:
    """task_refs of the tasks with these ids (compiled once: every tick that advances asks)."""
    return task_refs_from_rows(_TASKS_BY_ID.rows(ids=set(ids)))


_OPERATIONS = PreparedQuery(
    lambda *, ids: Operation.objects.filter(pk__any=ids).values_list("id", *OPERATION_FIELDS.values()), ids=IDS
)


def _pick_fields() -> operator.itemgetter[tuple[Any, ...]]:
    """Picks TaskRef's fields, by name, out of a task's row followed by its operation's: computed
    once from the names (a tick builds thousands of TaskRefs; a dict per row would cost more)."""
    columns = (*TASK_FIELDS, *OPERATION_FIELDS)
    names = tuple(attribute.name for attribute in dataclasses.fields(TaskRef))
    if sorted(columns) != sorted(names):
        raise TypeError(f"TaskRef's fields {names} are not the columns read {columns}")
    return operator.itemgetter(*(columns.index(name) for name in names))


_TASKREF_FIELDS = _pick_fields()
_OPERATION_ID = TASK_FIELDS.index("operation_id")


def task_refs_from_rows(rows: list[tuple[Any, ...]]) -> dict[int, TaskRef]:
    """The tasks' own columns, then their operations' once each (thousands of tasks share a handful
    of operations: a join would send every operation column again with every task)."""
    if not rows:
        return {}
    operations = {row[0]: row[1:] for row in _OPERATIONS.rows(ids={row[_OPERATION_ID] for row in rows})}
    refs = (TaskRef(*_TASKREF_FIELDS(row + operations[row[_OPERATION_ID]])) for row in rows)
    return {ref.id: ref for ref in refs}


_ACTIVE_LEASES = PreparedQuery(
    lambda *, task_ids: Lease.objects.filter(host_task_id__any=task_ids, active=True).values_list("id", "host_id"),
    task_ids=IDS,
)
_LEASES_RELEASE = PreparedUpdate(
    lambda *, ids, now, reason: Lease.objects.filter(pk__any=ids),
    lambda *, ids, now, reason: {"active": False, "released_at": now, "release_reason": reason},
    ids=IDS,
    now=dt.datetime,
    reason=str,
)

# The guarded transitions, compiled once per set of columns they write (see opsplanner.prepared).
_HOST_MOVE = PreparedUpdate(
    lambda *, ids, expected, new, now: Host.objects.filter(pk__any=ids, state=expected),
    lambda *, ids, expected, new, now: {"state": new, "state_changed_at": now},
    ids=IDS,
    expected=str,
    new=str,
    now=dt.datetime,
)
_Shape = tuple[tuple[str, Any], ...]
_EXECUTE_TARGETS = PreparedQuery(  # what an execute item says to install
    lambda *, ids: ComponentVersion.objects.filter(pk__any=ids).values_list("id", "component__name", "version"),
    ids=IDS,
)


def _kind(value: Any) -> Any:
    """A parameter's kind; a choice (a str subclass such as FailureCode) is a str parameter."""
    if isinstance(value, models.F):
        return value
    return str if isinstance(value, str) else type(value)


def _shape(fields: dict[str, Any]) -> _Shape:
    """What a task move writes besides its state: each column with its value's kind, or the
    expression itself (an F() is part of the SQL, not a parameter)."""
    return tuple(sorted((name, _kind(value)) for name, value in fields.items()))


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        name: str.__str__(value) if isinstance(value, str) else value
        for name, value in fields.items()
        if not isinstance(value, models.F)
    }


@functools.lru_cache(maxsize=64)
def _task_move(shape: _Shape) -> PreparedUpdate:
    expressions = {name: kind for name, kind in shape if isinstance(kind, models.F)}
    kinds = {name: kind for name, kind in shape if name not in expressions}
    return PreparedUpdate(
        lambda *, ids, expected, new, now, **_: HostTask.objects.filter(pk__any=ids, state=expected),
        lambda *, ids, expected, new, now, **values: {
            "state": new,
            "state_changed_at": now,
            **values,
            **expressions,
        },
        ids=IDS,
        expected=str,
        new=str,
        now=dt.datetime,
        **kinds,
    )


def _json(data: dict[str, Any] | None) -> str:
    return json.dumps(data) if data else "{}"


def _transition_json(before: str, after: str) -> str:
    """The JSON text of {"from": before, "to": after} without its closing brace, to extend per row."""
    return json.dumps({"from": before, "to": after})[:-1]


@dataclass
class TickContext:
    pool: Pool
    now: dt.datetime
    # Written with COPY by flush().
    events: list[EventRow] = field(default_factory=list)
    new_items: list[tuple[Any, ...]] = field(default_factory=list)
    counts: TickCounts = field(default_factory=TickCounts)
    # Operations with a task that reached a terminal state: only these can have finished.
    touched_operations: set[int] = field(default_factory=set)
    _deadlines: dict[float, dt.datetime | str] = field(default_factory=dict)

    @functools.cached_property
    def stamp(self) -> dt.datetime | str:
        """`now` as the rows COPY writes take it: on PostgreSQL its ISO text, formatted once (psycopg
        takes about 3 µs to dump each timestamp, more than the rest of an event row)."""
        return self.now.isoformat() if connection.vendor == "postgresql" else self.now

    def _deadline(self, seconds: float) -> dt.datetime | str:
        deadline = self._deadlines.get(seconds)  # thousands of items share a handful of timeouts
        if deadline is None:
            at = self.now + dt.timedelta(seconds=seconds)
            deadline = self._deadlines[seconds] = at.isoformat() if isinstance(self.stamp, str) else at
        return deadline

    # -- events ---------------------------------------------------------------------------------
    def event(
        self,
        *,
        kind: str,
        subject_type: str,
        subject_id: int | None,
        host_id: int | None = None,
        reason: str = "",
        data: dict[str, Any] | None = None,
    ) -> None:
        self.events.append(
            EventRow(
                self.stamp, kind, None, ACTOR, subject_type, subject_id, self.pool.pk, host_id, reason, _json(data)
            )
        )

    # -- guarded transitions, set-based ---------------------------------------------------------
    def move_tasks(
        self,
        tasks: Iterable[TaskRef],
        *,
        expected: str,
        new: str,
        via: str = "",
        reason: str = "",
        reasons: dict[int, str] | None = None,
        **fields: Any,
    ) -> None:
        """One guarded UPDATE from expected to new, and an event per task. With via, the tasks pass
        through that state inside this transaction (nobody else can see it): still one UPDATE, and two
        events per task (expected → via, then via → new, the reason on the second), as two moves would write.
        `reasons` gives some tasks their own reason (by task id), still in the one UPDATE."""
        tasks = list(tasks)
        if not tasks:
            return
        ids = [task.id for task in tasks]
        changed = _task_move(_shape(fields)).count(
            ids=set(ids), expected=expected, new=new, now=self.now, **_plain(fields)
        )
        if changed != len(ids):
            raise ConcurrentChange(f"{len(ids) - changed} of {len(ids)} tasks were not {expected}")
        reason = reason or fields.get("failure_reason", "")
        steps = [(expected, via, ""), (via, new, reason)] if via else [(expected, new, reason)]
        now, pool_id, append = self.stamp, self.pool.pk, self.events.append
        for before, after, why in steps:
            head = _transition_json(before, after) + ', "operation": '
            for task in tasks:
                append(
                    EventRow(
                        now,
                        "task.state_changed",
                        None,
                        ACTOR,
                        SUBJECT_TASK,
                        task.id,
                        pool_id,
                        task.host_id,
                        reasons.get(task.id, why) if reasons and why else why,
                        f"{head}{task.operation_id:d}}}",
                    )
                )
            self.counts.tasks[after] += len(ids)
        for task in tasks:
            task.state = new
        if new in TERMINAL_TASK_STATES:
            self.touched_operations.update(task.operation_id for task in tasks)

    def move_hosts(self, host_ids: Iterable[int], *, expected: str, new: str, reason: str) -> None:
        """One guarded UPDATE from expected to new, and an event per host; a pair HOST_TRANSITIONS
        does not allow is refused before anything is written (checked once per call, not per host)."""
        if new not in HOST_TRANSITIONS.get(expected, frozenset()):
            raise IllegalTransition(f"a host cannot go from {expected} to {new}")
        ids = list(host_ids)
        if not ids:
            return
        changed = _HOST_MOVE.count(ids=set(ids), expected=expected, new=new, now=self.now)
        if changed != len(ids):
            raise ConcurrentChange(f"{len(ids) - changed} of {len(ids)} hosts were not {expected}")
        data = _transition_json(expected, new) + "}"
        now, pool_id = self.stamp, self.pool.pk
        self.events.extend(
            EventRow(now, "host.state_changed", None, ACTOR, SUBJECT_HOST, host_id, pool_id, host_id, reason, data)
            for host_id in ids
        )
        self.counts.hosts[new] += len(ids)

    def release_leases(self, task_ids: Iterable[int], *, reason: str) -> None:
        ids = list(task_ids)
        if not ids:
            return
        leases = _ACTIVE_LEASES.rows(task_ids=set(ids))
        if len(leases) != len(ids):
            raise ConcurrentChange(f"{len(ids) - len(leases)} of {len(ids)} tasks held no active lease")
        _LEASES_RELEASE.count(ids={lease_id for lease_id, _ in leases}, now=self.now, reason=reason[:200])
        for lease_id, host_id in leases:
            self.event(
                kind="lease.released", subject_type=SUBJECT_LEASE, subject_id=lease_id, host_id=host_id, reason=reason
            )
        self.counts.leases_released += len(leases)

    def grant_leases(self, tasks: Iterable[TaskRef], *, reason: str) -> None:
        tasks = list(tasks)
        if not tasks:
            return
        # The partial unique index on active leases is the last word: a second holder raises here.
        lease_ids = self._insert_leases(tasks)
        now, pool_id, append = self.stamp, self.pool.pk, self.events.append
        for task in tasks:
            append(
                EventRow(
                    now,
                    "lease.granted",
                    None,
                    ACTOR,
                    SUBJECT_LEASE,
                    lease_ids[task.id],
                    pool_id,
                    task.host_id,
                    reason,
                    f'{{"task": {task.id:d}, "operation": {task.operation_id:d}}}',
                )
            )
        self.counts.leases_granted += len(tasks)

    def _insert_leases(self, tasks: list[TaskRef]) -> dict[int, int]:
        """Insert an active lease per task; return {task id: lease id}. On PostgreSQL one INSERT …
        SELECT FROM unnest() of three arrays, with no model instance per row."""
        if connection.vendor != "postgresql":
            created = Lease.objects.bulk_create(
                [
                    Lease(
                        host_id=t.host_id,
                        host_task_id=t.id,
                        operation_id=t.operation_id,
                        pool_id=self.pool.pk,
                        acquired_at=self.now,
                    )
                    for t in tasks
                ]
            )
            return {lease.host_task_id: lease.pk for lease in created}
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {Lease._meta.db_table} "
                "(host_id, host_task_id, operation_id, pool_id, active, acquired_at, released_at, release_reason) "
                "SELECT host_id, task_id, operation_id, %s, true, %s, NULL, '' "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS rows (host_id, task_id, operation_id) "
                "RETURNING host_task_id, id",
                [
                    self.pool.pk,
                    self.now,
                    [t.host_id for t in tasks],
                    [t.id for t in tasks],
                    [t.operation_id for t in tasks],
                ],
            )
            return dict(cursor.fetchall())

    # -- work items -----------------------------------------------------------------------------
    def add_item(
        self,
        task: TaskRef,
        *,
        kind: str,
        adapter: str,
        deadline_s: float,
        verify_class: str = "",
        params: dict[str, Any] | None = None,
        max_attempts: int | None = None,
    ) -> None:
        """Queue a new work item (a row for an executor to claim). Its task's transition is the event.
        An empty adapter is the pool's for that kind of item."""
        if not adapter:
            adapter = self.pool.drainer if kind in (WorkKind.DRAIN, WorkKind.UNDRAIN) else self.pool.executor
        self.new_items.append(
            (
                kind,
                verify_class,
                task.host_id,
                task.id,
                self.pool.pk,
                adapter,
                WorkState.READY,
                json.dumps(params or {}),
                0,
                max_attempts or task.max_attempts,
                "",
                self._deadline(deadline_s),
                "",
                "{}",
                "",
                self.stamp,
            )
        )

    def add_execute_items(self, tasks: list[TaskRef]) -> None:
        """An execute item per task, saying what to do (the operation's kind and target version)."""
        wanted = {t.target_version_id for t in tasks if t.target_version_id}
        targets = {
            version_id: {"component": component, "version": version}
            for version_id, component, version in _EXECUTE_TARGETS.rows(ids=wanted)
        }
        restore = _rollbacks([t.host_id for t in tasks if t.kind == "repair"])
        for task in tasks:
            params: dict[str, Any] = {"operation": task.operation_id, "kind": task.kind}
            if task.target_version_id is not None:
                params.update(targets.get(task.target_version_id, {}))
            if task.host_id in restore and task.kind == "repair":
                params["restore"] = restore[task.host_id]
            self.add_item(
                task,
                kind=WorkKind.EXECUTE,
                adapter=task.executor,
                params=params,
                deadline_s=max(task.estimated_duration_s * 3, 600),
            )

    def flush(self) -> None:
        copy_rows(WorkItem, WORK_ITEM_COLUMNS, self.new_items)
        self.counts.work_items_created += len(self.new_items)
        events_copy_rows(self.events)


def _rollbacks(host_ids: list[int]) -> dict[int, dict[str, str]]:
    """{host: {component: version}}: what a repair puts back where a host runs a withdrawn version."""
    if not host_ids:
        return {}
    restore: dict[int, dict[str, str]] = {}
    for host_id, component, version in InstalledVersion.objects.filter(
        host_id__any=host_ids, version__withdrawn_at__isnull=False, previous_version__isnull=False
    ).values_list("host_id", "component__name", "previous_version__version"):
        restore.setdefault(host_id, {})[component] = version
    return restore
