"""Superseded versions installed in place (operations with needs_drain=False): an upgrade to N waits
for the host while an in-place upgrade to N+1 of the same component holds it, and ends superseded
only once N+1 is applied; N+1 failed leaves the host N, applied after the repair, once."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState
from opsplanner.models import Event, HostTask, Operation, OperationState, TaskState, WaitingCode, WorkItem, WorkKind
from opsplanner.models.operations import FailureCode
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator
from tests.test_superseded_versions import bios, bios_on, bios_upgrade, executions

pytestmark = pytest.mark.django_db


def test_n_waits_for_the_host_an_in_place_n_plus_one_holds_and_ends_superseded_once_it_is_applied() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    older = bios_upgrade(hosts, "2.16.0", needs_drain=False)
    newer = bios_upgrade(hosts, "2.18.0", needs_drain=False)

    pool_tick(pool_id=pool.pk)

    assert newer.tasks.get().state == TaskState.RUNNING
    task = older.tasks.get()
    assert (task.state, task.waiting_code) == (TaskState.PENDING, WaitingCode.HOST_HELD)
    assert task.waiting_reason == f"host held by operation #{newer.pk}"
    # The next ticks judge it in the same words: nothing to write while 2.18.0 runs.
    assert pool_tick(pool_id=pool.pk).counts.waiting_reasons_changed == 0

    simulated_work_step()  # 2.18.0 installed in place
    pool_tick(pool_id=pool.pk)

    task = older.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{newer.pk}"
    assert task.finished_at == WorkItem.objects.get(host=hosts[0], kind=WorkKind.EXECUTE).consumed_at
    assert Event.objects.get(kind="task.state_changed", subject_id=task.pk, data__to=TaskState.CANCELLED)
    drive(pool)
    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 1
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
    for operation in (older, newer):
        assert Operation.objects.get(pk=operation.pk).state == OperationState.COMPLETED


def test_n_is_applied_once_after_the_repair_when_an_in_place_n_plus_one_fails() -> None:
    instant_simulator(execute_by_kind={"upgrade:bios:2.18.0": {"failure_rate": 1.0}})
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    older = bios_upgrade(hosts, "2.16.0", needs_drain=False)
    newer = bios_upgrade(hosts, "2.18.0", needs_drain=False)

    drive(pool, max_rounds=100)

    assert newer.tasks.get().state == TaskState.FAILED
    task = older.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.DONE, ""), task.failure_reason
    assert bios_on(hosts[0]) == "2.16.0"  # not left on 2.14.0, with neither version
    assert HostTask.objects.filter(operation=older).count() == 1
    assert WorkItem.objects.filter(host_task__operation=older, kind=WorkKind.EXECUTE).count() == 1
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
    assert Operation.objects.get(pk=older.pk).state == OperationState.COMPLETED


def test_n_is_applied_when_the_executor_reports_an_in_place_n_plus_one_done_without_it() -> None:
    # No pre-return gate checks work done in place: N is superseded only where the host runs N+1.
    from opsplanner.services.work_items import work_item_report, work_items_claim

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    older = bios_upgrade(hosts, "2.16.0", needs_drain=False)
    newer = bios_upgrade(hosts, "2.18.0", needs_drain=False, executor="external")
    pool_tick(pool_id=pool.pk)
    assert newer.tasks.get().state == TaskState.RUNNING
    (item,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=1)
    work_item_report(item_id=item.pk, worker="agent", key="k", outcome="done", result={"versions": {"bios": "2.14.0"}})

    drive(pool)

    assert older.tasks.get().state == TaskState.DONE
    assert bios_on(hosts[0]) == "2.16.0"  # not left on 2.14.0 with neither


def test_an_in_place_n_plus_one_reported_with_a_newer_version_still_supersedes_n() -> None:
    # N applied after it would have taken the host down from 2.20.0 to 2.16.0.
    from opsplanner.services.work_items import work_item_report, work_items_claim

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    bios("2.20.0")
    older = bios_upgrade(hosts, "2.16.0", needs_drain=False)
    newer = bios_upgrade(hosts, "2.18.0", needs_drain=False, executor="external")
    pool_tick(pool_id=pool.pk)
    assert newer.tasks.get().state == TaskState.RUNNING
    (item,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=1)
    work_item_report(item_id=item.pk, worker="agent", key="k", outcome="done", result={"versions": {"bios": "2.20.0"}})

    drive(pool)

    assert older.tasks.get().failure_code == FailureCode.SUPERSEDED
    assert bios_on(hosts[0]) == "2.20.0"
