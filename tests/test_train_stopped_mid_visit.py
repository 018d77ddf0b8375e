"""A train stopped mid-visit keeps one drain per host per cycle. Its visit's later upgrades are held
while it is stopped, so a host out for the first one returns without them; they stayed pending in
the visit and, once the train resumed (an operator, or on its own after an autostop), drained the
same hosts a second time in the cycle. They are now left for the next cycle."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F

from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner.models import HostTask, OperationKind, OperationSource, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Train, TrainState, Upgrade, UpgradeState
from trains.services.tick import train_tick
from trains.services.trains import train_pause, train_resume
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def drains_per_host_and_cycle(pool: Pool) -> Counter[tuple[int, int]]:
    """Drains the train opened (a task whose drain key is its own id), per host and cycle."""
    return Counter(
        HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id"), operation__visit_link__isnull=False).values_list(
            "host_id", "operation__visit_link__visit__cycle__number"
        )
    )


def two_upgrades_running_the_first(*, failure_buffer_hosts: int = 2, **train: object) -> tuple[Pool, Train, list[Host]]:
    """Two racks of 2 hosts; the train's first visit gives its hosts bios then the driver in one
    drain; it returns once bios runs on both."""
    instant_simulator()
    pool, hosts = make_fleet(
        domains=2, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=failure_buffer_hosts
    )
    made = make_train(pool, **train)
    first = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios", priority=300)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver")
    train_tick(train_id=made.pk)
    tasks = HostTask.objects.filter(operation__visit_link__upgrade=first)
    for _ in range(30):
        if set(tasks.values_list("state", flat=True)) == {TaskState.RUNNING}:
            return pool, made, hosts
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    raise AssertionError("bios never ran")


def every_upgrade_done(pool: Pool) -> bool:
    return not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists()


def test_a_host_out_when_its_train_pauses_returns_without_the_held_upgrade_and_gets_it_next_cycle() -> None:
    pool, train, hosts = two_upgrades_running_the_first()
    train_pause(train_id=train.pk, reason="change freeze", actor=None)

    drive_trains(pool, until=lambda: set(Host.objects.values_list("state", flat=True)) == {HostState.IN_SERVICE})

    deferred = HostTask.objects.filter(operation__visit_link__upgrade__component_version__version="560.35.03")
    first_rack = {h.pk for h in hosts if h.domain.name == "rack-0001"}
    assert set(deferred.filter(failure_code=FailureCode.DEFERRED).values_list("host_id", flat=True)) == first_rack
    train_resume(train_id=train.pk, reason="freeze over", actor=None)
    drive_trains(pool, until=lambda: every_upgrade_done(pool))

    assert max(drains_per_host_and_cycle(pool).values()) == 1
    driver = set(InstalledVersion.objects.filter(version__version="560.35.03").values_list("host_id", flat=True))
    assert driver == {h.pk for h in hosts}


def test_an_autostop_mid_visit_leaves_the_held_upgrade_for_the_next_cycle_without_a_second_drain() -> None:
    pool, train, hosts = two_upgrades_running_the_first(failure_buffer_hosts=1, auto_resume_after_s=0)
    other = next(h for h in hosts if h.domain.name == "rack-0002")
    host_failure_report(host_id=other.pk, reason="PSU died")
    train_tick(train_id=train.pk)
    assert Train.objects.get(pk=train.pk).state == TrainState.AUTOSTOPPED

    drive_trains(pool, until=lambda: every_upgrade_done(pool))

    assert max(drains_per_host_and_cycle(pool).values()) == 1
    driver = set(InstalledVersion.objects.filter(version__version="560.35.03").values_list("host_id", flat=True))
    assert driver == {h.pk for h in hosts}


def test_held_work_is_deferred_when_an_ad_hoc_task_ends_the_train_drain() -> None:
    # The drain ended with a reboot an operator asked for, handed the host by the train's bios
    # task: the held driver stayed pending and drained the host again after the resume.
    instant_simulator()
    pool, (host,) = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    train = make_train(pool)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios", priority=300)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver")
    train_tick(train_id=train.pk)
    bios_tasks = HostTask.objects.filter(operation__visit_link__upgrade=bios)
    for _ in range(30):
        if bios_tasks.get().state == TaskState.RUNNING:
            break
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    train_pause(train_id=train.pk, reason="change freeze", actor=None)
    operation_submit(kind=OperationKind.REBOOT, scope=f"hosts: {host.hostname}", reason="kernel patch")
    reboot = HostTask.objects.filter(operation__source=OperationSource.AD_HOC)

    drive_trains(pool, until=lambda: reboot.get().state == TaskState.DONE)

    assert reboot.get().drain_key == bios_tasks.get().drain_key  # the reboot ran in the train's drain
    driver = HostTask.objects.get(operation__visit_link__upgrade__component_version__version="560.35.03")
    assert (driver.state, driver.failure_code) == (TaskState.CANCELLED, FailureCode.DEFERRED)
    train_resume(train_id=train.pk, reason="freeze over", actor=None)
    drive_trains(pool, until=lambda: every_upgrade_done(pool))
    assert max(drains_per_host_and_cycle(pool).values()) == 1
