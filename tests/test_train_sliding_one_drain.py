"""The sliding pace keeps the promises the domain pace keeps when a drain fails or another drain comes
first: never more than the visit's worth of hosts out, one drain per host per cycle."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import F

from fleet.models import PLANNED_OUT_STATES, Host, HostState
from opsplanner import clock
from opsplanner.adapters import Adapter
from opsplanner.models import HostTask, WorkKind
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Cycle, Pace, Visit, VisitState
from trains.services.pace import sliding_allowance, train_hosts_out
from trains.services.tick import train_tick, trains_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def test_a_host_whose_drain_failed_counts_against_the_sliding_allowance_until_it_is_back() -> None:
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, planned_buffer_hosts=10)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    assert sliding_allowance(train) == 2
    # The first drains are refused and their undrain takes ten minutes; later drains succeed.
    instant_simulator(refusing_host_fraction=1.0, undrain_seconds=600.0, execute_seconds=60.0)
    out, train_out = [], []
    moment = [clock.now()]
    with clock.use_clock(lambda: moment[0]):
        for tick in range(6):
            moment[0] += dt.timedelta(seconds=60)
            train_tick(train_id=train.pk)
            pool_tick(pool_id=pool.pk, kick=False)
            simulated_work_step()
            if tick == 1:
                instant_simulator(undrain_seconds=600.0, execute_seconds=60.0)
            out.append(Host.objects.filter(pool=pool, state__in=PLANNED_OUT_STATES).count())
            train_out.append(train_hosts_out(train))

    assert max(out) == 2, (out, train_out)  # checked at every tick
    assert train_out[1:3] == [2, 2]  # the two returning hosts, their tasks failed, still the train's


def _sliding_visit_with_an_unreleased_host() -> tuple[int, Visit]:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    instant_simulator()
    trains_tick()
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    target = max(h.pk for h in hosts if h.domain_id == visit.domain_id)
    assert target in {h for entry in visit.plan["unreleased"] for h in entry["hosts"]}
    return target, visit


def _run_until_the_first_cycle_ends(visit: Visit) -> Cycle:
    first = Cycle.objects.get(pk=visit.cycle_id)
    for _ in range(40):
        trains_tick()
        pool_tick(pool_id=visit.train.pool_id, kick=False)
        simulated_work_step()
        first.refresh_from_db()
        if first.ended_at:
            return first
    raise AssertionError("the first cycle did not end")


def _drains_of(host_id: int, cycle: Cycle) -> int:
    return HostTask.objects.filter(host_id=host_id, drain_key=F("id"), created_at__lte=cycle.ended_at).count()


def test_a_host_repaired_before_its_sliding_release_is_not_drained_again_in_the_cycle() -> None:
    target, visit = _sliding_visit_with_an_unreleased_host()
    host_failure_report(host_id=target, reason="ecc errors")
    for _ in range(6):  # the repair drains the host, fixes it and returns it
        pool_tick(pool_id=visit.train.pool_id, kick=False)
        simulated_work_step()
    assert Host.objects.get(pk=target).state == HostState.IN_SERVICE

    first = _run_until_the_first_cycle_ends(visit)

    assert _drains_of(target, first) == 1  # the repair's; the release left it for its next visit


def test_a_host_whose_other_drain_failed_before_its_sliding_release_is_not_drained_again_in_the_cycle() -> None:
    target, visit = _sliding_visit_with_an_unreleased_host()
    pool_id = visit.train.pool_id
    # An urgent reboot takes the host first; the (external) drainer refuses its drain.
    operation_submit(
        kind="reboot", scope="x", host_ids=[target], reason="kernel", priority=1000, drainer=Adapter.EXTERNAL
    )
    for kind, outcome in ((WorkKind.DRAIN, "failed"), (WorkKind.UNDRAIN, "done")):
        pool_tick(pool_id=pool_id, kick=False)
        [item] = work_items_claim(worker="ext", adapter=Adapter.EXTERNAL, kinds=[kind], host_id=target, limit=1)
        work_item_report(item_id=item.pk, worker="ext", key=f"{item.pk}-{kind}", outcome=outcome, reason="refused")
    pool_tick(pool_id=pool_id, kick=False)
    assert Host.objects.get(pk=target).state == HostState.IN_SERVICE

    first = _run_until_the_first_cycle_ends(visit)

    assert _drains_of(target, first) == 1  # the reboot's failed drain
    assert not HostTask.objects.filter(host_id=target, operation__visit_link__visit=visit).exists()
