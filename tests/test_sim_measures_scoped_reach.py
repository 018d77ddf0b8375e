"""Reach of a scoped upgrade: measured against the hosts its scope named when it arrived, not at the
end of the run (a selector such as 'hosts running bios below 2.16.0' names fewer hosts as the upgrade
reaches them, and none once it is done)."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet import services
from fleet.models import ComponentVersion, Host
from opsplanner import clock
from simulation.config import Arrival, SimulationConfig
from simulation.engine import RunLog
from simulation.policies import RollingPolicy, TrainsPolicy
from simulation.rollout_measures import rollout_reach
from simulation.world import SimPool, World
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db

POOL = "reach-p"


def bios_installed(hosts: list[Host], at: dt.datetime) -> None:
    """The hosts run bios 2.16.0 from `at` on (the version and the event a finished upgrade leaves)."""
    target = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    with clock.use_clock(lambda: at):
        for host in hosts:
            services.installed_version_set(host=host, version=target)


def scoped_run(policy_class: type[TrainsPolicy] | type[RollingPolicy], reached: int) -> list[float | None]:
    """A pool of two racks of 5 whose second rack already runs bios 2.16.0; an upgrade to it arrives
    scoped to the hosts below it (the first rack), and `reached` of them get it 2 hours later. The
    reach row's 24 h, 72 h and 7 day shares."""
    pool, hosts = make_fleet(domains=2, hosts_per_domain=5, failure_buffer_hosts=1, pool_name=POOL)
    start = clock.now().replace(microsecond=0) + dt.timedelta(minutes=1)
    bios_installed(hosts[5:], start - dt.timedelta(seconds=30))
    config = SimulationConfig(hosts=10, pools=1, hosts_per_domain=5, days=8, start_at=start.isoformat())
    world = World(pools=[SimPool(id=pool.pk, name=pool.name, number=0, host_ids=[h.pk for h in hosts], domain_ids=[])])
    policy = policy_class(config, world)
    arrival = Arrival(
        at=start, pool=0, component="bios", version="2.16.0",
        upgrade={"scope": f"hosts running bios below 2.16.0 in pool {POOL}"},
    )  # fmt: skip
    with clock.use_clock(lambda: start):
        policy.arrive(arrival)
    bios_installed(hosts[:reached], start + dt.timedelta(hours=2))

    (row,) = rollout_reach(config, RunLog(policy=policy, world=world))[pool.pk]
    assert row[:3] == ["bios", "2.16.0", 0.0]
    return row[3:]


@pytest.mark.parametrize("policy_class", [TrainsPolicy, RollingPolicy])
def test_a_scoped_upgrade_that_reached_part_of_its_scope_is_measured_against_the_hosts_in_scope_on_arrival(
    policy_class: type[TrainsPolicy] | type[RollingPolicy],
) -> None:
    # 3 of the 5 hosts in scope on arrival; at the end only the 2 left behind still match the selector.
    assert scoped_run(policy_class, reached=3) == [0.6, 0.6, 0.6]


@pytest.mark.parametrize("policy_class", [TrainsPolicy, RollingPolicy])
def test_a_scoped_upgrade_that_reached_its_whole_scope_has_a_reach_of_one(
    policy_class: type[TrainsPolicy] | type[RollingPolicy],
) -> None:
    # At the end the selector names no host at all: the old measure found no hosts and gave no reach.
    assert scoped_run(policy_class, reached=5) == [1.0, 1.0, 1.0]


def test_a_whole_pool_upgrade_is_still_measured_against_the_whole_pool() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=5, failure_buffer_hosts=1, pool_name=POOL)
    start = clock.now().replace(microsecond=0) + dt.timedelta(minutes=1)
    config = SimulationConfig(hosts=10, pools=1, hosts_per_domain=5, days=2, start_at=start.isoformat())
    world = World(pools=[SimPool(id=pool.pk, name=pool.name, number=0, host_ids=[h.pk for h in hosts], domain_ids=[])])
    policy = TrainsPolicy(config, world)
    with clock.use_clock(lambda: start):
        policy.arrive(Arrival(at=start, pool=0, component="bios", version="2.16.0"))
    bios_installed(hosts[:4], start + dt.timedelta(hours=2))

    assert rollout_reach(config, RunLog(policy=policy, world=world))[pool.pk] == [
        ["bios", "2.16.0", 0.0, 0.4, None, None]
    ]
