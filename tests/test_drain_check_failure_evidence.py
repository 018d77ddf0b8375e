"""A drain that applied two upgrades and then failed its checks proves neither: the host that failed
with both on it came back through repair, and the first upgrade's handed-over task counted that
return as its success (evidence for a canary to graduate on), while the failure was the last one's.
What the repair's catch-up applies after it, in the same drain, passed checks of its own."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState, Pool
from opsplanner.models import HostTask, OperationKind, OperationSource, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step, simulator_profile_instant
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import make_train, nic_firmware
from trains.models import Upgrade, UpgradePhase
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create, upgrade_phase_failures, upgrade_phase_successes

pytestmark = pytest.mark.django_db


def bios_then_driver_in_one_drain() -> tuple[Pool, Upgrade, Upgrade]:
    """One host; its train's visit gives it bios (first) then the driver (last) in one drain."""
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    train = make_train(pool)
    first = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios", priority=300)
    last = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver")
    train_tick(train_id=train.pk)
    return pool, first, last


def test_a_host_that_failed_its_checks_after_two_upgrades_is_no_success_of_the_first() -> None:
    pool, first, last = bios_then_driver_in_one_drain()
    simulator_profile_instant(verify_failure_rate=1.0)
    last_tasks = HostTask.objects.filter(operation__visit_link__upgrade=last)
    for _ in range(30):
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
        if last_tasks.filter(state=TaskState.FAILED).exists():
            break
    assert last_tasks.get().failure_code == FailureCode.CHECK_FAILED
    simulator_profile_instant()  # the repair's own checks pass

    drive_trains(pool, until=lambda: Host.objects.get().state == HostState.IN_SERVICE)

    first_task = HostTask.objects.get(operation__visit_link__upgrade=first)
    assert first_task.state == TaskState.HANDED_OVER
    assert first_task.drain_returned_at is None
    assert upgrade_phase_successes(first, 0) == 0
    assert upgrade_phase_failures(last, UpgradePhase.objects.get(upgrade=last, position=0)) == 1


def test_a_drain_that_passed_its_checks_proves_every_upgrade_it_applied() -> None:
    pool, first, last = bios_then_driver_in_one_drain()

    drive_trains(pool, until=lambda: HostTask.objects.filter(state=TaskState.DONE).exists())

    assert (upgrade_phase_successes(first, 0), upgrade_phase_successes(last, 0)) == (1, 1)


def test_the_catch_up_after_a_failed_check_proves_the_upgrades_it_applied() -> None:
    # The repaired host caught up on two train upgrades in the failed drain (its key): they passed
    # checks of their own, so the first, handed over to the second, is a success of its upgrade.
    instant_simulator(verify_failure_rate=1.0)
    nic_firmware()
    pool, (host,) = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1, failure_buffer_hosts=1)
    scope = f"hosts: {host.hostname}"
    operation_submit(kind=OperationKind.UPGRADE, scope=scope, component="bios", version="2.16.0", reason="now")
    offered: list[int] = []

    def offer_train_work_while_in_repair() -> None:
        repairing = HostTask.objects.filter(host=host, operation__kind=OperationKind.REPAIR, state=TaskState.RUNNING)
        if repairing.exists() and not offered:
            offered.append(repairing.get().pk)
            instant_simulator()  # the repair mends the host: the checks pass from now on
            for component, version, priority in (("gpu-driver", "560.35.03", 300), ("nic-firmware", "22.4", 200)):
                operation_submit(
                    kind=OperationKind.UPGRADE, scope=scope, component=component, version=version,
                    reason="a train's missed work", source=OperationSource.TRAIN, priority=priority,
                )  # fmt: skip

    drive(pool, each_round=offer_train_work_while_in_repair)

    failed = HostTask.objects.get(host=host, operation__source=OperationSource.AD_HOC)
    assert failed.failure_code == FailureCode.CHECK_FAILED
    driver, nic = HostTask.objects.filter(host=host, operation__source=OperationSource.TRAIN).order_by("-priority")
    assert (driver.state, driver.drain_key, nic.state) == (TaskState.HANDED_OVER, failed.drain_key, TaskState.DONE)
    assert driver.drain_returned_at is not None
