"""A host that broke in service is never left failed with nothing to repair it: its repair goes first
whatever else waits for the host, an opt-out window does not hold it, and a cancelled repair hands
the host to a human instead of leaving it failed."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Host, HostState
from fleet.services import optout_window_create, service_place
from opsplanner import clock
from opsplanner.models import MAX_PRIORITY, REPAIR_PRIORITY, Event, HostTask, TaskState, WaitingCode
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.escalations import host_escalation_release
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet, make_service
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db


def state_of(host: Host) -> str:
    return Host.objects.values_list("state", flat=True).get(pk=host.pk)


def test_a_broken_hosts_repair_goes_first_though_older_work_at_the_same_priority_waits_for_the_host() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=0)
    assert REPAIR_PRIORITY == MAX_PRIORITY  # so the reboot below is not behind the repair by priority
    reboot = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="patch", priority=MAX_PRIORITY)
    pool_tick(pool_id=pool.pk)  # no planned buffer: the reboot waits, first in line for its host

    repair = host_failure_report(host_id=hosts[0].pk, reason="GPU fell off the bus", actor="monitor")
    pool_tick(pool_id=pool.pk)

    assert state_of(hosts[0]) == HostState.REPAIR
    assert HostTask.objects.get(operation=repair).state == TaskState.RUNNING
    waiting = HostTask.objects.get(operation=reboot)
    assert (waiting.state, waiting.waiting_code) == (TaskState.PENDING, WaitingCode.QUEUED)
    assert waiting.waiting_reason == f"queued behind operation #{repair.pk} on this host"
    drive(pool, until=lambda: state_of(hosts[0]) == HostState.IN_SERVICE)


def test_a_broken_hosts_repair_goes_first_though_a_gang_at_the_same_priority_waits_for_the_host() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=1)
    gang = operation_submit(
        kind="reboot",
        scope=f"hosts: {hosts[0].hostname}, {hosts[1].hostname}",
        reason="a job's hosts together",
        priority=MAX_PRIORITY,
        gang=True,
        needs_drain=False,
    )
    repair = host_failure_report(host_id=hosts[0].pk, reason="PSU failed", actor="monitor")

    pool_tick(pool_id=pool.pk)

    assert state_of(hosts[0]) == HostState.REPAIR
    assert HostTask.objects.get(operation=repair).state == TaskState.RUNNING
    assert set(HostTask.objects.filter(operation=gang).values_list("state", flat=True)) == {TaskState.PENDING}


def test_a_broken_hosts_repair_does_not_wait_for_an_opt_out_window() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    service = make_service()
    service_place(service=service, hosts=[hosts[0]])
    now = clock.now()
    optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=8), reason="demo"
    )
    reboot = operation_submit(kind="reboot", scope=f"hosts: {hosts[1].hostname}", reason="patch")
    repair = host_failure_report(host_id=hosts[0].pk, reason="GPU fell off the bus", actor="monitor")

    pool_tick(pool_id=pool.pk)

    assert state_of(hosts[0]) == HostState.REPAIR
    assert HostTask.objects.get(operation=repair).state == TaskState.RUNNING
    # Planned work on the window's hosts still waits for it.
    planned = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="patch after the repair")
    drive(pool, until=lambda: HostTask.objects.get(operation=reboot).state == TaskState.DONE)
    assert state_of(hosts[0]) == HostState.IN_SERVICE
    waiting = HostTask.objects.get(operation=planned)
    assert (waiting.state, waiting.waiting_code) == (TaskState.PENDING, WaitingCode.OPTOUT)


def test_cancelling_a_broken_hosts_repair_hands_the_host_to_a_human_who_can_release_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    repair = host_failure_report(host_id=hosts[0].pk, reason="ECC errors", actor="monitor")

    operation_cancel(operation_id=repair.pk, reason="reported by mistake", actor="operator")

    assert state_of(hosts[0]) == HostState.ESCALATED
    assert Event.objects.get(kind="host.escalated", subject_id=hosts[0].pk).reason == "reported by mistake"
    assert HostTask.objects.get(operation=repair).state == TaskState.CANCELLED
    assert check_invariants() == []
    host_escalation_release(host_id=hosts[0].pk, reason="nothing was wrong with it", actor="operator")
    drive(pool)
    assert state_of(hosts[0]) == HostState.IN_SERVICE


def test_cancelling_other_work_of_a_failed_host_leaves_its_repair_to_run() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=0)
    reboot = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="patch")
    host_failure_report(host_id=hosts[0].pk, reason="ECC errors", actor="monitor")

    operation_cancel(operation_id=reboot.pk, reason="not needed any more", actor="operator")

    assert state_of(hosts[0]) == HostState.FAILED
    drive(pool)
    assert state_of(hosts[0]) == HostState.IN_SERVICE
