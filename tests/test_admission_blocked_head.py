"""Admission: work behind a head of the queue that is blocked for a long time by something
other than room (an opt-out window, a host escalated, a host claimed by an earlier task) still goes on.

Admission examines task by task only the head of the queue (HORIZON_MIN = 100 tasks at least); when
every task there waits for a reason that lasts, and room is left, the work behind is read too."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Host, HostState, Pool
from fleet.services import optout_window_create, service_place
from opsplanner import clock
from opsplanner.models import HostTask, Operation, TaskState, WaitingCode
from opsplanner.services.operations import OperationRequest, operation_submit, operations_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet, make_service

pytestmark = pytest.mark.django_db


def hosts_scope(hosts: list[Host]) -> str:
    return "hosts: " + ", ".join(host.hostname for host in hosts)


def urgent_reboots(hosts: list[Host], *, count: int, priority: int = 500) -> list[Operation]:
    """`count` reboots of `hosts`, ahead of routine work in the queue."""
    request = OperationRequest(kind="reboot", scope=hosts_scope(hosts), reason="urgent", priority=priority)
    return operations_submit(requests=[request] * count)


def long_optout(hosts: list[Host]) -> None:
    service = make_service()
    service_place(service=service, hosts=hosts)
    now = clock.now()
    optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(days=7), reason="launch"
    )


def turn(pool: Pool) -> tuple[str, str]:
    return (
        WaitingCode.QUEUED,
        f"waiting its turn in the queue of pool {pool.name} (higher priority first, then older first)",
    )


def admitted_within(pool: Pool, operation: Operation, *, ticks: int) -> HostTask:
    for _ in range(ticks):
        pool_tick(pool_id=pool.pk, kick=False)
    return operation.tasks.get()


def test_work_behind_a_head_of_tasks_under_a_long_optout_window_is_admitted() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2)
    long_optout(hosts[:3])
    blocked = urgent_reboots(hosts[:3], count=40)  # 120 tasks: the head is full of them, for a week
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[5:]), reason="kernel", priority=100)

    task = admitted_within(pool, routine, ticks=3)

    assert task.state == TaskState.DRAINING, (task.state, task.waiting_code, task.waiting_reason)
    reasons = {t.waiting_code for op in blocked for t in op.tasks.all()}
    assert reasons <= {WaitingCode.OPTOUT, WaitingCode.QUEUED}


def test_work_behind_a_head_of_tasks_on_escalated_hosts_is_admitted() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2)
    Host.objects.filter(pk__in=[hosts[0].pk]).update(state=HostState.ESCALATED)
    urgent_reboots(hosts[:1], count=110)  # 110 tasks on an escalated host: "host is escalated", or queued behind
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[5:]), reason="kernel", priority=100)

    task = admitted_within(pool, routine, ticks=3)

    assert task.state == TaskState.DRAINING, (task.state, task.waiting_code, task.waiting_reason)


def test_the_work_behind_a_blocked_head_is_taken_in_queue_order_with_the_room_left() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2)
    long_optout(hosts[:3])
    urgent_reboots(hosts[:3], count=40)  # 120 blocked tasks
    middle = operation_submit(kind="reboot", scope=hosts_scope(hosts[3:4]), reason="middle", priority=300)
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[5:]), reason="kernel", priority=100)

    pool_tick(pool_id=pool.pk, kick=False)

    assert middle.tasks.get().state == TaskState.DRAINING
    assert routine.tasks.get().state == TaskState.DRAINING  # room for two: both taken behind the blocked head


def test_work_behind_held_operations_and_a_blocked_head_is_admitted() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2)
    long_optout(hosts[:3])
    held = operations_submit(
        requests=[
            OperationRequest(
                kind="reboot", scope=hosts_scope(hosts[3:5]), reason="visit", priority=900, hold_reason="train paused"
            )
        ]
        * 60
    )  # 120 held tasks first in line, then 120 blocked by the window
    urgent_reboots(hosts[:3], count=40)
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[5:]), reason="kernel", priority=100)

    task = admitted_within(pool, routine, ticks=3)

    assert task.state == TaskState.DRAINING, (task.state, task.waiting_code, task.waiting_reason)
    assert {(t.waiting_code, t.waiting_reason) for op in held for t in op.tasks.all()} == {
        (WaitingCode.HELD, "held: train paused")
    }


def test_a_quiet_tick_behind_a_blocked_head_rewrites_nothing_and_costs_the_same_again() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2)
    long_optout(hosts[:3])
    urgent_reboots(hosts[:3], count=40)
    Host.objects.filter(pk__in=[h.pk for h in hosts[3:]]).update(state=HostState.ESCALATED)
    operation_submit(kind="reboot", scope=hosts_scope(hosts[5:]), reason="kernel", priority=100)
    pool_tick(pool_id=pool.pk, kick=False)
    statements = []
    for _ in range(2):
        with CaptureQueriesContext(connection) as queries:
            report = pool_tick(pool_id=pool.pk, kick=False)
        statements.append(len(queries))
        assert report.counts["waiting_reasons_changed"] == 0
    assert statements[0] == statements[1]
    waiting = HostTask.objects.filter(pool_id=pool.pk, state=TaskState.PENDING)
    assert all(code and reason for code, reason in waiting.values_list("waiting_code", "waiting_reason"))


def test_tasks_beyond_the_pages_read_still_wait_their_turn() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2)
    long_optout(hosts[:1])
    # More than a tick reads: the head (100 here) and three pages read on, each twice the last (1,500).
    urgent_reboots(hosts[:1], count=3000)
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[5:]), reason="kernel", priority=100)

    pool_tick(pool_id=pool.pk, kick=False)

    task = routine.tasks.get()
    assert task.state == TaskState.PENDING
    assert (task.waiting_code, task.waiting_reason) == turn(pool)
    waiting = HostTask.objects.filter(pool_id=pool.pk, state=TaskState.PENDING)
    assert all(code and reason for code, reason in waiting.values_list("waiting_code", "waiting_reason"))
