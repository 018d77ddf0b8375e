"""What one pool's tick accumulates before it writes: events, new work items, counters."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from fleet.models import ComponentVersion, Host, Pool
from opsplanner.bulk import copy_rows
from opsplanner.events import event_row, events_bulk_create
from opsplanner.models import Event, HostTask, Lease, WorkItem, WorkKind, WorkState

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
ACTOR = "scheduler"


class ConcurrentChange(RuntimeError):
    """A guarded update changed fewer rows than expected: roll the tick back, the next one retries."""


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
    gang: bool
    waiting_reason: str
    priority: int
    created_at: dt.datetime


TASK_REF_FIELDS = (
    "id",
    "host_id",
    "operation_id",
    "state",
    "drain_key",
    "operation__needs_drain",
    "operation__kind",
    "operation__executor",
    "operation__drainer",
    "operation__max_attempts",
    "operation__drain_timeout_s",
    "operation__estimated_duration_s",
    "operation__source",
    "operation__component_version_id",
    "operation__gang",
    "waiting_reason",
    "priority",
    "created_at",
)


def task_refs(queryset: models.QuerySet[HostTask]) -> dict[int, TaskRef]:
    return {row[0]: TaskRef(*row) for row in queryset.values_list(*TASK_REF_FIELDS)}


@dataclass
class TickContext:
    pool: Pool
    now: dt.datetime
    events: list[Event] = field(default_factory=list)
    new_items: list[tuple[Any, ...]] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    touched_operations: set[int] = field(default_factory=set)

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
            event_row(
                kind=kind,
                subject_type=subject_type,
                subject_id=subject_id,
                now=self.now,
                actor=ACTOR,
                reason=reason,
                pool_id=self.pool.pk,
                host_id=host_id,
                data=data,
            )
        )

    # -- guarded transitions, set-based ---------------------------------------------------------
    def move_tasks(self, tasks: Iterable[TaskRef], *, expected: str, new: str, reason: str = "", **fields: Any) -> None:
        tasks = list(tasks)
        if not tasks:
            return
        ids = [task.id for task in tasks]
        changed = HostTask.objects.filter(pk__any=ids, state=expected).update(
            state=new, state_changed_at=self.now, **fields
        )
        if changed != len(ids):
            raise ConcurrentChange(f"{len(ids) - changed} of {len(ids)} tasks were not {expected}")
        for task in tasks:
            task.state = new
            self.touched_operations.add(task.operation_id)
            self.event(
                kind="task.state_changed",
                subject_type=SUBJECT_TASK,
                subject_id=task.id,
                host_id=task.host_id,
                reason=reason or fields.get("failure_reason", ""),
                data={"from": expected, "to": new, "operation": task.operation_id},
            )
        self.counts[f"task_{new}"] += len(ids)

    def move_hosts(self, host_ids: Iterable[int], *, expected: str, new: str, reason: str) -> None:
        ids = list(host_ids)
        if not ids:
            return
        changed = Host.objects.filter(pk__any=ids, state=expected).update(state=new, state_changed_at=self.now)
        if changed != len(ids):
            raise ConcurrentChange(f"{len(ids) - changed} of {len(ids)} hosts were not {expected}")
        for host_id in ids:
            self.event(
                kind="host.state_changed",
                subject_type=SUBJECT_HOST,
                subject_id=host_id,
                host_id=host_id,
                reason=reason,
                data={"from": expected, "to": new},
            )
        self.counts[f"host_{new}"] += len(ids)

    def release_leases(self, task_ids: Iterable[int], *, reason: str) -> None:
        ids = list(task_ids)
        if not ids:
            return
        leases = list(Lease.objects.filter(host_task_id__any=ids, active=True).values_list("id", "host_id"))
        if len(leases) != len(ids):
            raise ConcurrentChange(f"{len(ids) - len(leases)} of {len(ids)} tasks held no active lease")
        Lease.objects.filter(pk__any=[lease_id for lease_id, _ in leases]).update(
            active=False, released_at=self.now, release_reason=reason[:200]
        )
        for lease_id, host_id in leases:
            self.event(
                kind="lease.released", subject_type=SUBJECT_LEASE, subject_id=lease_id, host_id=host_id, reason=reason
            )
        self.counts["leases_released"] += len(leases)

    def grant_leases(self, tasks: Iterable[TaskRef], *, reason: str) -> None:
        tasks = list(tasks)
        if not tasks:
            return
        # The partial unique index on active leases is the last word: a second holder raises here.
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
        for lease, task in zip(created, tasks, strict=True):
            self.event(
                kind="lease.granted",
                subject_type=SUBJECT_LEASE,
                subject_id=lease.pk,
                host_id=task.host_id,
                reason=reason,
                data={"task": task.id, "operation": task.operation_id},
            )
        self.counts["leases_granted"] += len(tasks)

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
        """Queue a new work item (a row for an executor to claim). Its task's transition is the event."""
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
                self.now + dt.timedelta(seconds=deadline_s),
                "",
                "{}",
                "",
                self.now,
            )
        )

    def add_execute_items(self, tasks: list[TaskRef]) -> None:
        """An execute item per task, saying what to do (the operation's kind and target version)."""
        wanted = {t.target_version_id for t in tasks if t.target_version_id}
        targets = {
            version_id: {"component": component, "version": version}
            for version_id, component, version in ComponentVersion.objects.filter(pk__any=wanted).values_list(
                "id", "component__name", "version"
            )
        }
        for task in tasks:
            params: dict[str, Any] = {"operation": task.operation_id, "kind": task.kind}
            params.update(targets.get(task.target_version_id, {}))
            self.add_item(
                task,
                kind=WorkKind.EXECUTE,
                adapter=task.executor,
                params=params,
                deadline_s=max(task.estimated_duration_s * 3, 600),
            )

    def flush(self) -> None:
        copy_rows(WorkItem, WORK_ITEM_COLUMNS, self.new_items)
        self.counts["work_items_created"] += len(self.new_items)
        events_bulk_create(self.events)
