"""Superseded versions skipped, for an operation on hold (waiting for an approval, say): an ad-hoc
upgrade to N held while its host gets N+1 from other work (a train, another operation, in a drain
or in place, or the host's own report) ends superseded once the hold lifts; it never takes the host
back down to N. An operation to N created after the host runs N+1 is a deliberate downgrade: it
still runs once its hold lifts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fleet.models import Host
from fleet.services import installed_version_set
from fleet.services.catalogue import component_version_withdraw
from fleet.services.host_versions import host_versions_report
from opsplanner.models import HostTask, Operation, OperationSource, OperationState, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.test_superseded_versions import bios, bios_on, bios_upgrade, executions
from tests.trains_builders import make_train
from trains.models import Upgrade, UpgradeState
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

HOLD = "waiting for approval #7"


def held_upgrade(hosts: list[Host], version: str, **fields: object) -> Operation:
    return bios_upgrade(hosts, version, hold_reason=HOLD, **fields)


def lift_hold(operation: Operation) -> None:
    """The approval granted: the operation is no longer held."""
    Operation.objects.filter(pk=operation.pk).update(hold_reason="")


def done(operation: Operation) -> Callable[[], bool]:
    return lambda: not operation.tasks.exclude(state__in=[TaskState.DONE, TaskState.CANCELLED]).exists()


def assert_superseded_by_what_the_host_runs(task: HostTask) -> None:
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)
    assert task.failure_reason == "superseded by bios 2.18.0, which the host got after this task was created"
    assert task.drain_key is None


def assert_completed(operation: Operation) -> None:
    assert Operation.objects.get(pk=operation.pk).state == OperationState.COMPLETED


def test_a_held_n_whose_host_got_n_plus_one_in_a_drain_meanwhile_is_superseded_when_the_hold_lifts() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0")
    newer = bios_upgrade(hosts, "2.18.0")
    drive(pool, until=done(newer))
    assert bios_on(hosts[0]) == "2.18.0"
    assert held.tasks.get().state == TaskState.PENDING  # held: nothing decided while the hold lasts

    lift_hold(held)
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 1
    assert_superseded_by_what_the_host_runs(held.tasks.get())
    assert_completed(held)


def test_a_held_n_whose_host_got_n_plus_one_in_place_meanwhile_is_superseded_when_the_hold_lifts() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0", needs_drain=False)
    newer = bios_upgrade(hosts, "2.18.0", needs_drain=False)
    drive(pool, until=done(newer))

    lift_hold(held)
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 1
    assert_superseded_by_what_the_host_runs(held.tasks.get())


def test_a_held_n_whose_host_got_n_plus_one_from_a_train_meanwhile_is_superseded_when_the_hold_lifts() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0")
    make_train(pool)
    bios("2.18.0")
    upgrade_create(pool=pool, component="bios", version="2.18.0", reason="fixed release")
    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists())
    assert bios_on(hosts[0]) == "2.18.0"

    lift_hold(held)
    drive(pool, until=done(held))

    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 1
    assert_superseded_by_what_the_host_runs(held.tasks.get())


def test_a_held_gangs_n_is_superseded_where_its_host_got_n_plus_one_and_its_other_host_gets_n() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2, failure_buffer_hosts=0)
    gang = held_upgrade(hosts[:2], "2.16.0", gang=True)
    newer = bios_upgrade(hosts[:1], "2.18.0")
    drive(pool, until=done(newer))

    lift_hold(gang)
    drive(pool)

    assert [bios_on(host) for host in hosts[:2]] == ["2.18.0", "2.16.0"]
    assert executions(hosts[0]) == 1
    assert_superseded_by_what_the_host_runs(gang.tasks.get(host=hosts[0]))
    assert gang.tasks.get(host=hosts[1]).state == TaskState.DONE
    assert_completed(gang)


def test_a_held_n_is_superseded_where_the_host_reports_n_plus_one_installed_outside_opsplanner() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0")
    bios("2.18.0")
    host_versions_report(host=hosts[0], versions={"bios": "2.18.0"}, reason="flashed by hand")

    lift_hold(held)
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 0
    assert_superseded_by_what_the_host_runs(held.tasks.get())


def test_a_held_n_lifted_while_its_host_is_drained_for_other_work_is_not_handed_the_host() -> None:
    # N+1 applied in one drain; the hold lifts; a reboot drains the host again: at the reboot's
    # handover N is superseded, not handed the drained host.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0")
    newer = bios_upgrade(hosts, "2.18.0")
    drive(pool, until=done(newer))
    reboot = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="kernel", actor="op")
    drive(pool, until=lambda: reboot.tasks.get().state == TaskState.RUNNING)

    lift_hold(held)
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert executions(hosts[0]) == 2  # 2.18.0 and the reboot
    assert_superseded_by_what_the_host_runs(held.tasks.get())


def test_an_operators_n_created_after_the_host_runs_n_plus_one_is_a_deliberate_downgrade_and_runs() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    newer = bios_upgrade(hosts, "2.18.0")
    drive(pool, until=done(newer))
    downgrade = held_upgrade(hosts, "2.16.0")

    lift_hold(downgrade)
    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"
    assert downgrade.tasks.get().state == TaskState.DONE


def test_a_held_n_whose_host_got_n_plus_one_since_withdrawn_runs_when_the_hold_lifts() -> None:
    # A withdrawn version supersedes nothing: it is to be rolled back, and N is what the host wants.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0")
    newer = bios_upgrade(hosts, "2.18.0")
    drive(pool, until=done(newer))
    component_version_withdraw(version_id=bios("2.18.0").pk, reason="bricks GPUs", actor="op")

    lift_hold(held)
    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"
    assert held.tasks.get().state == TaskState.DONE


def test_a_held_n_whose_host_moved_up_twice_meanwhile_is_superseded_when_the_hold_lifts() -> None:
    # 2.14.0 → 2.18.0 → 2.20.0 while N (2.16.0) waited: the version the host ran before what it runs
    # (2.18.0) is above N, and reading it as "came down" took the host back down (helper-54).
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    held = held_upgrade(hosts, "2.16.0")
    drive(pool, until=done(bios_upgrade(hosts, "2.18.0")))
    drive(pool, until=done(bios_upgrade(hosts, "2.20.0")))

    lift_hold(held)
    drive(pool)

    assert bios_on(hosts[0]) == "2.20.0"
    task = held.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)


def test_a_downgrade_asked_from_above_whose_host_came_down_part_way_meanwhile_still_runs() -> None:
    # Asked for 2.14.0 while the host ran 2.20.0; it came down to 2.18.0 by hand while the request was
    # held. 2.18.0 is newer than what was asked but not than what the host ran then: the request
    # stands. It ended superseded (the request lost) when what the host ran was not kept.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    drive(pool, until=done(bios_upgrade(hosts, "2.20.0")))
    downgrade = held_upgrade(hosts, "2.14.0")
    bios("2.18.0")
    host_versions_report(host=hosts[0], versions={"bios": "2.18.0"}, reason="rolled back by hand")

    lift_hold(downgrade)
    drive(pool)

    assert bios_on(hosts[0]) == "2.14.0"
    assert downgrade.tasks.get().state == TaskState.DONE
    assert_completed(downgrade)


def test_a_downgrade_asked_from_above_whose_host_went_above_what_it_ran_meanwhile_is_superseded() -> None:
    # Asked for 2.14.0 while the host ran 2.16.0; it got 2.18.0 since: that is newer than both.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    drive(pool, until=done(bios_upgrade(hosts, "2.16.0")))
    downgrade = held_upgrade(hosts, "2.14.0")
    bios("2.18.0")
    host_versions_report(host=hosts[0], versions={"bios": "2.18.0"}, reason="flashed by hand")

    lift_hold(downgrade)
    drive(pool)

    assert bios_on(hosts[0]) == "2.18.0"
    assert_superseded_by_what_the_host_runs(downgrade.tasks.get())


def test_a_rollback_asked_from_a_withdrawn_version_is_superseded_by_a_newer_one_the_host_got_since() -> None:
    # The rollback of the withdrawn 2.18.0 is asked from above (created before the version is marked
    # withdrawn, in the same transaction), but a withdrawn version is no version to keep: the host
    # left it for 2.16.0, newer than the rollback's 2.14.0, and stays there.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    drive(pool, until=done(bios_upgrade(hosts, "2.18.0")))
    component_version_withdraw(version_id=bios("2.18.0").pk, reason="bricks GPUs", actor="op")
    rollback = Operation.objects.get(source=OperationSource.REPAIR, component_version=bios("2.14.0"))
    host_versions_report(host=hosts[0], versions={"bios": "2.16.0"}, reason="flashed by hand")

    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"
    task = rollback.tasks.get()
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)


def test_a_deliberate_downgrade_waiting_behind_an_overtaken_n_still_runs() -> None:
    # N (2.16.0) asked before the host got 2.18.0 is overtaken; 2.14.0, asked after, is a downgrade
    # on purpose. Admission judged 2.14.0 in N's place and ended it superseded by N, never applied.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    n = held_upgrade(hosts, "2.16.0")
    bios("2.18.0")
    host_versions_report(host=hosts[0], versions={"bios": "2.18.0"}, reason="flashed by hand")
    downgrade = held_upgrade(hosts, "2.14.0")

    lift_hold(downgrade)
    lift_hold(n)
    pool_tick(pool_id=pool.pk, kick=False)
    assert downgrade.tasks.get().state != TaskState.PENDING  # judged again in the same tick
    drive(pool)

    assert_superseded_by_what_the_host_runs(n.tasks.get())
    assert downgrade.tasks.get().state == TaskState.DONE
    assert bios_on(hosts[0]) == "2.14.0"


def test_a_downgrade_asked_after_the_host_runs_n_plus_one_runs_though_n_plus_one_is_recorded_again() -> None:
    # Recording the version the host runs again kept no date of its own: it moved installed_at, and
    # the downgrade asked before that looked overtaken by it.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    drive(pool, until=done(bios_upgrade(hosts, "2.18.0")))
    downgrade = held_upgrade(hosts, "2.16.0")
    installed_version_set(host=hosts[0], version=bios("2.18.0"), reason="inventory refreshed")

    lift_hold(downgrade)
    drive(pool)

    assert bios_on(hosts[0]) == "2.16.0"
    assert downgrade.tasks.get().state == TaskState.DONE


def test_a_downgrade_asked_from_above_runs_when_a_withdrawal_rolls_its_host_back_part_way() -> None:
    # What the host ran when asked (2.18.0) is withdrawn since: still what the operator asked from.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    drive(pool, until=done(bios_upgrade(hosts, "2.16.0")))
    drive(pool, until=done(bios_upgrade(hosts, "2.18.0")))
    downgrade = held_upgrade(hosts, "2.14.0")
    component_version_withdraw(version_id=bios("2.18.0").pk, reason="bricks GPUs", actor="op")
    rollback = Operation.objects.get(source=OperationSource.REPAIR, component_version=bios("2.16.0"))
    assert rollback.tasks.get().downgrade_from_id is None  # asked from the version being withdrawn
    drive(pool, until=done(rollback))
    assert bios_on(hosts[0]) == "2.16.0"

    lift_hold(downgrade)
    drive(pool)

    assert downgrade.tasks.get().state == TaskState.DONE
    assert bios_on(hosts[0]) == "2.14.0"
