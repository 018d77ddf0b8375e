"""A version withdrawn while an install of it waits, ready, for an executor: the install is stopped
and never runs; the task ends not applied, as when the host's drain ends after the withdrawal
(tests/test_offboarded_while_draining.py), and the host goes on to its next task or back to
service. Before, an executor claimed it later: the host installed the withdrawn version, failed the
pre-return gate, went through the failure buffer to repair and was rolled back. An install an
executor claimed first runs, and is handled as before. A failed install of a version not withdrawn
still sends its host to repair (tests/test_failure_codes.py,
test_a_failed_execution_fails_the_task_with_the_code_execute_failed)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connection, transaction

from fleet.models import ComponentVersion, Host, HostState, InstalledVersion, Pool, WithdrawnBy
from fleet.services.catalogue import component_version_release, component_version_withdraw
from opsplanner import clock
from opsplanner.models import (
    Event,
    HostTask,
    Operation,
    OperationKind,
    OperationSource,
    TaskState,
    WorkItem,
    WorkKind,
    WorkState,
)
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Upgrade
from trains.services.offboarding import upgrade_offboard
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def installs_ready_for(*upgrades: dict[str, object], hosts: int = 2) -> tuple[Pool, list[Upgrade]]:
    """A rack whose train started a visit with these upgrades, stepped until the hosts are drained
    and the installs of the last upgrade wait, ready, for an executor (the ones before applied and
    the hosts handed over to it)."""
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    train = make_train(pool)
    created = [upgrade_create(pool=pool, reason="release", **fields) for fields in upgrades]  # type: ignore[arg-type]
    train_tick(train_id=train.pk)
    for _ in range(20):
        pool_tick(pool_id=pool.pk, kick=False)
        if ready_installs(tasks_of(created[-1])) == hosts:
            return pool, created
        simulated_work_step()
    raise AssertionError("the installs never became ready")


def tasks_of(upgrade: Upgrade) -> list[HostTask]:
    return list(HostTask.objects.filter(operation__visit_link__upgrade=upgrade))


def ready_installs(tasks: list[HostTask]) -> int:
    return WorkItem.objects.filter(host_task__in=tasks, kind=WorkKind.EXECUTE, state=WorkState.READY).count()


def hosts_running(version: str) -> set[int]:
    return set(InstalledVersion.objects.filter(version__version=version).values_list("host_id", flat=True))


def all_in_service(pool: Pool) -> bool:
    return set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}


def assert_not_applied(tasks: list[HostTask], version: str) -> None:
    for task in tasks:
        task.refresh_from_db()
        assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
        assert task.failure_reason.startswith(f"not applied: {version} is withdrawn: ")
    installs = WorkItem.objects.filter(host_task__in=tasks, kind=WorkKind.EXECUTE)
    assert set(installs.values_list("state", "attempts")) == {(WorkState.FAILED, 0)}  # never claimed


def assert_never_broken() -> None:
    assert not Event.objects.filter(kind="host.state_changed", data__to=HostState.FAILED).exists()
    assert not Operation.objects.filter(kind=OperationKind.REPAIR).exists()


def test_an_upgrade_offboarded_while_its_installs_wait_for_an_executor_installs_nothing() -> None:
    pool, (bios,) = installs_ready_for({"component": "bios", "version": "2.16.0"})

    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=bios.pk), reason="bricks NICs elsewhere")
    drive_trains(pool, until=lambda: all_in_service(pool))

    assert hosts_running("2.16.0") == set()
    assert_not_applied(tasks_of(bios), "bios 2.16.0")
    assert_never_broken()
    # Nothing was done on the hosts: back without the checks.
    assert not WorkItem.objects.filter(host_task__in=tasks_of(bios), kind=WorkKind.VERIFY).exists()
    offboarded = Event.objects.get(kind="upgrade.offboarded", subject_id=bios.pk)
    assert offboarded.data["installs_stopped"] == 2


def test_a_host_handed_over_keeps_the_first_upgrade_when_the_seconds_version_is_withdrawn() -> None:
    pool, (bios, driver) = installs_ready_for(
        {"component": "bios", "version": "2.16.0", "priority": 300},
        {"component": "gpu-driver", "version": "560.35.03"},
    )
    assert {t.state for t in tasks_of(bios)} == {TaskState.HANDED_OVER}

    version = ComponentVersion.objects.get(component__name="gpu-driver", version="560.35.03")
    component_version_withdraw(version_id=version.pk, reason="hangs under load")
    drive_trains(pool, until=lambda: all_in_service(pool))

    hosts = set(Host.objects.filter(pool=pool).values_list("id", flat=True))
    assert hosts_running("2.16.0") == hosts
    assert hosts_running("560.35.03") == set()
    assert_not_applied(tasks_of(driver), "gpu-driver 560.35.03")
    assert_never_broken()
    # The bios was applied in the drain: the hosts were verified before they returned, and it counts.
    assert WorkItem.objects.filter(host_task__in=tasks_of(driver), kind=WorkKind.VERIFY).count() == 3 * len(hosts)
    assert all(task.drain_returned_at is not None for task in tasks_of(bios))
    withdrawn = Event.objects.get(kind="component_version.withdrawn", subject_id=version.pk)
    assert withdrawn.data["installs_stopped"] == 2


def adhoc_installs_ready(
    executor: str = "simulated", *, size: int = 2, component: str = "bios", version: str = "2.16.0"
) -> tuple[Pool, Operation]:
    """An ad-hoc upgrade of a rack of `size` hosts, drained, its installs ready for `executor`."""
    pool, operation = adhoc_drained(executor, size=size, component=component, version=version)
    pool_tick(pool_id=pool.pk, kick=False)
    assert ready_installs(list(operation.tasks.all())) == size
    return pool, operation


def adhoc_drained(
    executor: str = "simulated", *, size: int = 2, component: str = "bios", version: str = "2.16.0"
) -> tuple[Pool, Operation]:
    """An ad-hoc upgrade of a rack of `size` hosts whose drains are done, before the tick that makes
    their installs ready for `executor`."""
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=size, planned_buffer_hosts=size)
    operation = operation_submit(
        kind="upgrade",
        scope=f"pool {pool.name}",
        component=component,
        version=version,
        reason="r",
        executor=executor,
    )
    pool_tick(pool_id=pool.pk, kick=False)
    simulated_work_step()
    return pool, operation


def tick_beside_an_offboarding(pool_b: Pool, upgrade: Upgrade, *, after: threading.Event) -> list[Exception]:
    """Pool B's tick in one thread (named tick-b, for the patches that slow it) and, once `after` is
    set, the offboarding of `upgrade` in another; what either raised."""
    errors: list[Exception] = []

    def tick_b() -> None:
        try:
            pool_tick(pool_id=pool_b.pk, kick=False)
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    def offboard() -> None:
        try:
            assert after.wait(10)
            with transaction.atomic():
                upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=tick_b, name="tick-b"), threading.Thread(target=offboard)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


def test_an_ad_hoc_operations_install_waiting_for_an_executor_is_stopped_by_the_withdrawal() -> None:
    pool, operation = adhoc_installs_ready()

    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    component_version_withdraw(version_id=bios.pk, reason="bricks NICs")
    drive(pool, until=lambda: all_in_service(pool))

    assert hosts_running("2.16.0") == set()
    assert_not_applied(list(operation.tasks.all()), "bios 2.16.0")
    assert_never_broken()
    operation.refresh_from_db()
    assert operation.state != "open"


def test_an_install_ready_for_a_withdrawn_target_that_passes_its_deadline_installs_nothing() -> None:
    # Made ready by a tick that had not yet seen the withdrawal (an offboarding in another pool),
    # then no executor took it before its deadline: nothing ran on the host, nothing to repair.
    pool, operation = adhoc_installs_ready(executor="external")
    ComponentVersion.objects.filter(component__name="bios", version="2.16.0").update(
        withdrawn_at=clock.now(), withdrawn_reason="bricks NICs", withdrawn_by=WithdrawnBy.OPERATOR
    )

    later = clock.now() + dt.timedelta(days=1)
    with clock.use_clock(lambda: later):
        pool_tick(pool_id=pool.pk, kick=False)  # past the deadline: failed
        pool_tick(pool_id=pool.pk, kick=False)  # acted on

    assert_not_applied(list(operation.tasks.all()), "bios 2.16.0")
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.RETURNING}
    assert_never_broken()


@pytest.mark.django_db(transaction=True)
def test_an_install_claimed_while_its_version_is_withdrawn_runs_and_the_unclaimed_one_is_stopped() -> None:
    pool, operation = adhoc_installs_ready(executor="external")
    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    claimed, release = threading.Event(), threading.Event()
    taken: list[WorkItem] = []

    def claim_and_hold() -> None:
        try:
            with transaction.atomic():
                taken.extend(work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=1))
                claimed.set()
                release.wait(10)
        finally:
            connection.close()

    def withdraw() -> None:
        try:
            component_version_withdraw(version_id=bios.pk, reason="bricks NICs")
        finally:
            connection.close()

    claimer = threading.Thread(target=claim_and_hold)
    claimer.start()
    assert claimed.wait(10)
    withdrawer = threading.Thread(target=withdraw)
    withdrawer.start()
    withdrawer.join(10)
    assert not withdrawer.is_alive()  # it waits for the claim's row a moment, not for the executor
    release.set()
    claimer.join()

    (item,) = taken
    item.refresh_from_db()
    assert (item.state, item.claimed_by) == (WorkState.RUNNING, "agent")  # the claim won: it runs
    assert Event.objects.get(kind="component_version.withdrawn").data["installs_stopped"] == 1
    work_item_report(
        item_id=item.pk, worker="agent", key="k", outcome="done", attempt=1, result={"versions": {"bios": "2.16.0"}}
    )
    pool_tick(pool_id=pool.pk, kick=False)

    claimed_task = HostTask.objects.get(pk=item.host_task_id)
    assert claimed_task.state == TaskState.VERIFYING  # applied, as before: the gate judges its host
    assert_not_applied([t for t in operation.tasks.all() if t.pk != claimed_task.pk], "bios 2.16.0")


def test_an_install_stopped_by_a_withdrawal_undone_before_the_tick_sends_no_host_to_repair() -> None:
    # Withdrawn and released again within a tick: the installs were stopped and never ran, so the
    # hosts have nothing to repair (the tick used to read a failed install of a version not withdrawn).
    pool, operation = adhoc_installs_ready()
    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    component_version_withdraw(version_id=bios.pk, reason="bricks NICs")
    component_version_release(version_id=bios.pk, reason="a false alarm")
    drive(pool, until=lambda: all_in_service(pool))

    assert_never_broken()
    for task in operation.tasks.all():
        assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
        assert task.failure_reason.startswith("not applied: its install was stopped before any executor claimed it")


def test_an_ad_hoc_operation_whose_installs_a_withdrawal_stopped_closes_cancelled() -> None:
    pool, operation = adhoc_installs_ready()
    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    component_version_withdraw(version_id=bios.pk, reason="bricks NICs")
    drive(pool, until=lambda: all_in_service(pool))

    operation.refresh_from_db()
    assert operation.state == "cancelled"  # it installed nothing: not "completed"
    assert Event.objects.filter(kind="operation.cancelled", subject_id=operation.pk).exists()


def test_a_visit_whose_installs_an_offboarding_stopped_closes_cancelled() -> None:
    pool, (bios,) = installs_ready_for({"component": "bios", "version": "2.16.0"})
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=bios.pk), reason="bricks NICs elsewhere")
    drive_trains(pool, until=lambda: all_in_service(pool))

    operations = Operation.objects.filter(visit_link__upgrade=bios)
    assert set(operations.values_list("state", flat=True)) == {"cancelled"}  # it installed nothing


def test_an_ad_hoc_operation_whose_installs_an_offboarding_stopped_closes_cancelled() -> None:
    pool, operation = adhoc_installs_ready()
    make_train(pool)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="release")
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs elsewhere")
    drive(pool, until=lambda: all_in_service(pool))

    assert_not_applied(list(operation.tasks.all()), "bios 2.16.0")
    operation.refresh_from_db()
    assert operation.state == "cancelled"
    offboarded = Event.objects.get(kind="upgrade.offboarded", subject_id=upgrade.pk)
    assert offboarded.data["installs_stopped"] == 2


@pytest.mark.django_db(transaction=True)
def test_an_offboarding_does_not_deadlock_with_another_pools_tick_over_its_installs(monkeypatch) -> None:
    # Pool B's tick fails an install past its deadline (its row locked) and then records another
    # install's version, which needs a share lock on the version's row; an offboarding in pool A
    # holds that row and waited for pool B's install row: PostgreSQL found a deadlock.
    from opsplanner.services.tick import advance as advance_module

    pool_b, _ = adhoc_installs_ready(executor="external")
    pool_a, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    make_train(pool_a)
    upgrade = upgrade_create(pool=pool_a, component="bios", version="2.16.0", reason="release")
    (item,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=1)
    work_item_report(
        item_id=item.pk, worker="agent", key="k", outcome="done", attempt=1, result={"versions": {"bios": "2.16.0"}}
    )
    record_versions, in_tick = advance_module.record_versions, threading.Event()

    def slowly_recorded(ctx, versions):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "tick-b" and versions:
            in_tick.set()  # holding the row of the other install, just failed past its deadline
            time.sleep(1.5)
        return record_versions(ctx, versions)

    monkeypatch.setattr(advance_module, "record_versions", slowly_recorded)

    later = clock.now() + dt.timedelta(days=1)
    with clock.use_clock(lambda: later):
        errors = tick_beside_an_offboarding(pool_b, upgrade, after=in_tick)

    assert errors == []
    assert Upgrade.objects.get(pk=upgrade.pk).state == "offboarded"


@pytest.mark.django_db(transaction=True)
def test_a_refused_report_holding_a_ready_install_does_not_let_it_run_after_the_withdrawal(monkeypatch) -> None:
    # A late or misdirected report of a never-claimed install locks its row and is refused: the
    # withdrawal waits for it rather than skip the row, which an executor then claimed.
    from opsplanner.services import work_items as work_items_module
    from opsplanner.services.work_items import WorkItemConflict

    _, operation = adhoc_installs_ready(executor="external")
    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    target = WorkItem.objects.filter(host_task__operation=operation, kind=WorkKind.EXECUTE).order_by("id").first()
    assert target is not None
    check_report, locked, release, refused = work_items_module._check_report, threading.Event(), threading.Event(), []

    def slowly_checked(item, **kwargs):  # type: ignore[no-untyped-def]
        locked.set()
        release.wait(10)
        return check_report(item, **kwargs)

    monkeypatch.setattr(work_items_module, "_check_report", slowly_checked)

    def refused_report() -> None:
        try:
            with transaction.atomic():
                work_item_report(item_id=target.pk, worker="agent", key="k", outcome="done", result={})
        except WorkItemConflict as error:
            refused.append(error)
        finally:
            connection.close()

    reporter = threading.Thread(target=refused_report)
    reporter.start()
    assert locked.wait(10)
    withdrawer = threading.Thread(
        target=lambda: (component_version_withdraw(version_id=bios.pk, reason="bricks NICs"), connection.close())
    )
    withdrawer.start()
    time.sleep(0.05)  # a report refused at once, as they are: the withdrawal waits for its row
    release.set()
    reporter.join(10)
    withdrawer.join(10)

    assert refused
    assert Event.objects.get(kind="component_version.withdrawn").data["installs_stopped"] == 2
    assert work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=10) == []


def test_an_executors_failed_report_saying_not_run_still_sends_its_host_to_repair() -> None:
    # Only a withdrawal marks an install not run, and only one no executor claimed.
    pool, _ = adhoc_installs_ready(executor="external")
    (item,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=1)
    work_item_report(
        item_id=item.pk,
        worker="agent",
        key="k",
        outcome="failed",
        attempt=1,
        result={"not_run": "target_withdrawn"},
        reason="flash aborted half way",
    )
    pool_tick(pool_id=pool.pk, kick=False)

    task = HostTask.objects.get(pk=item.host_task_id)
    assert (task.state, task.failure_code) == (TaskState.FAILED, FailureCode.EXECUTE_FAILED)


@pytest.mark.django_db(transaction=True)
def test_a_host_another_pools_tick_records_on_the_version_during_its_offboarding_is_rolled_back(monkeypatch) -> None:
    # The offboarding's full lock on the version's row waits for the tick that recorded the host
    # running it (a key share) to commit, so its rollback sees the host; with a no-key lock it went
    # on, missed the uncommitted row, and the host served the withdrawn version (helper-43).
    from opsplanner.services.tick import advance as advance_module
    from tests.test_superseded_versions import bios_on, bios_upgrade

    instant_simulator()
    pool_b, hosts_b = make_fleet(domains=1, hosts_per_domain=1)
    operation = bios_upgrade(hosts_b, "2.16.0", needs_drain=False, executor="external")
    pool_tick(pool_id=pool_b.pk, kick=False)
    assert operation.tasks.get().state == TaskState.RUNNING
    (item,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=1)
    work_item_report(item_id=item.pk, worker="agent", key="k", outcome="done", result={"versions": {"bios": "2.16.0"}})
    pool_a, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    make_train(pool_a)
    upgrade = upgrade_create(pool=pool_a, component="bios", version="2.16.0", reason="release")

    record_versions, recorded, release, errors = (
        advance_module.record_versions,
        threading.Event(),
        threading.Event(),
        [],
    )

    def record_then_hold(ctx, versions):  # type: ignore[no-untyped-def]
        unknown = record_versions(ctx, versions)
        if threading.current_thread().name == "tick-b" and versions:
            recorded.set()  # V recorded (a key share on its row), not committed yet
            release.wait(10)
        return unknown

    monkeypatch.setattr(advance_module, "record_versions", record_then_hold)

    def tick_b() -> None:
        try:
            pool_tick(pool_id=pool_b.pk, kick=False)
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    def offboard() -> None:
        try:
            with transaction.atomic():
                upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    ticker = threading.Thread(target=tick_b, name="tick-b")
    ticker.start()
    assert recorded.wait(10)
    offboarder = threading.Thread(target=offboard)
    offboarder.start()
    offboarder.join(3)
    release.set()
    ticker.join(20)
    offboarder.join(20)

    assert errors == []
    host = Host.objects.get(pk=hosts_b[0].pk)
    assert ComponentVersion.objects.get(component__name="bios", version="2.16.0").withdrawn_at is not None
    assert (host.state, bios_on(host)) == (HostState.IN_SERVICE, "2.16.0")
    rollbacks = Operation.objects.filter(source=OperationSource.REPAIR, tasks__host=host)
    assert rollbacks.exists(), "no rollback for a host in service on the withdrawn version"


@pytest.mark.django_db(transaction=True)
def test_an_offboarding_does_not_deadlock_with_a_tick_failing_late_installs_out_of_id_order(monkeypatch) -> None:
    # The tick fails late installs in deadline order and holds the higher id; the stop locks in id
    # order: waiting without bound for the tick's row, the two waited for each other (helper-43).
    from opsplanner.services.tick import advance as advance_module

    pool_b, operation = adhoc_installs_ready(executor="external")
    x, y = WorkItem.objects.filter(host_task__operation=operation, kind=WorkKind.EXECUTE).order_by("id")
    now = clock.now()
    WorkItem.objects.filter(pk=x.pk).update(deadline_at=now + dt.timedelta(hours=2))
    WorkItem.objects.filter(pk=y.pk).update(deadline_at=now + dt.timedelta(hours=1))  # late first
    pool_a, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    make_train(pool_a)
    upgrade = upgrade_create(pool=pool_a, component="bios", version="2.16.0", reason="release")
    fail_item, first_failed = advance_module._fail_item, threading.Event()

    def fail_slowly(ctx, item_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        fail_item(ctx, item_id, *args, **kwargs)
        if threading.current_thread().name == "tick-b" and not first_failed.is_set():
            first_failed.set()  # holding Y
            time.sleep(1.5)

    monkeypatch.setattr(advance_module, "_fail_item", fail_slowly)

    later = now + dt.timedelta(days=1)
    with clock.use_clock(lambda: later):
        errors = tick_beside_an_offboarding(pool_b, upgrade, after=first_failed)

    assert errors == []


@pytest.mark.django_db(transaction=True)
def test_an_offboarding_waits_for_several_held_installs_less_than_a_deadlock_check(monkeypatch) -> None:
    # The tick holds three late installs and then waits for a fourth the offboarding took; the stop
    # waited 500 ms for each held row in turn, past PostgreSQL's 1 s deadlock check: the tick died.
    from opsplanner.services.tick import advance as advance_module

    pool_b, operation = adhoc_installs_ready(executor="external", size=4)
    first, *later = WorkItem.objects.filter(host_task__operation=operation, kind=WorkKind.EXECUTE).order_by("id")
    now = clock.now()
    WorkItem.objects.filter(pk=first.pk).update(deadline_at=now + dt.timedelta(hours=2))  # failed last
    WorkItem.objects.filter(pk__in=[item.pk for item in later]).update(deadline_at=now + dt.timedelta(hours=1))
    pool_a, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    make_train(pool_a)
    upgrade = upgrade_create(pool=pool_a, component="bios", version="2.16.0", reason="release")
    fail_item, held = advance_module._fail_item, threading.Event()

    def fail_then_pause(ctx, item_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "tick-b" and item_id == first.pk:
            held.set()  # the three later ones failed and held: let the offboarding take this one
            time.sleep(0.3)
        fail_item(ctx, item_id, *args, **kwargs)

    monkeypatch.setattr(advance_module, "_fail_item", fail_then_pause)

    with clock.use_clock(lambda: now + dt.timedelta(days=1)):
        errors = tick_beside_an_offboarding(pool_b, upgrade, after=held)

    assert errors == []
    assert Upgrade.objects.get(pk=upgrade.pk).state == "offboarded"
