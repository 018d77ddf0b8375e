"""Superseded versions skipped, for a gang's member: a gang operation's upgrade to N pending for a
host that gets N+1 from other work (applied in a drain, or in place) ends superseded once N+1 is
applied, and the rest of its gang goes on without it; it never takes the host back down to N."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Host, Pool
from fleet.services import optout_window_cancel, optout_window_create, service_place
from opsplanner import clock
from opsplanner.models import HostTask, Operation, OperationState, TaskState
from opsplanner.models.operations import FailureCode
from tests.builders import make_fleet, make_service
from tests.driving import drive, drive_trains, instant_simulator
from tests.test_superseded_versions import bios, bios_on, bios_upgrade, executions
from tests.trains_builders import make_train
from trains.models import Upgrade, UpgradeState
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def three_hosts_two_may_go_out() -> tuple[Pool, list[Host]]:
    return make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2, failure_buffer_hosts=0)


def gang_upgrade(hosts: list[Host], version: str, **fields: object) -> Operation:
    return bios_upgrade(hosts, version, gang=True, **fields)


def optout_window(hosts: list[Host]) -> int:
    """An opt-out window over the hosts, under way for a week: its id."""
    service = make_service()
    service_place(service=service, hosts=hosts)
    now = clock.now()
    return optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(days=7), reason="launch"
    ).pk


def task_on(operation: Operation, host: Host) -> HostTask:
    return operation.tasks.get(host=host)


def assert_superseded(task: HostTask, by: Operation) -> None:
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{by.pk}"
    assert task.drain_key is None


def test_a_gangs_n_waiting_while_its_host_got_n_plus_one_does_not_take_it_back_down() -> None:
    instant_simulator()
    pool, hosts = three_hosts_two_may_go_out()
    window = optout_window(hosts[1:2])
    gang = gang_upgrade(hosts[:2], "2.16.0")
    drive(pool, until=lambda: True)  # the gang waits for the window over host 1
    assert set(gang.tasks.values_list("state", flat=True)) == {TaskState.PENDING}
    bios("2.18.0")
    newer = bios_upgrade(hosts[:1], "2.18.0", priority=200)  # else it queues behind the gang for host 0
    drive(pool, until=lambda: newer.tasks.get().state == TaskState.DONE)

    # Once N+1 is applied on host 0, the gang's N there is superseded, before the gang is admitted.
    assert_superseded(task_on(gang, hosts[0]), by=newer)
    optout_window_cancel(window_id=window, reason="launch done", actor="owner")
    drive(pool)

    assert [bios_on(host) for host in hosts[:2]] == ["2.18.0", "2.16.0"]
    assert executions(hosts[0]) == 1
    assert task_on(gang, hosts[1]).state == TaskState.DONE
    assert Operation.objects.get(pk=gang.pk).state == OperationState.COMPLETED


def test_a_gangs_n_behind_n_plus_one_in_the_queue_is_superseded_and_its_other_host_gets_n() -> None:
    instant_simulator()
    pool, hosts = three_hosts_two_may_go_out()
    gang = gang_upgrade(hosts[:2], "2.16.0", priority=100)
    bios("2.18.0")
    newer = bios_upgrade(hosts[:1], "2.18.0", priority=200)  # first in line for host 0: the gang waits

    drive(pool)

    assert [bios_on(host) for host in hosts[:2]] == ["2.18.0", "2.16.0"]
    assert executions(hosts[0]) == 1
    assert_superseded(task_on(gang, hosts[0]), by=newer)
    assert task_on(gang, hosts[1]).state == TaskState.DONE
    assert Operation.objects.get(pk=gang.pk).state == OperationState.COMPLETED


def test_a_gangs_n_is_superseded_once_n_plus_one_is_installed_in_place_on_its_host() -> None:
    instant_simulator()
    pool, hosts = three_hosts_two_may_go_out()
    window = optout_window(hosts[1:2])
    gang = gang_upgrade(hosts[:2], "2.16.0")
    bios("2.18.0")
    newer = bios_upgrade(hosts[:1], "2.18.0", needs_drain=False, priority=200)
    drive(pool, until=lambda: newer.tasks.get().state == TaskState.DONE)

    assert_superseded(task_on(gang, hosts[0]), by=newer)
    optout_window_cancel(window_id=window, reason="launch done", actor="owner")
    drive(pool)
    assert [bios_on(host) for host in hosts[:2]] == ["2.18.0", "2.16.0"]


def test_a_gang_whose_every_host_got_n_plus_one_completes_without_a_drain() -> None:
    instant_simulator()
    pool, hosts = three_hosts_two_may_go_out()
    gang = gang_upgrade(hosts[:2], "2.16.0", priority=100)
    bios("2.18.0")
    newer = bios_upgrade(hosts[:2], "2.18.0", priority=200)

    drive(pool)

    assert [bios_on(host) for host in hosts[:2]] == ["2.18.0", "2.18.0"]
    for host in hosts[:2]:
        assert_superseded(task_on(gang, host), by=newer)
        assert executions(host) == 1
    assert Operation.objects.get(pk=gang.pk).state == OperationState.COMPLETED


def test_a_gangs_n_behind_a_trains_n_plus_one_on_its_hosts_is_superseded_there() -> None:
    instant_simulator()
    pool, hosts = three_hosts_two_may_go_out()
    make_train(pool)
    gang = gang_upgrade(hosts[:2], "2.16.0", priority=0)  # behind the train's work in the queue
    bios("2.18.0")
    upgrade_create(pool=pool, component="bios", version="2.18.0", reason="fixed release")

    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists())
    drive(pool)

    assert {bios_on(host) for host in hosts} == {"2.18.0"}
    assert {executions(host) for host in hosts} == {1}
    assert set(gang.tasks.values_list("state", "failure_code")) == {(TaskState.CANCELLED, FailureCode.SUPERSEDED)}
    assert Operation.objects.get(pk=gang.pk).state == OperationState.COMPLETED
