"""A sliding visit releases hosts it planned maybe hours before: a host retired, moved to another pool
or broken since then is left for its next visit, and the visit goes on with the others."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState, Pool
from fleet.services.host_changes import host_retire, host_update
from opsplanner.models import Event, HostTask
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Pace, Train, Visit, VisitState
from trains.services.tick import TrainTickReport, trains_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def a_sliding_visit_with_hosts_to_come() -> tuple[Pool, Train, Visit, list[int]]:
    """Two domains of four hosts, a planned buffer of two: the first visit releases two hosts and keeps two."""
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    instant_simulator()
    trains_tick()
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    to_come = sorted(h for entry in visit.plan["unreleased"] for h in entry["hosts"])
    assert len(to_come) == 2
    return pool, train, visit, to_come


def run(*pools: Pool, ticks: int = 30) -> list[TrainTickReport]:
    reports = []
    for _ in range(ticks):
        reports.extend(trains_tick())  # each train isolated, as the beat runs them
        for pool in pools:
            pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    return reports


def train_tasks_of(host_id: int, train: Train) -> int:
    return HostTask.objects.filter(host_id=host_id, operation__visit_link__visit__train=train).count()


def test_a_host_retired_before_its_release_is_left_out_and_the_train_goes_on() -> None:
    pool, train, visit, (gone, kept) = a_sliding_visit_with_hosts_to_come()
    host_retire(hostname=Host.objects.get(pk=gone).hostname, reason="decommissioned", actor=None)

    reports = run(pool)

    assert not [r for r in reports if r.rolled_back]  # the core refused the retired host: every tick rolled back
    visit.refresh_from_db()
    assert visit.state == VisitState.DONE
    assert train_tasks_of(gone, train) == 0
    assert train_tasks_of(kept, train) == 1
    released = Event.objects.filter(kind="train.visit_released", subject_id=visit.pk, data__left_out=1).get()
    assert "1 no longer in service in the domain" in released.reason


def test_a_host_moved_to_another_pool_before_its_release_is_not_drained_by_the_old_pools_train() -> None:
    pool, train, _, (moved, kept) = a_sliding_visit_with_hosts_to_come()
    other, _ = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=1)
    host_update(host_id=moved, pool=other.name, domain="rack-0001", reason="rebalanced")

    run(pool, other)

    assert train_tasks_of(moved, train) == 0
    assert not HostTask.objects.filter(host_id=moved).exists()
    assert train_tasks_of(kept, train) == 1


def test_a_host_broken_before_its_release_does_not_hold_the_visit_open() -> None:
    pool, train, visit, (broken, kept) = a_sliding_visit_with_hosts_to_come()
    repair = host_failure_report(host_id=broken, reason="psu dead")
    operation_cancel(operation_id=repair.pk, reason="vendor RMA", actor=None)  # a human has it now
    assert Host.objects.get(pk=broken).state == HostState.ESCALATED

    run(pool)

    visit.refresh_from_db()
    assert visit.state == VisitState.DONE
    assert train_tasks_of(broken, train) == 0
    assert train_tasks_of(kept, train) == 1
