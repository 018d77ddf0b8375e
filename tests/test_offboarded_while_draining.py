"""An upgrade offboarded while its hosts drain: its version is withdrawn, so the drain's end installs
nothing. Before, the execute step ran anyway: the host installed the withdrawn version, failed the
pre-return gate (`not_returnable`), went through the failure buffer to repair and was rolled back.
And a host the gate refuses only for a version withdrawn after its drain installed it fails as
`runs_withdrawn`, which no upgrade's failure policy counts."""

from __future__ import annotations

import pytest
from django.db import transaction

from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner.models import Event, HostTask, TaskState, WorkItem, WorkKind
from opsplanner.models.operations import FailureCode
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Train, Upgrade, UpgradePhase, UpgradeState
from trains.services.offboarding import upgrade_offboard
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create, upgrade_phase_failures

pytestmark = pytest.mark.django_db


def draining_for(*upgrades: dict[str, object], hosts: int = 2) -> tuple[Pool, Train, list[Upgrade]]:
    """A rack of `hosts` hosts whose train started a visit with these upgrades (the first, of the
    highest priority, drains the hosts) and a pool tick that left the hosts draining."""
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    train = make_train(pool)
    created = [upgrade_create(pool=pool, reason="release", **fields) for fields in upgrades]  # type: ignore[arg-type]
    train_tick(train_id=train.pk)
    pool_tick(pool_id=pool.pk, kick=False)
    first = HostTask.objects.filter(operation__visit_link__upgrade=created[0])
    assert set(first.values_list("state", flat=True)) == {TaskState.DRAINING}
    return pool, train, created


def offboard(upgrade: Upgrade) -> None:
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs elsewhere")


def tasks_of(upgrade: Upgrade) -> list[HostTask]:
    return list(HostTask.objects.filter(operation__visit_link__upgrade=upgrade))


def hosts_running(version: str) -> set[int]:
    return set(InstalledVersion.objects.filter(version__version=version).values_list("host_id", flat=True))


def test_a_host_draining_for_an_upgrade_offboarded_meanwhile_installs_nothing_and_returns() -> None:
    pool, _, (bios,) = draining_for({"component": "bios", "version": "2.16.0"})

    offboard(bios)
    drive_trains(pool, until=lambda: set(Host.objects.values_list("state", flat=True)) == {HostState.IN_SERVICE})

    assert not WorkItem.objects.filter(host_task__in=tasks_of(bios), kind=WorkKind.EXECUTE).exists()
    assert hosts_running("2.16.0") == set()
    for task in tasks_of(bios):
        assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
        assert task.failure_reason.startswith("not applied: bios 2.16.0 is withdrawn: upgrade #")
    # Never broken: the failure buffer and repair were not involved.
    assert not Event.objects.filter(kind="host.state_changed", data__to=HostState.FAILED).exists()


def test_its_host_passes_to_the_next_upgrade_of_the_visit_in_the_same_drain() -> None:
    pool, _, (bios, driver) = draining_for(
        {"component": "bios", "version": "2.16.0", "priority": 300},
        {"component": "gpu-driver", "version": "560.35.03"},
    )

    offboard(bios)
    drive_trains(pool, until=lambda: {t.state for t in tasks_of(driver)} == {TaskState.DONE})

    hosts = set(Host.objects.filter(pool=pool).values_list("id", flat=True))
    assert hosts_running("560.35.03") == hosts
    assert hosts_running("2.16.0") == set()
    drains = WorkItem.objects.filter(kind=WorkKind.DRAIN).values_list("host_id", flat=True)
    assert sorted(drains) == sorted(hosts)  # one drain each, for both upgrades
    for task in tasks_of(bios):
        assert task.state == TaskState.CANCELLED
        assert (
            "host handed over to task"
            in Event.objects.filter(kind="task.state_changed", subject_id=task.pk, data__to=TaskState.CANCELLED)
            .values_list("reason", flat=True)
            .get()
        )


def test_a_host_refused_for_a_version_offboarded_after_it_was_installed_is_no_failure_of_the_next_upgrade() -> None:
    # bios applied, the hosts handed over to the driver in the same drain, then bios offboarded: the
    # gate refused the hosts for running the withdrawn bios and failed the drain's last task, the
    # driver's, as not_returnable, a failure its policy counted: 3 of them offboarded a good driver.
    pool, train, (bios, driver) = draining_for(
        {"component": "bios", "version": "2.16.0", "priority": 300},
        {"component": "gpu-driver", "version": "560.35.03"},
        hosts=3,
    )
    for _ in range(20):
        if {t.state for t in tasks_of(bios)} == {TaskState.HANDED_OVER}:
            break
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    assert {t.state for t in tasks_of(bios)} == {TaskState.HANDED_OVER}

    offboard(bios)
    drive_trains(pool, until=lambda: {t.state for t in tasks_of(driver)} <= {TaskState.DONE, TaskState.FAILED})
    train_tick(train_id=train.pk)

    for task in tasks_of(driver):
        assert (task.state, task.failure_code) == (TaskState.FAILED, FailureCode.RUNS_WITHDRAWN)
        assert "runs withdrawn bios 2.16.0" in task.failure_reason
    driver.refresh_from_db()
    assert upgrade_phase_failures(driver, UpgradePhase.objects.get(upgrade=driver, position=0)) == 0
    assert driver.state == UpgradeState.COMPLETED  # its version is on every host; only bios is rolled back
