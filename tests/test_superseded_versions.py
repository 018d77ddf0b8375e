"""Superseded versions skipped, in the tick (every path: ad-hoc operations, emergency trains, trains):
a host that has not yet received version N of a component when N+1 is pending gets N+1 directly.
The N task ends cancelled with the code superseded, its reason naming N+1 and its operation; a task
whose target the host already runs (or exceeds) finishes without a drain."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from fleet.models import Component, ComponentVersion, Host, HostState, InstalledVersion, Pool
from fleet.services import installed_version_set
from opsplanner.models import (
    Approval,
    Event,
    HostTask,
    Lease,
    Operation,
    OperationSource,
    OperationState,
    TaskState,
    WaitingCode,
    WorkItem,
    WorkKind,
)
from opsplanner.models.operations import FailureCode
from opsplanner.services.approvals import approval_decide
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.tick.context import task_refs
from opsplanner.services.tick.returning import pre_return_refusals
from tests.builders import make_fleet, make_version
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import make_user
from trains.models import Train, TrainState
from trains.services.emergency import emergency_train_request
from trains.services.upgrades import NOT_THE_UPGRADES_FAULT

pytestmark = pytest.mark.django_db


def bios(version: str) -> ComponentVersion:
    component = Component.objects.get(name="bios")
    return ComponentVersion.objects.filter(component=component, version=version).first() or make_version(
        component, version
    )


def bios_upgrade(hosts: list[Host], version: str, **fields: object) -> Operation:
    bios(version)
    return operation_submit(
        kind="upgrade", scope="hosts: " + ", ".join(h.hostname for h in hosts), component="bios", version=version,
        reason=f"bios {version}", actor="op", **fields,
    )  # fmt: skip


def running_upgrade(pool: Pool, hosts: list[Host], version: str) -> Operation:
    """An upgrade submitted, admitted and drained for: its tasks run (the version not yet applied)."""
    operation = bios_upgrade(hosts, version)
    pool_tick(pool_id=pool.pk)  # admitted: draining
    simulated_work_step()  # drained
    pool_tick(pool_id=pool.pk)  # running
    return operation


def bios_on(host: Host) -> str:
    return InstalledVersion.objects.get(host=host, component__name="bios").version.version


def drains(pool: Pool) -> int:
    return HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).count()


def executions(host: Host) -> int:
    return WorkItem.objects.filter(host=host, kind=WorkKind.EXECUTE).count()


def test_an_ad_hoc_n_plus_one_with_a_higher_priority_is_the_only_version_the_host_gets() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    older = bios_upgrade(hosts, "2.16.0", priority=100)
    newer = bios_upgrade(hosts, "2.18.0", priority=200)

    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert (drains(pool), executions(hosts[0])) == (1, 1)
    task = older.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{newer.pk}"
    assert task.drain_key is None
    event = Event.objects.get(kind="task.state_changed", subject_id=task.pk, data__to=TaskState.CANCELLED)
    assert event.reason == task.failure_reason
    assert newer.tasks.get().state == TaskState.DONE
    # Nobody cancelled the older operation: it completes, its only task superseded.
    older.refresh_from_db()
    assert older.state == OperationState.COMPLETED
    assert older.closed_at is not None


def test_an_emergency_train_to_n_plus_one_supersedes_a_pending_ad_hoc_n() -> None:
    instant_simulator()
    requester, approver = make_user(), make_user()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=0)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=0)
    older = bios_upgrade(hosts[:1], "2.16.0")
    bios("2.18.0")
    train = emergency_train_request(pool=pool, component="bios", version="2.18.0", reason="CVE", actor=requester)
    approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
    approval_decide(approval_id=approval.pk, approve=True, reason="CVE confirmed", actor=approver)

    drive_trains(pool, until=lambda: Train.objects.get(pk=train.pk).state == TrainState.FINISHED)
    drive(pool)

    assert {bios_on(host) for host in hosts} == {"2.18.0"}
    assert executions(hosts[0]) == 1
    task = older.tasks.get()
    emergency = HostTask.objects.get(host=hosts[0], operation__source=OperationSource.EMERGENCY)
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{emergency.operation_id}"
    assert Operation.objects.get(pk=older.pk).state == OperationState.COMPLETED


def test_n_waits_for_a_pending_n_plus_one_and_is_applied_when_n_plus_one_is_cancelled() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=0)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=0)
    bios_upgrade(hosts[1:], "2.16.0")
    pool_tick(pool_id=pool.pk)  # hosts[1] out: the planned buffer is full
    older = bios_upgrade(hosts[:1], "2.16.0")
    newer = bios_upgrade(hosts[:1], "2.18.0")

    pool_tick(pool_id=pool.pk)

    # N+1 waits for room, and N waits for N+1: it takes N's place only once it is admitted.
    task = older.tasks.get()
    assert (task.state, task.waiting_code) == (TaskState.PENDING, WaitingCode.NEWER_PENDING)
    assert task.waiting_reason == (
        f"a newer version of its component (operation #{newer.pk}) is pending for the host and takes its place"
    )
    assert newer.tasks.get().waiting_code == WaitingCode.PLANNED_BUFFER

    operation_cancel(operation_id=newer.pk, reason="2.18.0 pulled by the vendor", actor="op")
    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"  # not left on 2.14.0, with neither version
    assert older.tasks.get().state == TaskState.DONE


def test_n_waiting_for_n_plus_one_is_superseded_once_n_plus_one_is_applied_in_its_drain() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=0)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=0)
    bios_upgrade(hosts[1:], "2.16.0")
    pool_tick(pool_id=pool.pk)
    older = bios_upgrade(hosts[:1], "2.16.0")
    newer = bios_upgrade(hosts[:1], "2.18.0")
    pool_tick(pool_id=pool.pk)
    assert older.tasks.get().state == TaskState.PENDING

    drive(pool, until=lambda: newer.tasks.get().state == TaskState.DRAINING)
    # Admitted, 2.18.0 holds the host; 2.16.0 waits for it, for as long as the host lacks 2.18.0.
    task = older.tasks.get()
    assert (task.state, task.waiting_code) == (TaskState.PENDING, WaitingCode.HOST_HELD)
    assert task.waiting_reason == f"host held by operation #{newer.pk}"
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 1
    task = older.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{newer.pk}"
    assert (task.waiting_code, task.waiting_reason) == ("", "")
    applied = WorkItem.objects.get(host=hosts[0], kind=WorkKind.EXECUTE).consumed_at
    assert task.finished_at == applied  # in the tick 2.18.0 is applied


def test_n_handed_over_after_a_reboot_when_the_pending_n_plus_one_was_cancelled_in_the_drain() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    first = operation_submit(
        kind="upgrade", scope=f"hosts: {hosts[0].hostname}", component="gpu-driver", version="560.35.03",
        reason="driver", actor="op",
    )  # fmt: skip
    pool_tick(pool_id=pool.pk)  # admitted: draining
    simulated_work_step()  # drained
    pool_tick(pool_id=pool.pk)  # running
    reboot = operation_submit(
        kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="reboot", actor="op", priority=300
    )
    older = bios_upgrade(hosts, "2.16.0")
    newer = bios_upgrade(hosts, "2.18.0")
    simulated_work_step()  # the first task's work applied
    pool_tick(pool_id=pool.pk)  # handed over to the reboot, first in line; 2.18.0 comes after it

    assert reboot.tasks.get().state == TaskState.RUNNING
    assert older.tasks.get().state == TaskState.PENDING  # superseded only once 2.18.0 takes the host
    operation_cancel(operation_id=newer.pk, reason="2.18.0 pulled by the vendor", actor="op")
    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"
    assert first.tasks.get().state == TaskState.HANDED_OVER
    assert older.tasks.get().state == TaskState.DONE
    assert drains(pool) == 1


def test_n_stays_due_when_a_repaired_host_returns_without_the_pending_n_plus_one() -> None:
    instant_simulator()
    # No planned buffer: nothing drains for planned work, so what waits for the host is only the repair.
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=0, failure_buffer_hosts=1)
    host_failure_report(host_id=hosts[0].pk, reason="ECC errors")
    older = bios_upgrade(hosts[:1], "2.16.0")
    newer = bios_upgrade(hosts[:1], "2.18.0")

    # The repair's drain catches up only a train's work: the ad-hoc 2.18.0 does not take the host.
    drive(pool, until=lambda: Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE)

    assert newer.tasks.get().state == TaskState.PENDING
    assert older.tasks.get().state == TaskState.PENDING
    operation_cancel(operation_id=newer.pk, reason="2.18.0 pulled by the vendor", actor="op")
    Pool.objects.filter(pk=pool.pk).update(planned_buffer_hosts=1)
    drive(pool)
    assert bios_on(hosts[0]) == "2.16.0"


def quiet_tick_queries(name: str, *, with_older: bool) -> int:
    """Queries of a tick that changes nothing, with 2.18.0 waiting for room (and 2.16.0 for it)."""
    pool, hosts = make_fleet(
        domains=1, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=0, pool_name=name
    )
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=0)
    bios_upgrade(hosts[1:], "2.16.0")
    pool_tick(pool_id=pool.pk)  # hosts[1] draining (no simulator step): the planned buffer is full
    if with_older:
        bios_upgrade(hosts[:1], "2.16.0")
    bios_upgrade(hosts[:1], "2.18.0")
    pool_tick(pool_id=pool.pk)
    with CaptureQueriesContext(connection) as queries:
        pool_tick(pool_id=pool.pk)
    return len(queries.captured_queries)


def test_a_task_waiting_for_a_newer_one_costs_a_quiet_tick_no_query() -> None:
    instant_simulator()
    assert quiet_tick_queries("with", with_older=True) == quiet_tick_queries("without", with_older=False)


def test_n_plus_one_arriving_while_n_runs_in_the_drain_is_still_applied_after_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    older = running_upgrade(pool, hosts, "2.16.0")
    assert older.tasks.get().state == TaskState.RUNNING
    newer = bios_upgrade(hosts, "2.18.0")

    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert older.tasks.get().state == TaskState.HANDED_OVER
    assert newer.tasks.get().state == TaskState.DONE
    assert (drains(pool), executions(hosts[0])) == (1, 2)


def test_n_pending_after_n_plus_one_went_into_the_drain_is_superseded_at_the_handover() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    newer = running_upgrade(pool, hosts, "2.18.0")
    older = bios_upgrade(hosts, "2.16.0", priority=500)

    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert (drains(pool), executions(hosts[0])) == (1, 1)
    task = older.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{newer.pk}"
    assert newer.tasks.get().state == TaskState.DONE


def test_n_pending_after_n_plus_one_and_a_reboot_in_the_drain_is_superseded_at_the_handover() -> None:
    # The stress test found it: 2.18.0, then a reboot, then 2.16.0 went in one drain; the host then
    # failed its pre-return gate (2.16.0 installed where the drain's target is 2.18.0), went to repair
    # for nothing, and after three repairs was escalated to a human.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    newer = running_upgrade(pool, hosts, "2.18.0")
    reboot = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="reboot", actor="op")
    simulated_work_step()  # 2.18.0 applied
    pool_tick(pool_id=pool.pk)  # handed over to the reboot, which runs
    assert reboot.tasks.get().state == TaskState.RUNNING
    older = bios_upgrade(hosts, "2.16.0")  # not pending at the first handover: only the reboot knows it

    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert reboot.tasks.get().state == TaskState.DONE
    task = older.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == f"superseded by bios 2.18.0 of operation #{newer.pk}"
    assert newer.tasks.get().state == TaskState.HANDED_OVER
    assert (drains(pool), executions(hosts[0])) == (1, 2)
    assert not Operation.objects.filter(kind="repair").exists()
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE


def test_the_operation_of_n_closes_when_its_tasks_are_superseded_or_done() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    older = bios_upgrade(hosts, "2.16.0")
    bios_upgrade(hosts[:1], "2.18.0", priority=200)

    drive(pool)

    states = dict(older.tasks.values_list("host_id", "state"))
    assert states == {hosts[0].pk: TaskState.CANCELLED, hosts[1].pk: TaskState.DONE}
    assert [bios_on(host) for host in hosts] == ["2.18.0", "2.16.0"]
    older.refresh_from_db()
    assert older.state == OperationState.COMPLETED


def test_an_emergency_n_is_not_held_back_by_routine_n_plus_one_both_go_in_one_drain() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    emergency = bios_upgrade(hosts, "2.16.0", priority=900, source=OperationSource.EMERGENCY)
    routine = bios_upgrade(hosts, "2.18.0", priority=100)

    drive(pool)

    assert emergency.tasks.get().state == TaskState.HANDED_OVER
    assert routine.tasks.get().state == TaskState.DONE
    assert bios_on(hosts[0]) == "2.18.0"
    assert drains(pool) == 1


def test_a_task_whose_target_the_host_already_runs_finishes_without_a_drain() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    installed_version_set(host=hosts[0], version=bios("2.16.0"))
    installed_version_set(host=hosts[1], version=bios("2.18.0"))
    ad_hoc = bios_upgrade([hosts[0]], "2.16.0")
    train = bios_upgrade([hosts[1]], "2.16.0", source=OperationSource.TRAIN, or_newer=True)

    drive(pool)

    for operation in (ad_hoc, train):
        assert set(operation.tasks.values_list("state", flat=True)) == {TaskState.DONE}
        assert not WorkItem.objects.filter(host_task__operation=operation).exists()
        assert not Lease.objects.filter(operation=operation).exists()
        assert Operation.objects.get(pk=operation.pk).state == OperationState.COMPLETED
    assert [bios_on(host) for host in hosts] == ["2.16.0", "2.18.0"]
    reasons = set(
        Event.objects.filter(
            kind="task.state_changed", data__operation__in=[ad_hoc.pk, train.pk], data__to=TaskState.DONE
        ).values_list("reason", flat=True)
    )
    # A train's upgrade means "this version or newer": a host already past it has nothing to do.
    assert reasons == {
        "nothing to do: the host already runs bios 2.16.0",
        "nothing to do: the host already runs bios 2.18.0",
    }


def test_work_queued_behind_a_task_with_nothing_to_do_is_admitted_in_the_same_tick() -> None:
    """The upgrade is judged first and claims its host; only then is it found to have nothing to do.
    The gang behind it is judged again at once (it waited a tick, saying it queued behind a finished
    operation, and the stress test's final drain once stopped there)."""
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4)
    installed_version_set(host=hosts[0], version=bios("2.16.0"))
    upgrade = bios_upgrade([hosts[0]], "2.16.0", priority=900)
    gang = operation_submit(
        kind="reboot", scope=f"hosts: {hosts[0].hostname}, {hosts[1].hostname}", reason="gang", actor="op", gang=True
    )

    counts = pool_tick(pool_id=pool.pk).counts

    assert upgrade.tasks.get().state == TaskState.DONE
    assert set(gang.tasks.values_list("state", "waiting_reason")) == {(TaskState.DRAINING, "")}
    assert counts.waiting == 0


def test_room_taken_by_a_task_with_nothing_to_do_goes_to_the_next_in_the_same_tick() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=1)
    installed_version_set(host=hosts[0], version=bios("2.16.0"))
    upgrade = bios_upgrade([hosts[0]], "2.16.0", priority=900)
    reboot = operation_submit(kind="reboot", scope=f"hosts: {hosts[1].hostname}", reason="next", actor="op")

    pool_tick(pool_id=pool.pk)

    assert upgrade.tasks.get().state == TaskState.DONE
    assert reboot.tasks.get().state == TaskState.DRAINING


def test_an_operators_ad_hoc_downgrade_still_takes_the_host_down_a_version() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    installed_version_set(host=hosts[0], version=bios("2.18.0"))
    downgrade = bios_upgrade(hosts, "2.16.0")

    drive(pool)

    assert downgrade.tasks.get().state == TaskState.DONE
    assert bios_on(hosts[0]) == "2.16.0"
    assert executions(hosts[0]) == 1


def test_a_rollback_from_the_repair_flow_still_takes_the_host_down_a_version() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    installed_version_set(host=hosts[0], version=bios("2.16.0"))
    rollback = bios_upgrade(hosts, "2.14.0", source=OperationSource.REPAIR, priority=900)

    drive(pool)

    assert rollback.tasks.get().state == TaskState.DONE
    assert bios_on(hosts[0]) == "2.14.0"
    assert executions(hosts[0]) == 1


def test_a_superseded_task_never_counts_against_a_trains_upgrade() -> None:
    assert FailureCode.SUPERSEDED in NOT_THE_UPGRADES_FAULT


def test_the_pre_return_gate_wants_the_newest_target_of_the_drain_not_the_one_applied_last() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=1)
    newer = bios_upgrade(hosts, "2.18.0").tasks.get()
    older = bios_upgrade(hosts, "2.16.0").tasks.get()
    # A drain as the old handover made it: 2.18.0 applied, then 2.16.0 over it, now verifying.
    HostTask.objects.filter(pk=newer.pk).update(state=TaskState.HANDED_OVER, drain_key=newer.pk)
    HostTask.objects.filter(pk=older.pk).update(state=TaskState.VERIFYING, drain_key=newer.pk)
    installed_version_set(host=hosts[0], version=bios("2.16.0"))

    refusals = pre_return_refusals(list(task_refs(HostTask.objects.filter(pk=older.pk)).values()))

    assert refusals == {older.pk: (FailureCode.NOT_RETURNABLE, ["version 2.16.0 installed where the target is 2.18.0"])}


def test_the_database_keeps_the_code_superseded_for_cancelled_tasks() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=1)
    task = bios_upgrade(hosts, "2.16.0").tasks.get()
    HostTask.objects.filter(pk=task.pk).update(state=TaskState.CANCELLED, failure_code=FailureCode.SUPERSEDED)
    for state in (TaskState.FAILED, TaskState.DONE):
        with pytest.raises(IntegrityError, match="host_task_failure_code_fits_state"), transaction.atomic():
            HostTask.objects.filter(pk=task.pk).update(state=state)


def test_an_emergency_trains_n_held_while_the_host_got_n_plus_one_does_not_take_it_back_down() -> None:
    from trains.services.tick import trains_tick
    from trains.services.trains import train_pause, train_resume

    instant_simulator()
    requester, approver = make_user(), make_user()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=0)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=0)
    train = emergency_train_request(pool=pool, component="bios", version="2.16.0", reason="CVE", actor=requester)
    approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
    approval_decide(approval_id=approval.pk, approve=True, reason="CVE confirmed", actor=approver)
    trains_tick()  # the visit starts: an emergency N task per host, pending
    train_pause(train_id=train.pk, reason="hold on", actor=approver)
    # Meanwhile an operator puts N+1 on host 0: drained, installed, returned.
    make_version(Component.objects.get(name="bios"), "2.18.0")
    operation_submit(
        kind="upgrade", scope=f"hosts: {hosts[0].hostname}", component="bios", version="2.18.0", reason="newer fix",
        actor="op",
    )  # fmt: skip
    drive(pool, until=lambda: bios_on(hosts[0]) == "2.18.0" and not busy_host(hosts[0]))
    train_resume(train_id=train.pk, reason="go on", actor=approver)

    drive_trains(pool, until=lambda: Train.objects.get(pk=train.pk).state == TrainState.FINISHED)
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"  # the train's "2.16.0 or newer" had nothing to do there
    task = HostTask.objects.get(host=hosts[0], operation__source=OperationSource.EMERGENCY)
    assert (task.state, task.drain_key) == (TaskState.DONE, None)


def busy_host(host: Host) -> bool:
    return HostTask.objects.filter(
        host=host, state__in=[TaskState.ADMITTED, TaskState.DRAINING, TaskState.RUNNING, TaskState.VERIFYING]
    ).exists()
