"""How a visit starting places a multi-cycle upgrade's hosts_per_visit (visits.domain_selection):
the budget prices a visit by its busiest host's work and by its waves (its hosts over the ones it
may have out at once), so a host not yet in the visit can cost more than one already busy."""

from __future__ import annotations

import pytest

from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Pace, Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_it_places_a_multi_cycle_upgrade_on_a_busy_host_when_a_new_host_would_add_a_wave(pace: str) -> None:
    instant_simulator()
    # Two hosts out at once (the planned buffer): a third host makes a second wave.
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2)
    idle, *busy = sorted(hosts, key=lambda h: h.pk)  # the first by id: where the place went first
    train = make_train(pool, cycle_slo_s=2000, visit_overhead_s=600, pace=pace)
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver", priority=300, duration_s=600,
        scope=f"hosts: {busy[0].hostname}, {busy[1].hostname}",
    )  # fmt: skip
    bios = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=600,
        multi_cycle=True, hosts_per_visit=1,
    )  # fmt: skip

    train_tick(train_id=train.pk)

    # On the idle host: two waves of 600 + 600 s = 2400 s; beside the driver: 600 + 1200 s = 1800 s.
    plan = Visit.objects.get(train=train, state=VisitState.RUNNING).plan
    entry = next(e for e in plan["upgrades"] if e["upgrade"] == bios.pk)
    assert entry["hosts"] == 1
    assert idle.pk not in plan["hosts"]
    assert sorted(plan["hosts"]) == sorted(h.pk for h in busy)
    assert plan["estimate_s"] == 1800
