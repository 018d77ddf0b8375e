"""A host repaired during its visit catches up in the same drain (trains/services/catch_up.py and
opsplanner/services/tick/repair.py): the train re-submits the visit's upgrades it missed, and the
repair hands the host over to them instead of returning it, once, when the planned buffer has room."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner.models import HostTask, OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import busy, drive_trains, instant_simulator
from tests.trains_builders import FAILING_DRIVER, cycle_ended, drains_per_host, make_train
from trains.models import Pace, Upgrade, UpgradeState, Visit, VisitOperation
from trains.services import catch_up
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create, upgrade_phase_failures

pytestmark = pytest.mark.django_db


def mend_once_a_repair_started() -> None:
    """The fault is gone once the first host is in repair: the repair mended it."""
    if HostTask.objects.filter(operation__kind=OperationKind.REPAIR).exists():
        instant_simulator()


def installed(host: Host) -> set[tuple[str, str]]:
    return set(InstalledVersion.objects.filter(host=host).values_list("component__name", "version__version"))


def catch_up_tasks(host: Host) -> list[HostTask]:
    return list(HostTask.objects.filter(host=host, operation__visit_link__catch_up=True).order_by("id"))


def rollouts(pool: Pool) -> tuple[Upgrade, Upgrade]:
    from trains.services.upgrades import upgrade_create

    # Created first, so each drain applies it first: the first host fails on it.
    driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    return driver, bios


@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_a_host_repaired_during_its_visit_catches_up_in_the_same_drain(pace: str) -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=3)
    train = make_train(pool, pace=pace)
    driver, bios = rollouts(pool)

    drive_trains(pool, until=lambda: cycle_ended(train, 1), each_round=mend_once_a_repair_started)

    failed = list(HostTask.objects.filter(state=TaskState.FAILED))  # the first hosts drained, before the mend
    assert failed
    for task in failed:
        assert task.operation.visit_link.catch_up is False
        # Its repair handed it over to the work it missed, in the same drain.
        repair = HostTask.objects.get(host_id=task.host_id, operation__kind=OperationKind.REPAIR)
        assert (repair.state, repair.drain_key) == (TaskState.HANDED_OVER, task.drain_key)
        caught = catch_up_tasks(task.host)
        assert {str(t.operation.component_version) for t in caught} == {"gpu-driver 560.35.03", "bios 2.16.0"}
        assert {t.state for t in caught} <= {TaskState.DONE, TaskState.HANDED_OVER}
        assert {t.drain_key for t in caught} == {task.drain_key}
    assert drains_per_host(pool) == {h.pk: 1 for h in hosts}
    for h in hosts:
        assert {("gpu-driver", "560.35.03"), ("bios", "2.16.0")} <= installed(h)
    # The catch-up counts for the upgrades' phases: both rollouts finish in the first cycle.
    drive_trains(pool, until=lambda: not Upgrade.objects.filter(state=UpgradeState.ACTIVE).exists())
    assert set(Upgrade.objects.filter(pk__in=[driver.pk, bios.pk]).values_list("state", flat=True)) == {
        UpgradeState.COMPLETED
    }
    assert drains_per_host(pool) == {h.pk: 1 for h in hosts}


def test_a_repaired_host_returns_when_the_planned_buffer_has_no_room() -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    # One host out for planned work at a time: when the first host fails, the second takes its place.
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=2)
    train = make_train(pool)
    rollouts(pool)

    drive_trains(pool, until=lambda: cycle_ended(train, 1), each_round=mend_once_a_repair_started)

    failed = HostTask.objects.get(state=TaskState.FAILED)
    repair = HostTask.objects.get(operation__kind=OperationKind.REPAIR)
    assert repair.state == TaskState.DONE  # verified and returned, not handed over
    caught = catch_up_tasks(failed.host)
    assert caught, "the train offered the repaired host its missed work"
    for task in caught:
        assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.DEFERRED)
        assert f"planned buffer of pool {pool.name} is full" in task.failure_reason
    assert drains_per_host(pool) == {h.pk: 1 for h in hosts}
    assert Host.objects.get(pk=failed.host_id).state == HostState.IN_SERVICE


def test_a_catch_up_that_fails_gets_no_second_one() -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=2)
    host = hosts[0]
    train = make_train(pool)
    rollouts(pool)

    def host_back() -> bool:
        return len(catch_up_tasks(host)) > 0 and Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE

    drive_trains(pool, until=host_back)

    # The driver failed in the drain and again in the catch-up; the second repair returned the host.
    driver = HostTask.objects.filter(host=host, operation__component_version__version="560.35.03").order_by("id")
    assert [(t.state, t.operation.visit_link.catch_up) for t in driver] == [
        (TaskState.FAILED, False),
        (TaskState.FAILED, True),
    ]
    repairs = HostTask.objects.filter(host=host, operation__kind=OperationKind.REPAIR).order_by("id")
    assert [r.state for r in repairs] == [TaskState.HANDED_OVER, TaskState.DONE]
    assert len({t.drain_key for t in [*driver, *repairs]}) == 1
    assert not HostTask.objects.filter(host=host, state=TaskState.PENDING).exists()
    assert VisitOperation.objects.filter(catch_up=True, operation__tasks__host=host).count() == 2  # offered once
    assert drains_per_host(pool)[host.pk] == 1
    assert train.visits.get().plan["caught_up"] == sorted(h.pk for h in hosts)


def test_an_escalated_host_is_left_no_pending_catch_up() -> None:
    instant_simulator(execute_by_kind={**FAILING_DRIVER, "repair": {"failure_rate": 1.0}})
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1, failure_buffer_hosts=1)
    host = hosts[0]
    make_train(pool)
    rollouts(pool)

    drive_trains(pool, until=lambda: Host.objects.get(pk=host.pk).state == HostState.ESCALATED)

    caught = catch_up_tasks(host)
    assert caught, "the train offered the host its missed work while the first repair ran"
    assert {(t.state, t.failure_code) for t in caught} == {(TaskState.CANCELLED, FailureCode.DEFERRED)}
    assert not HostTask.objects.filter(host=host, state__in=[TaskState.PENDING, TaskState.RUNNING]).exists()


def test_the_core_hands_a_repaired_host_over_to_train_work_once_per_drain() -> None:
    """Whoever re-submits the work, a drain catches up once: a second repair in it returns the host
    and leaves the train's work to its next cycle."""
    from opsplanner.models import OperationSource
    from opsplanner.services.operations import operation_submit
    from tests.driving import drive

    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1, failure_buffer_hosts=1)
    host = hosts[0]
    scope = f"hosts: {host.hostname}"
    operation_submit(kind=OperationKind.UPGRADE, scope=scope, component="gpu-driver", version="560.35.03", reason="now")
    offered: list[int] = []

    def offer_train_work_while_in_repair() -> None:
        repairing = HostTask.objects.filter(host=host, operation__kind=OperationKind.REPAIR, state=TaskState.RUNNING)
        if repairing.exists() and repairing.get().pk not in offered:
            offered.append(repairing.get().pk)
            version = "560.35.03" if len(offered) == 1 else "2.16.0"
            component = "gpu-driver" if len(offered) == 1 else "bios"
            operation_submit(
                kind=OperationKind.UPGRADE, scope=scope, component=component, version=version,
                reason="a train's missed work", source=OperationSource.TRAIN,
            )  # fmt: skip

    drive(pool, each_round=offer_train_work_while_in_repair)

    repairs = HostTask.objects.filter(host=host, operation__kind=OperationKind.REPAIR).order_by("id")
    assert [r.state for r in repairs] == [TaskState.HANDED_OVER, TaskState.DONE]
    caught, refused = HostTask.objects.filter(host=host, operation__source=OperationSource.TRAIN).order_by("id")
    assert (caught.state, caught.drain_key) == (TaskState.FAILED, repairs[0].drain_key)  # the fault is still there
    assert (refused.state, refused.failure_code) == (TaskState.CANCELLED, FailureCode.DEFERRED)
    assert "its drain caught up once already" in refused.failure_reason
    assert drains_per_host(pool) == {host.pk: 1}
    assert Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE


def test_a_catch_up_the_core_refuses_leaves_the_host_to_return_and_says_why() -> None:
    from fleet.models import Component, ComponentVersion
    from fleet.services.inventory import compatibility_rule_create
    from opsplanner.models import Event

    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1, failure_buffer_hosts=1)
    host = hosts[0]
    train = make_train(pool)
    rollouts(pool)

    forbidden: list[bool] = []

    def forbid_the_bios_once_a_repair_started() -> None:
        """While the host is repaired, bios 2.16.0 becomes incompatible with what it runs."""
        if HostTask.objects.filter(operation__kind=OperationKind.REPAIR).exists() and not forbidden:
            forbidden.append(True)
            compatibility_rule_create(
                job_facing_version=ComponentVersion.objects.get(component__name="cuda-runtime", version="12.4.1"),
                lower_component=Component.objects.get(name="bios"),
                max_version="2.14.0",
            )

    def host_back() -> bool:
        return HostTask.objects.filter(operation__kind=OperationKind.REPAIR, state=TaskState.DONE).exists()

    drive_trains(pool, until=host_back, each_round=forbid_the_bios_once_a_repair_started)

    refused = Event.objects.get(kind="train.visit_catch_up_refused")
    assert "return without their missed work" in refused.reason
    assert "would break a compatibility rule" in refused.reason
    assert refused.data["hosts"] == [host.pk]
    assert catch_up_tasks(host) == []
    assert train.visits.get().plan["caught_up"] == [host.pk]  # asked once, not at every tick
    assert HostTask.objects.get(operation__kind=OperationKind.REPAIR).state == TaskState.DONE
    assert Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE


def test_a_train_tick_while_its_visit_runs_reads_the_visits_once_and_nothing_for_catch_ups_without_repairs(
    django_assert_num_queries,
) -> None:
    from trains.services.tick import train_tick

    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=3)
    train = make_train(pool)
    rollouts(pool)
    assert train_tick(train_id=train.pk).events  # the first visit starts; its hosts wait for the pool tick

    # Nine: the upgrades with their phases and current failures in one, the forecast without the
    # domains' last visits; and the tick's savepoint in the test's transaction.
    with django_assert_num_queries(9 + 2) as captured:
        report = train_tick(train_id=train.pk)

    assert report.events == []
    visit_reads = [q["sql"] for q in captured.captured_queries if q["sql"].startswith('SELECT "trains_visit"."id"')]
    assert len(visit_reads) == 2, "the running visits, and the open cycle's for the forecast"
    assert not [q for q in captured.captured_queries if '"operation"."kind" = ' in q["sql"] and "repair" in q["sql"]]


def test_a_catch_up_held_by_a_pause_is_left_to_the_next_cycle_when_its_host_returns() -> None:
    from trains.services.tick import trains_tick
    from trains.services.trains import train_pause, train_resume

    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, _hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=2)
    train = make_train(pool)
    rollouts(pool)

    def catching_up_in_repair() -> HostTask | None:
        return HostTask.objects.filter(
            operation__visit_link__catch_up=True, state=TaskState.PENDING, host__state=HostState.REPAIR
        ).first()

    for _ in range(100):  # the rounds of drive_trains, paused as soon as the train offers a catch-up
        trains_tick()
        if (catching := catching_up_in_repair()) is not None:
            break
        pool_tick(pool_id=pool.pk)
        simulated_work_step()
    assert catching is not None
    host = catching.host
    train_pause(train_id=train.pk, reason="a suspicious rollout", actor=None)
    instant_simulator()  # the fault is mended: the repair succeeds
    for _ in range(10):  # the paused train is not ticked: only the core and the hardware move
        pool_tick(pool_id=pool.pk)
        simulated_work_step()

    assert Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE
    caught = catch_up_tasks(host)
    assert caught
    for task in caught:
        assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.DEFERRED)
        assert "held or refused" in task.failure_reason
    train_resume(train_id=train.pk, reason="looked fine", actor=None)
    drive_trains(pool, until=lambda: cycle_ended(train, 1))
    assert drains_per_host(pool)[host.pk] == 1  # not drained again in the cycle it was paused in


def test_a_host_that_fails_an_upgrade_again_in_its_catch_up_counts_once_against_it() -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=2)
    make_train(pool)
    # Two hosts may fail (the default policy); each fails twice: in its drain, then in its catch-up.
    driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=2)
    failed = HostTask.objects.filter(operation__visit_link__upgrade=driver, state=TaskState.FAILED)

    drive_trains(pool, until=lambda: failed.count() == 4 and not busy([pool]))

    assert set(failed.values_list("host_id", flat=True)) == {h.pk for h in hosts}
    assert upgrade_phase_failures(driver, driver.phases.get()) == 2
    driver.refresh_from_db()
    assert driver.state == UpgradeState.ACTIVE, driver.state_reason  # "4 hosts failed" of a 2-host pool, before


def test_a_repair_applied_between_the_catch_ups_first_read_and_its_lock_gets_no_second_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Read committed: a pool tick commits between the train's read of the hosts in repair and its
    # lock of the pool, applying a repair and sending the host to its checks.
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2, failure_buffer_hosts=3)
    train = make_train(pool)
    rollouts(pool)
    first_read, raced = catch_up._repaired_now, []

    def a_pool_tick_commits_after(running: list[Visit]) -> dict[int, set[int]]:
        found = first_read(running)
        if found and not raced:
            simulated_work_step()
            pool_tick(pool_id=pool.pk, kick=False)
            hosts = {h for hs in found.values() for h in hs}
            repairs = HostTask.objects.filter(host_id__in=hosts, operation__kind=OperationKind.REPAIR)
            raced.append(set(repairs.values_list("state", flat=True)))
        return found

    monkeypatch.setattr(catch_up, "_repaired_now", a_pool_tick_commits_after)
    drive_trains(pool, until=lambda: cycle_ended(train, 1), each_round=mend_once_a_repair_started)

    assert raced == [{TaskState.VERIFYING}]  # the race happened: the repair is applied, its checks run
    assert set(drains_per_host(pool).values()) == {1}


def test_a_host_escalated_while_its_train_task_waits_leaves_the_work_to_the_next_cycle_and_the_visit_ends() -> None:
    # Two hosts at a time in a domain of four: two tasks wait for room. A waiting host breaks, and its
    # repair is cancelled: a human has it now, for as long as it takes.
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)
    pool_tick(pool_id=pool.pk, kick=False)
    waiting = sorted(HostTask.objects.filter(state=TaskState.PENDING).values_list("host_id", flat=True))
    assert len(waiting) == 2
    repair = host_failure_report(host_id=waiting[0], reason="psu dead")
    operation_cancel(operation_id=repair.pk, reason="vendor RMA", actor=None)
    assert Host.objects.get(pk=waiting[0]).state == HostState.ESCALATED

    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    deferred = HostTask.objects.get(host_id=waiting[0], operation__visit_link__visit__train=train)
    assert (deferred.state, deferred.failure_code) == (TaskState.CANCELLED, FailureCode.DEFERRED)
    assert "escalated to a human" in deferred.failure_reason
    assert HostTask.objects.get(host_id=waiting[1], operation__visit_link__visit__train=train).state == TaskState.DONE
