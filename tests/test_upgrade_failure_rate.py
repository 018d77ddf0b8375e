"""The failure-rate policy: an upgrade is offboarded when more than its share of a phase's finished
hosts failed, once enough hosts finished. The train tick counts a phase's successes only as far as
the decision needs: past the successes that keep the failures within the rate, no count changes it."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

import pytest
from django.apps import apps as django_apps

from fleet.models import Host, HostState, Pool
from opsplanner import clock
from opsplanner.models import HostTask, OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.failures import host_failure_report
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import FAILING_DRIVER, make_train
from trains.models import Train, Upgrade, UpgradePhase, UpgradeState, Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrade_policy import successes_within_rate
from trains.services.upgrades import upgrade_create, upgrade_phase_successes, upgrades_rate_successes
from trains.services.visits import Step, UpgradePlan, visit_steps_submit

pytestmark = pytest.mark.django_db


@dataclass
class FinishedVisit:
    train_id: int
    upgrade: Upgrade
    phase: UpgradePhase
    tasks: list[HostTask]

    def fail(self, count: int) -> None:
        """The first `count` hosts' upgrades failed (as an executor that reported a failure would
        leave them); the others succeeded."""
        ids = [task.pk for task in self.tasks[:count]]
        HostTask.objects.filter(pk__in=ids).update(
            state=TaskState.FAILED, failure_code=FailureCode.EXECUTE_FAILED, failure_reason="the installer exited 1"
        )

    def fail_then_catch_up(self, count: int) -> None:
        """The first `count` hosts' upgrades failed, then each host caught up in the visit's drain
        (catch_up.py: an operation of the same phase) and succeeded."""
        self.fail(count)
        visit = self.tasks[0].operation.visit_link.visit
        plan = UpgradePlan(upgrade=self.upgrade, phase=self.phase, allowed=set())
        hosts = {task.host_id for task in self.tasks[:count]}
        visit_steps_submit(visit.train, visit, [Step(plan=plan, hosts=hosts, work_s=60)], joined=False, catch_up=True)
        HostTask.objects.filter(operation__visit_link__catch_up=True).update(
            state=TaskState.DONE, finished_at=clock.now()
        )

    def train_decides(self) -> Upgrade:
        train_tick(train_id=self.train_id)
        self.upgrade.refresh_from_db()
        return self.upgrade


def first_visit_finished(*, max_failure_rate: float, failure_rate_min_hosts: int) -> FinishedVisit:
    """A bios upgrade in one phase whose first visit (a domain of 6 hosts) finished well, before the
    train looked at the outcome."""
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=6)
    train = make_train(pool)
    upgrade = upgrade_create(
        pool=pool,
        component="bios",
        version="2.16.0",
        reason="rollout",
        max_failures=100,
        max_failure_rate=max_failure_rate,
        failure_rate_min_hosts=failure_rate_min_hosts,
    )
    train_tick(train_id=train.pk)
    tasks = HostTask.objects.filter(operation__visit_link__upgrade=upgrade).order_by("id")
    assert tasks.count() == 6
    drive(pool, until=lambda: not tasks.exclude(state__in=[TaskState.DONE, TaskState.HANDED_OVER]).exists())
    return FinishedVisit(train.pk, upgrade, upgrade.phases.get(position=0), list(tasks))


def test_it_offboards_with_the_whole_count_in_its_reason_when_the_failures_exceed_the_rate() -> None:
    visit = first_visit_finished(max_failure_rate=0.25, failure_rate_min_hosts=4)
    visit.fail(2)  # 2 of 6 is 33%

    upgrade = visit.train_decides()

    assert upgrade.state == UpgradeState.OFFBOARDED
    assert upgrade.state_reason.startswith("2 of 6 hosts failed in phase all (33%), above the 25% its policy allows")


def test_it_keeps_the_upgrade_when_the_successes_keep_the_failures_within_the_rate() -> None:
    visit = first_visit_finished(max_failure_rate=0.25, failure_rate_min_hosts=4)
    visit.fail(1)  # 1 of 6 is 17%

    assert visit.train_decides().state == UpgradeState.ACTIVE


def test_it_waits_for_the_minimum_of_finished_hosts_before_the_rate_counts() -> None:
    visit = first_visit_finished(max_failure_rate=0.25, failure_rate_min_hosts=7)
    visit.fail(3)  # half failed, but only 6 hosts finished

    assert visit.train_decides().state == UpgradeState.ACTIVE


def test_a_rate_that_counts_from_zero_hosts_does_not_stop_the_train_before_any_host_finished() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="rollout", max_failure_rate=0.5, failure_rate_min_hosts=0
    )

    train_tick(train_id=train.pk)  # nothing finished: no rate to divide (it raised ZeroDivisionError)

    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.ACTIVE
    assert HostTask.objects.filter(operation__visit_link__upgrade=upgrade).count() == 2


def test_a_count_up_to_a_cap_is_exact_below_it_and_the_cap_at_or_above_it() -> None:
    visit = first_visit_finished(max_failure_rate=0.25, failure_rate_min_hosts=4)
    visit.fail(2)
    visit.fail_then_catch_up(1)
    assert upgrade_phase_successes(visit.upgrade, 0) == 5
    whole = upgrades_rate_successes([visit.phase], up_to=None)[visit.upgrade.pk]
    assert whole == 4  # the host that caught up is a failure for the rate, not also a success

    counted = {cap: upgrades_rate_successes([visit.phase], up_to=cap)[visit.upgrade.pk] for cap in range(7)}

    assert counted == {cap: min(cap, whole) for cap in range(7)}


def test_hosts_that_failed_then_caught_up_count_once_as_failures_and_do_not_dilute_the_rate() -> None:
    visit = first_visit_finished(max_failure_rate=0.25, failure_rate_min_hosts=4)
    visit.fail_then_catch_up(2)  # 2 of 6 hosts is 33%; as 2 of 8 "finished" it was 25%, within the policy

    upgrade = visit.train_decides()

    assert upgrade.state == UpgradeState.OFFBOARDED
    assert upgrade.state_reason.startswith("2 of 6 hosts failed in phase all (33%), above the 25% its policy allows")


def test_a_host_that_failed_then_caught_up_is_one_finished_host_below_the_minimum_the_rate_counts_from() -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, _ = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2, failure_buffer_hosts=2)
    train = make_train(pool)
    upgrade = upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", multi_cycle=True,
        hosts_per_visit=1, max_failures=100, max_failure_rate=0.4, failure_rate_min_hosts=2,
    )  # fmt: skip
    tasks = HostTask.objects.filter(operation__visit_link__upgrade=upgrade)

    def mend_once_a_repair_started() -> None:  # the repair mends the host, and its catch-up installs
        if HostTask.objects.filter(operation__kind=OperationKind.REPAIR).exists():
            instant_simulator()

    drive_trains(
        pool,
        each_round=mend_once_a_repair_started,
        until=lambda: tasks.filter(operation__visit_link__catch_up=True, state=TaskState.DONE).exists(),
    )
    finished = tasks.filter(state__in=[TaskState.FAILED, TaskState.DONE])
    assert len(set(finished.values_list("host_id", flat=True))) == 1
    assert set(finished.values_list("state", flat=True)) == {TaskState.FAILED, TaskState.DONE}

    train_tick(train_id=train.pk)  # it looks at the outcome: one host finished (it failed), one short of the 2

    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.ACTIVE, upgrade.state_reason


@pytest.mark.parametrize("rate", ["0.0001", "0.05", "0.1", "0.25", "0.3333", "0.5", "0.9", "1"])
@pytest.mark.parametrize("failures", [1, 2, 6, 7, 49, 50, 333])
def test_the_successes_counted_for_the_rate_are_the_fewest_that_keep_the_failures_within_it(
    rate: str, failures: int
) -> None:
    upgrade = Upgrade(max_failure_rate=rate, failure_rate_min_hosts=5)
    share = float(rate)

    enough = successes_within_rate(upgrade, failures)

    assert enough is not None
    assert failures / (failures + enough) <= share
    assert enough == 0 or failures / (failures + enough - 1) > share


def test_a_rate_of_zero_has_no_count_of_successes_that_keeps_failures_within_it() -> None:
    assert successes_within_rate(Upgrade(max_failure_rate="0", failure_rate_min_hosts=5), 1) is None


def test_a_host_that_broke_after_it_succeeded_still_counts_as_a_success_of_the_phase() -> None:
    visit = first_visit_finished(max_failure_rate=0.25, failure_rate_min_hosts=3)
    visit.fail(1)  # 1 of 6 is 17%
    for task in visit.tasks[1:4]:  # then three of the hosts that succeeded broke: their disks, not the upgrade
        host_failure_report(host_id=task.host_id, reason="a disk died", actor="test")

    upgrade = visit.train_decides()

    assert upgrade.state == UpgradeState.ACTIVE, upgrade.state_reason  # 1 of 3 in service would be 33%
    assert upgrade_phase_successes(visit.upgrade, 0) == 5


def two_upgrades_in_one_drain() -> tuple[Pool, Train, Upgrade, Upgrade]:
    """A train and two upgrades on a pool of two domains of three hosts: its visits take both in one
    drain per host, the first handed over to the second."""
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=3)
    train = make_train(pool)
    first, second = (
        upgrade_create(pool=pool, component=component, version=version, reason="rollout")
        for component, version in [("bios", "2.16.0"), ("gpu-driver", "560.35.03")]
    )
    return pool, train, first, second


def test_a_handed_over_host_counts_once_its_drain_returned_it_and_still_counts_when_it_is_out_again() -> None:
    pool, train, first, second = two_upgrades_in_one_drain()
    handed_over = HostTask.objects.filter(operation__visit_link__upgrade=first, state=TaskState.HANDED_OVER)
    seen_mid_drain: list[int] = []

    def nothing_counts_before_a_host_is_back() -> None:
        if handed_over.exists() and not HostTask.objects.filter(state=TaskState.DONE).exists():
            seen_mid_drain.append(upgrade_phase_successes(first, 0))

    visit = Visit.objects.filter(train=train).order_by("id")
    drive_trains(
        pool,
        each_round=nothing_counts_before_a_host_is_back,
        until=lambda: visit.filter(state=VisitState.DONE).exists(),
    )

    assert seen_mid_drain, "no round had the first upgrade handed over with its hosts still out"
    assert set(seen_mid_drain) == {0}  # handed over, the hosts still out in that drain
    assert handed_over.count() == 3  # one drain per host: the first upgrade handed its hosts to the second
    assert (upgrade_phase_successes(first, 0), upgrade_phase_successes(second, 0)) == (3, 3)
    broken = [task.host_id for task in handed_over[:2]]
    for host_id in broken:  # out again, for something else
        host_failure_report(host_id=host_id, reason="a fan failed", actor="test")
    pool_tick(pool_id=pool.pk)
    assert not Host.objects.filter(pk__in=broken, state=HostState.IN_SERVICE).exists()
    assert (upgrade_phase_successes(first, 0), upgrade_phase_successes(second, 0)) == (3, 3)


def test_the_migration_marks_the_handed_over_tasks_whose_drain_already_returned_its_host() -> None:
    pool, train, *_ = two_upgrades_in_one_drain()
    handed_over = HostTask.objects.filter(state=TaskState.HANDED_OVER)
    drive_trains(pool, until=lambda: Visit.objects.filter(train=train, state=VisitState.DONE).exists())
    drive_trains(pool, until=lambda: handed_over.filter(drain_returned_at__isnull=True).exists())  # mid-drain
    marked = dict(handed_over.values_list("id", "drain_returned_at"))
    assert None in marked.values()  # a drain under way
    assert set(marked.values()) - {None}  # and drains that returned their hosts
    handed_over.update(drain_returned_at=None)  # rows from before the column

    import_module("opsplanner.migrations.0018_host_task_drain_returned_at").drains_that_returned(django_apps, None)

    assert dict(handed_over.values_list("id", "drain_returned_at")) == marked
