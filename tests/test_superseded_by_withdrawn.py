"""Nothing lost when the version that superseded another is withdrawn: a host that has not yet
received version N when N+1 arrives gets N+1 directly; when N+1 is withdrawn (its upgrade offboarded,
or withdrawn by hand) before the host has it, or after it was installed in a drain where N waits, the
host still gets N, the newest version wanted that is not withdrawn. A withdrawn version supersedes
nothing."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.db.models import F

from fleet.models import Component, ComponentVersion, Host, HostState, InstalledVersion
from fleet.services.catalogue import component_version_withdraw
from opsplanner.models import HostTask, Operation, OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet, make_version
from tests.driving import busy, drive, drive_trains, instant_simulator
from tests.trains_builders import drains_per_host, make_train
from trains.models import Cycle, Upgrade, UpgradeState
from trains.services.offboarding import upgrade_offboard
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def bios(version: str) -> ComponentVersion:
    component = Component.objects.get(name="bios")
    return ComponentVersion.objects.filter(component=component, version=version).first() or make_version(
        component, version
    )


def bios_on(host: Host) -> str:
    return InstalledVersion.objects.get(host=host, component__name="bios").version.version


def bios_upgrade(hosts: list[Host], version: str) -> Operation:
    bios(version)
    return operation_submit(
        kind="upgrade", scope="hosts: " + ", ".join(h.hostname for h in hosts), component="bios", version=version,
        reason=f"bios {version}", actor="op",
    )  # fmt: skip


def offboard(upgrade: Upgrade) -> None:
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs elsewhere")


def tasks_of(upgrade: Upgrade) -> list[HostTask]:
    return list(HostTask.objects.filter(operation__visit_link__upgrade=upgrade))


def never_completed_below_its_target(upgrade: Upgrade, hosts: list[Host]) -> None:
    """Checked every round: the upgrade is not completed while a host of its scope lacks its
    version (or a newer one not withdrawn)."""
    if Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED:
        assert {bios_on(host) for host in hosts} == {upgrade.component_version.version}


def test_an_ad_hoc_n_superseded_by_an_n_plus_one_withdrawn_while_it_drains_goes_in_the_same_drain() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    older = bios_upgrade(hosts, "2.16.0")
    newer = bios_upgrade(hosts, "2.18.0")
    pool_tick(pool_id=pool.pk)  # 2.18.0 admitted: the host drains for it
    assert newer.tasks.get().state == TaskState.DRAINING

    component_version_withdraw(version_id=bios("2.18.0").pk, reason="bricks NICs", actor="op")
    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"  # not left on 2.14.0 with neither version
    assert older.tasks.get().state == TaskState.DONE
    assert HostTask.objects.filter(host=hosts[0], drain_key=F("id")).count() == 1  # in the drain 2.18.0 began
    not_applied = newer.tasks.get()
    assert (not_applied.state, not_applied.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)


def test_a_train_host_drained_for_an_n_plus_one_offboarded_meanwhile_gets_n_at_the_next_cycle() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    train = make_train(pool)
    older = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="n")
    bios("2.18.0")
    newer = upgrade_create(pool=pool, component="bios", version="2.18.0", reason="n+1")
    train_tick(train_id=train.pk)
    pool_tick(pool_id=pool.pk, kick=False)
    assert {t.state for t in tasks_of(newer)} == {TaskState.DRAINING}
    assert tasks_of(older) == []  # the visit gave the hosts only n+1

    offboard(newer)
    drive_trains(
        pool,
        until=lambda: Upgrade.objects.get(pk=older.pk).state != UpgradeState.ACTIVE and not busy([pool]),
        each_round=lambda: never_completed_below_its_target(older, hosts),
    )

    assert Upgrade.objects.get(pk=older.pk).state == UpgradeState.COMPLETED
    assert {bios_on(host) for host in hosts} == {"2.16.0"}
    # The drain for nothing, then one drain in the next cycle: never two drains of a host in a cycle.
    assert drains_per_host(pool) == {host.pk: 2 for host in hosts}
    cycles = set(
        HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list(
            "operation__visit_link__visit__cycle__number", flat=True
        )
    )
    assert cycles == {1, 2}
    assert Cycle.objects.filter(train=train).count() >= 2


def test_an_ad_hoc_n_in_a_drain_where_n_plus_one_was_applied_then_withdrawn_is_applied_not_superseded() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    newer = bios_upgrade(hosts, "2.18.0")
    pool_tick(pool_id=pool.pk)  # admitted: draining
    simulated_work_step()  # drained
    pool_tick(pool_id=pool.pk)  # running
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="reboot", actor="op", priority=300)
    simulated_work_step()  # 2.18.0 applied
    pool_tick(pool_id=pool.pk)  # handed over to the reboot, in the same drain
    assert newer.tasks.get().state == TaskState.HANDED_OVER
    component_version_withdraw(version_id=bios("2.18.0").pk, reason="bricks NICs", actor="op")
    older = bios_upgrade(hosts, "2.16.0")  # what the host should run instead

    drive(pool)

    assert older.tasks.get().state == TaskState.DONE  # not superseded by the withdrawn 2.18.0
    assert bios_on(hosts[0]) == "2.16.0"
    # Back to service in the drain 2.18.0 opened: no refusal for the withdrawn version, no repair.
    assert HostTask.objects.filter(host=hosts[0], drain_key=F("id")).count() == 1
    assert not Operation.objects.filter(kind=OperationKind.REPAIR).exists()
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE


def test_a_reopened_upgrade_reinstalls_n_on_a_host_whose_drain_installed_the_withdrawn_n_plus_one() -> None:
    # 2.18.0 applied in the visit's drain, then offboarded: the gate refuses the host for running it
    # and its repair rolls it back. The gate then wanted the drain's newest target, the withdrawn
    # 2.18.0: every repair failed, and the host was escalated to a human after three.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    host = f"hosts: {hosts[0].hostname}"
    train = make_train(pool)
    bios("2.18.0")
    newer = upgrade_create(pool=pool, component="bios", version="2.18.0", reason="n+1", priority=300, scope=host)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver")
    train_tick(train_id=train.pk)
    for _ in range(20):  # 2.18.0 applied, the host handed over to the driver in the same drain
        if {t.state for t in tasks_of(newer)} == {TaskState.HANDED_OVER}:
            break
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    assert {t.state for t in tasks_of(newer)} == {TaskState.HANDED_OVER}
    # 2.16.0 arrives when the host runs 2.18.0: completed at once, reached only through 2.18.0.
    older = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="n", scope=host)
    train_tick(train_id=train.pk)
    assert Upgrade.objects.get(pk=older.pk).state == UpgradeState.COMPLETED

    offboard(newer)
    assert Upgrade.objects.get(pk=older.pk).state == UpgradeState.ACTIVE  # reopened
    drive_trains(
        pool,
        until=lambda: Upgrade.objects.get(pk=older.pk).state != UpgradeState.ACTIVE and not busy([pool]),
        each_round=lambda: never_completed_below_its_target(older, hosts[:1]),
    )

    assert bios_on(hosts[0]) == "2.16.0"
    assert Upgrade.objects.get(pk=older.pk).state == UpgradeState.COMPLETED
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
    repairs = HostTask.objects.filter(operation__kind=OperationKind.REPAIR)
    assert [(r.host_id, r.state) for r in repairs] == [(hosts[0].pk, TaskState.DONE)]  # once, not escalated
    for task in tasks_of(older):
        assert task.failure_code != FailureCode.SUPERSEDED, task.failure_reason
