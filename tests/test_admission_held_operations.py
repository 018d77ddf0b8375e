"""Admission: work behind held operations still goes on, whatever the length of the queue."""

from __future__ import annotations

import pytest

from fleet.models import Host, Pool
from opsplanner.models import Operation, TaskState, WaitingCode
from opsplanner.services.operations import OperationRequest, operation_submit, operations_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def hosts_scope(hosts: list[Host]) -> str:
    return "hosts: " + ", ".join(host.hostname for host in hosts)


def held_reboots(hosts: list[Host], *, count: int, hold: str) -> list[Operation]:
    """`count` reboots of `hosts`, held (as a paused train holds its visits' operations), ahead of
    routine work in the queue."""
    request = OperationRequest(
        kind="reboot", scope=hosts_scope(hosts), reason="train visit", priority=200, hold_reason=hold
    )
    return operations_submit(requests=[request] * count)


def test_more_held_tasks_than_the_admission_horizon_do_not_starve_the_work_behind_them() -> None:
    # A paused train's visits hold more pending tasks than the head of the queue admission examines
    # (HORIZON_MIN = 100): "a held operation claims no host: the work behind it goes on", also then.
    pool, hosts = make_fleet(domains=1, hosts_per_domain=5, planned_buffer_hosts=2)
    held = held_reboots(hosts[:3], count=35, hold="train t1 is paused: change freeze")  # 105 tasks
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[4:]), reason="kernel", priority=100)

    pool_tick(pool_id=pool.pk, kick=False)

    task = routine.tasks.get()
    assert task.state == TaskState.DRAINING, (task.state, task.waiting_code, task.waiting_reason)
    held_reasons = {
        (t.state, t.waiting_code, t.waiting_reason) for op in held for t in op.tasks.all()
    }  # every held task says why it waits, examined or not
    assert held_reasons == {(TaskState.PENDING, WaitingCode.HELD, "held: train t1 is paused: change freeze")}


def test_held_tasks_alone_in_the_queue_say_they_are_held() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2)
    held = held_reboots(hosts[:2], count=2, hold="waiting for approval #7")

    pool_tick(pool_id=pool.pk, kick=False)

    assert {(t.state, t.waiting_code, t.waiting_reason) for op in held for t in op.tasks.all()} == {
        (TaskState.PENDING, WaitingCode.HELD, "held: waiting for approval #7")
    }
    assert Pool.objects.filter(pk=pool.pk).exists()


def test_a_gang_first_in_line_is_not_starved_by_lower_priority_work_taking_the_room_it_waits_for() -> None:
    from opsplanner.services.simulator import simulated_work_step
    from tests.driving import instant_simulator

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=3)
    operation_submit(kind="reboot", scope=hosts_scope(hosts[3:4]), reason="first", priority=100)
    pool_tick(pool_id=pool.pk, kick=False)  # one host out: the gang cannot go yet
    gang = operation_submit(kind="reboot", scope=hosts_scope(hosts[:3]), reason="gang", priority=500, gang=True)
    for round_number in range(40):
        # Routine work keeps arriving behind the gang, on other hosts.
        operation_submit(
            kind="reboot", scope=hosts_scope([hosts[4 + round_number % 2]]), reason="routine", priority=100
        )
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    states = set(gang.tasks.values_list("state", flat=True))
    assert TaskState.PENDING not in states, gang.tasks.values_list("waiting_reason", flat=True)[0]


def test_the_work_behind_a_gang_waiting_for_room_says_the_room_is_kept_for_the_gang() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=3)
    operation_submit(kind="reboot", scope=hosts_scope(hosts[3:4]), reason="first", priority=100)
    pool_tick(pool_id=pool.pk, kick=False)
    gang = operation_submit(kind="reboot", scope=hosts_scope(hosts[:3]), reason="gang", priority=500, gang=True)
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[4:5]), reason="routine", priority=100)

    pool_tick(pool_id=pool.pk, kick=False)

    assert {(t.state, t.waiting_code, t.waiting_reason) for t in gang.tasks.all()} == {
        (TaskState.PENDING, WaitingCode.GANG, "gang needs 3 hosts at once; 2 may go out now")
    }
    task = routine.tasks.get()
    assert (task.state, task.waiting_code, task.waiting_reason) == (
        TaskState.PENDING,
        WaitingCode.QUEUED,
        f"the room left is kept for gang operation #{gang.pk}, ahead in the queue (3 hosts at once)",
    )


def test_a_gang_that_cannot_fit_until_a_reservation_ends_keeps_no_room_from_the_work_behind_it() -> None:
    import datetime as dt

    from fleet import services as fleet_services
    from tests.builders import make_service

    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=3)
    now = dt.datetime.now(dt.UTC)
    fleet_services.reservation_create(
        service=make_service(name="launch"), pool=pool, min_hosts_in_service=5,
        starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(days=7), reason="launch week",
    )  # fmt: skip
    gang = operation_submit(kind="reboot", scope=hosts_scope(hosts[:3]), reason="gang", priority=500, gang=True)
    routine = operation_submit(kind="reboot", scope=hosts_scope(hosts[4:5]), reason="routine", priority=100)

    pool_tick(pool_id=pool.pk, kick=False)

    assert set(gang.tasks.values_list("state", flat=True)) == {TaskState.PENDING}
    assert routine.tasks.get().state == TaskState.DRAINING
