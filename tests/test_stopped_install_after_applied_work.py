"""A drain that applied an upgrade and then had the next task's install stopped by a withdrawal
(tests/test_withdrawn_before_install.py): the stopped task carries the drain's checks, but installed
nothing, so the pre-return gate judges, and a failure blames, only what the drain applied. Before,
the gate wanted the stopped task's target too once the withdrawal was undone (the host went to
repair), and a failed check counted against the stopped task's upgrade."""

from __future__ import annotations

import pytest

from fleet.models import ComponentVersion, Host, HostState, Pool
from fleet.services.catalogue import component_version_release, component_version_withdraw
from opsplanner.models import HostTask, OperationKind, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.models.operations import FailureCode
from opsplanner.services.simulator import simulated_work_step, simulator_profile_instant
from opsplanner.services.tick import pool_tick
from opsplanner.services.tick.repair import _CAUGHT_UP_DRAINS
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.test_withdrawn_before_install import (
    all_in_service,
    assert_never_broken,
    hosts_running,
    installs_ready_for,
    tasks_of,
)
from tests.trains_builders import FAILING_DRIVER, make_train
from trains.models import Upgrade, UpgradePhase
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create, upgrade_phase_failures, upgrade_phase_successes

pytestmark = pytest.mark.django_db


def bios_applied_then_driver_stopped(*, released: bool = False) -> tuple[Pool, Upgrade, Upgrade]:
    """One host whose drain applied bios and handed it over to the driver, whose install, ready, a
    withdrawal of the driver's version stopped (and, `released`, undid at once)."""
    pool, (bios, driver) = installs_ready_for(
        {"component": "bios", "version": "2.16.0", "priority": 300},
        {"component": "gpu-driver", "version": "560.35.03"},
        hosts=1,
    )
    assert {t.state for t in tasks_of(bios)} == {TaskState.HANDED_OVER}
    version = ComponentVersion.objects.get(component__name="gpu-driver", version="560.35.03")
    component_version_withdraw(version_id=version.pk, reason="hangs under load")
    if released:
        component_version_release(version_id=version.pk, reason="a false alarm")
    return pool, bios, driver


def failures_of(upgrade: Upgrade) -> int:
    return upgrade_phase_failures(upgrade, UpgradePhase.objects.get(upgrade=upgrade, position=0))


def test_a_withdrawal_undone_at_once_returns_the_host_its_drain_upgraded_to_service() -> None:
    pool, bios, driver = bios_applied_then_driver_stopped(released=True)

    drive_trains(pool, until=lambda: all_in_service(pool))

    assert_never_broken()  # the gate no longer wants the driver its stopped install never put there
    assert hosts_running("2.16.0") == {Host.objects.get(pool=pool).pk}
    assert hosts_running("560.35.03") == set()
    (stopped,) = tasks_of(driver)
    assert (stopped.state, stopped.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
    assert stopped.failure_reason.startswith("not applied: its install was stopped before any executor claimed it")
    (applied,) = tasks_of(bios)
    assert applied.drain_returned_at is not None
    assert upgrade_phase_successes(bios, 0) == 1


def test_a_failed_check_after_a_stopped_install_counts_against_the_upgrade_the_drain_applied() -> None:
    pool, bios, driver = bios_applied_then_driver_stopped()
    simulator_profile_instant(verify_failure_rate=1.0)
    host = Host.objects.get(pool=pool)

    drive_trains(pool, until=lambda: Host.objects.get(pk=host.pk).state == HostState.REPAIR)

    (applied,) = tasks_of(bios)
    assert (applied.state, applied.failure_code) == (TaskState.FAILED, FailureCode.CHECK_FAILED)
    assert applied.failure_reason.startswith("verification failed: ")
    (stopped,) = tasks_of(driver)
    assert (stopped.state, stopped.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
    assert stopped.failure_reason.startswith("not applied: gpu-driver 560.35.03 is withdrawn: ")
    assert (failures_of(bios), failures_of(driver)) == (1, 0)
    assert applied.finished_at < stopped.finished_at  # its own end kept: its Gantt bar stops there

    simulator_profile_instant()  # the repair mends the host, which returns through it
    drive_trains(pool, until=lambda: all_in_service(pool))
    assert HostTask.objects.filter(host=host, state=TaskState.DONE, operation__kind="repair").exists()
    assert upgrade_phase_successes(bios, 0) == 0  # the failed check proved nothing of it


def test_a_failed_check_after_a_repairs_stopped_catch_up_is_not_the_repairs_failure() -> None:
    # Nothing but the repair applied in the drain: a failed repair would count towards escalation,
    # and hide from catch_up_repaired that its drain caught up once already.
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1, failure_buffer_hosts=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    host = hosts[0]
    catch_up = None
    for _ in range(60):
        train_tick(train_id=train.pk)
        pool_tick(pool_id=pool.pk, kick=False)
        ready = WorkItem.objects.filter(
            host_task__operation__visit_link__catch_up=True, kind=WorkKind.EXECUTE, state=WorkState.READY, attempts=0
        ).first()
        if ready is not None:
            catch_up = ready.host_task
            break
        simulated_work_step()
    assert catch_up is not None, "no catch-up install became ready"
    repair = HostTask.objects.get(host=host, operation__kind=OperationKind.REPAIR)
    assert repair.state == TaskState.HANDED_OVER
    assert repair.drain_key == catch_up.drain_key
    version = ComponentVersion.objects.get(component__name="gpu-driver", version="560.35.03")
    component_version_withdraw(version_id=version.pk, reason="hangs under load")
    instant_simulator(verify_failure_rate=1.0)  # the checks the stopped task carries fail
    for _ in range(20):
        train_tick(train_id=train.pk)
        pool_tick(pool_id=pool.pk, kick=False)
        if HostTask.objects.filter(host=host, operation__kind=OperationKind.REPAIR).count() > 1:
            break
        simulated_work_step()
    repair.refresh_from_db()
    catch_up.refresh_from_db()
    assert repair.state == TaskState.HANDED_OVER
    assert list(_CAUGHT_UP_DRAINS.rows(keys={repair.drain_key})) == [(repair.drain_key,)]
    assert (catch_up.state, catch_up.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
    assert Host.objects.get(pk=host.pk).state in (HostState.FAILED, HostState.REPAIR)
