"""A sliding train's forecast plays its visits as its release rule starts them, not on parallel lanes:
the next domain once the one before released every host and there is room, sized with the time left
less what its hosts still out may take. A domain-paced train's visits still run on its lanes. The
case is a reviewer's probe (tests/test_probe_h1_sliding.py), driven on a virtual clock."""

from __future__ import annotations

import pytest

from opsplanner import clock
from tests.builders import make_fleet
from tests.forecast_world import World, timed_simulator
from tests.trains_builders import make_train
from trains.models import Pace, Upgrade
from trains.selectors_forecast import upgrades_forecasts
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def two_racks_two_lanes(world: World, pace: str):
    # Two racks of 3 hosts, a planned buffer of 2, two visits at once: a visit's share of the buffer
    # is one host, so a rack takes 3 waves x (600 s overhead + 300 s bios) = 2700 s, in a 3850 s cycle.
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=2)
    train = make_train(pool, cycle_slo_s=3850, visit_overhead_s=600, visit_concurrency=2, pace=pace)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="r", duration_s=300)
    return pool, train, bios


def test_a_sliding_train_with_two_lanes_is_forecast_the_cycle_its_release_rule_reaches_every_host_in() -> None:
    # The sliding train has room for 2 hosts, both the first rack's: the second rack starts once the
    # first released its last host, with 3850 s less what has passed and less that host's 900 s, too
    # little for its 2700 s: it waits for cycle 2. Played on two lanes, both racks fitted cycle 1.
    timed_simulator(**{"upgrade:bios:2.16.0": {"seconds": 300}})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, train, bios = two_racks_two_lanes(world, Pace.SLIDING)
        forecast = upgrades_forecasts([Upgrade.objects.get(pk=bios.pk)])[bios.pk]
        done = world.until_every_host(pool, train, [bios], step_s=20.0)

    assert done[bios.pk] == 2
    assert forecast.cycle == 2, forecast.text
    assert Upgrade.objects.get(pk=bios.pk).promised_cycle == 2


def test_a_domain_paced_train_with_two_lanes_is_still_forecast_as_two_visits_at_once() -> None:
    timed_simulator(**{"upgrade:bios:2.16.0": {"seconds": 300}})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, train, bios = two_racks_two_lanes(world, Pace.DOMAIN)
        forecast = upgrades_forecasts([Upgrade.objects.get(pk=bios.pk)])[bios.pk]
        done = world.until_every_host(pool, train, [bios], step_s=20.0)

    assert (forecast.cycle, done[bios.pk]) == (1, 1), forecast.text
