"""check_invariants: verify a live database against DESIGN.md's invariants 1-5.

Each check is one set-based query; a violation names what is wrong and where. All of them read one
snapshot of the database, so a fleet that moves while they run is never seen half before, half after.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.db.models.fields.json import KT

from fleet.models import Host, HostState, Pool
from fleet.selectors.capacity import pool_capacities
from opsplanner.models import (
    TERMINAL_TASK_STATES,
    Event,
    HostTask,
    Lease,
    OperationSource,
    TaskState,
    VerifyClass,
    WorkItem,
    WorkKind,
    WorkState,
)


@dataclass(frozen=True)
class Violation:
    code: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


def check_invariants(*, pool: Pool | None = None) -> list[Violation]:
    hosts = Host.objects.all() if pool is None else Host.objects.filter(pool=pool)
    leases = Lease.objects.filter(active=True) if pool is None else Lease.objects.filter(active=True, pool_id=pool.pk)
    tasks = HostTask.objects.all() if pool is None else HostTask.objects.filter(pool_id=pool.pk)
    with _one_snapshot():
        return [
            *_one_holder_per_host(leases),
            *_capacity_floors(pool),
            *_verified_returns(tasks, leases),
            *_nothing_stuck(hosts, leases),
            *_nothing_silent(hosts, tasks),
        ]


@contextmanager
def _one_snapshot() -> Iterator[None]:
    """One transaction, unless the caller already holds one: on PostgreSQL a read-only REPEATABLE READ
    one (under READ COMMITTED each query sees its own moment: an emergency drain committed between
    the lease count and the capacity count read as three hosts out for planned work against a buffer
    of one); SQLite's transactions (the embedded default) read one snapshot already."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def _one_holder_per_host(leases: QuerySet[Lease]) -> Iterator[Violation]:
    """1. Overlap serialisation: one holder per host (the index forbids more; we check anyway)."""
    for host_id, count in leases.values("host_id").annotate(n=Count("id")).filter(n__gt=1).values_list("host_id", "n"):
        yield Violation("double_lease", f"host {host_id} has {count} active leases")
    for lease_id, host_id, task_id in leases.filter(host_task__state=TaskState.PENDING).values_list(
        "id", "host_id", "host_task_id"
    ):
        yield Violation("lease_of_pending_task", f"lease {lease_id} on host {host_id} by task {task_id}")


def _capacity_floors(pool: Pool | None) -> Iterator[Violation]:
    """2. Capacity floor, per pool. Hosts held by an approved emergency may exceed the planned
    buffer and the floor, never the pool's hard floor."""
    emergency_out = dict(
        Lease.objects.filter(active=True, operation__override_buffers=True)
        .values("pool_id")
        .annotate(n=Count("id"))
        .values_list("pool_id", "n")
    )
    for capacity in pool_capacities():
        if pool is not None and capacity.pool.pk != pool.pk:
            continue
        buffers = capacity.buffers
        name = capacity.pool.name
        emergency = emergency_out.get(capacity.pool.pk, 0)
        if capacity.planned_out - emergency > buffers.planned:
            yield Violation(
                "planned_buffer",
                f"pool {name}: {capacity.planned_out} hosts out for planned work, buffer {buffers.planned}",
            )
        hard_floor = capacity.pool.hard_floor_hosts
        floor = buffers.floor if not emergency or hard_floor is None else min(hard_floor, buffers.floor)
        if capacity.in_service < floor and capacity.failure_out <= buffers.failure:
            yield Violation("floor", f"pool {name}: {capacity.in_service} hosts in service, floor {floor}")


def _verified_returns(tasks: QuerySet[HostTask], leases: QuerySet[Lease]) -> Iterator[Violation]:
    """3. Pre-return verification: a drained task is done only after three passed checks and a return."""
    passed = WorkItem.objects.filter(
        host_task=OuterRef("pk"), kind=WorkKind.VERIFY, state=WorkState.DONE, result__passed=True
    )
    returned = WorkItem.objects.filter(host_task=OuterRef("pk"), kind=WorkKind.UNDRAIN, state=WorkState.DONE)
    done_drained = tasks.filter(state=TaskState.DONE, drain_key__isnull=False)
    for verify_class in (VerifyClass.HEALTH, VerifyClass.BURN_IN, VerifyClass.COLLECTIVE):
        for task_id, host_id in done_drained.exclude(Exists(passed.filter(verify_class=verify_class))).values_list(
            "id", "host_id"
        ):
            yield Violation(
                "unverified_return",
                f"task {task_id} on host {host_id} is done without a passed {verify_class} check",
            )
    for task_id, host_id in done_drained.exclude(Exists(returned)).values_list("id", "host_id"):
        yield Violation("unverified_return", f"task {task_id} on host {host_id} is done but never returned")
    for host_id, task_id in leases.filter(
        host__state=HostState.IN_SERVICE, host_task__drain_key__isnull=False
    ).values_list("host_id", "host_task_id"):
        yield Violation("unverified_return", f"host {host_id} is in service while task {task_id} holds it in a drain")


def _nothing_stuck(hosts: QuerySet[Host], leases: QuerySet[Lease]) -> Iterator[Violation]:
    """4. Nothing stuck: a host out of service has a holder (escalated hosts wait for a human), or,
    having broken in service, a repair queued for the next tick."""
    holder = Lease.objects.filter(host=OuterRef("pk"), active=True)
    queued_repair = HostTask.objects.filter(
        host=OuterRef("pk"), state=TaskState.PENDING, operation__source=OperationSource.REPAIR
    )
    for host_id, hostname, state in (
        hosts.exclude(state__in=[HostState.IN_SERVICE, HostState.ESCALATED])
        .exclude(Exists(holder))
        .exclude(Q(state=HostState.FAILED) & Exists(queued_repair))
        .values_list("id", "hostname", "state")
    ):
        yield Violation("stuck_host", f"host {hostname} ({host_id}) is {state} and nobody holds it")
    for lease_id, host_id, task_id, state in leases.filter(
        host_task__state__in=TERMINAL_TASK_STATES, host__state=HostState.IN_SERVICE
    ).values_list("id", "host_id", "host_task_id", "host_task__state"):
        yield Violation("leaked_lease", f"lease {lease_id} on host {host_id} kept by {state} task {task_id}")


def _nothing_silent(hosts: QuerySet[Host], tasks: QuerySet[HostTask]) -> Iterator[Violation]:
    """5. Nothing silent: every task and host state has the event that put it there."""
    events_to = Event.objects.annotate(to_state=KT("data__to"))
    task_event = events_to.filter(
        subject_type="opsplanner.hosttask",
        subject_id=OuterRef("pk"),
        kind="task.state_changed",
        to_state=OuterRef("state"),
    )
    for task_id, state in (
        tasks.exclude(state=TaskState.PENDING).exclude(Exists(task_event)).values_list("id", "state")[:100]
    ):
        yield Violation("silent_change", f"task {task_id} is {state} with no event saying so")
    host_event = events_to.filter(
        subject_type="fleet.host", subject_id=OuterRef("pk"), kind="host.state_changed", to_state=OuterRef("state")
    )
    for host_id, state in (
        hosts.exclude(state=HostState.IN_SERVICE).exclude(Exists(host_event)).values_list("id", "state")[:100]
    ):
        yield Violation("silent_change", f"host {host_id} is {state} with no event saying so")
    for task_id in tasks.filter(state=TaskState.FAILED, failure_reason="").values_list("id", flat=True):
        yield Violation("silent_refusal", f"task {task_id} failed without a reason")
