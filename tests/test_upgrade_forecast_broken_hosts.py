"""A host out broken (failed, or in repair) is not taken by a visit, which starts over the hosts of
its domain in service: it gets the train's work at its domain's first visit after its repair returns
it. The forecast plays it from the cycle after the first one it plays, whose visits start while it
may still be out, and agrees with what the train does (driven on a virtual clock,
tests/forecast_world.py)."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState
from opsplanner import clock
from opsplanner.services.failures import host_failure_report
from tests.builders import make_fleet
from tests.forecast_world import World, timed_simulator
from tests.trains_builders import make_train
from trains.models import Upgrade, Visit
from trains.selectors_forecast import ForecastCode, pool_backlogs, upgrades_forecasts
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

REPAIR_S = 3000  # within the repair's work deadline (3 x its estimate), longer than a visit


@pytest.mark.parametrize("rack", [1, 3], ids=["first-rack-visited", "last-rack-visited"])
def test_a_host_in_repair_is_forecast_for_the_cycle_the_train_reaches_it_in(rack: int) -> None:
    timed_simulator(repair={"seconds": REPAIR_S})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, _ = make_fleet(domains=3, hosts_per_domain=2, planned_buffer_hosts=2)
        train = make_train(pool, cycle_slo_s=3 * 3600, visit_overhead_s=600)
        broken = pool.hosts.filter(domain__position=rack).order_by("id").first()
        host_failure_report(host_id=broken.pk, reason="dead power supply")
        world.tick(pool, rounds=2)
        assert Host.objects.get(pk=broken.pk).state == HostState.REPAIR
        bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)

        backlog = pool_backlogs([pool.pk], now=clock.now())[0][pool.pk]
        forecast = upgrades_forecasts([Upgrade.objects.get(pk=bios.pk)])[bios.pk]
        done = world.until_every_host(pool, train, [bios], step_s=30.0)

    # Its rack's visit in cycle 1 went without it; it got bios at the rack's visit in cycle 2.
    first_visit = Visit.objects.get(train=train, cycle__number=1, domain_id=broken.domain_id)
    assert broken.pk not in first_visit.plan["hosts"]
    assert done[bios.pk] == 2
    assert (forecast.code, forecast.cycle) == (ForecastCode.SCHEDULED, 2), forecast.text
    assert Upgrade.objects.get(pk=bios.pk).promised_cycle == 2
    assert backlog.broken[bios.pk] == {broken.domain_id: 1}
    assert backlog.pending[bios.pk][broken.domain_id] == 1  # its rack's other host, in service


def test_an_upgrade_pending_only_on_a_host_in_repair_is_forecast_for_the_cycle_that_opens_once_it_is_back() -> None:
    # The train opens no cycle for work only on hosts out broken: its first opens as the host returns.
    timed_simulator(repair={"seconds": REPAIR_S})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, hosts = make_fleet(domains=2, hosts_per_domain=1, planned_buffer_hosts=1)
        train = make_train(pool, cycle_slo_s=3 * 3600, visit_overhead_s=600)
        host_failure_report(host_id=hosts[0].pk, reason="dead power supply")
        world.tick(pool, rounds=2)
        bios = upgrade_create(
            pool=pool, component="bios", version="2.16.0", reason="rollout", scope=f"hosts: {hosts[0].hostname}"
        )

        forecast = upgrades_forecasts([Upgrade.objects.get(pk=bios.pk)])[bios.pk]
        done = world.until_every_host(pool, train, [bios], step_s=30.0)

    assert done[bios.pk] == 1
    assert (forecast.code, forecast.cycle) == (ForecastCode.SCHEDULED, 1), forecast.text
