"""A multi-cycle upgrade's hosts_per_visit places go to hosts where it fits the visit's budget: a
host busy with a long upgrade ahead of it in the queue does not take the place and leave it unused."""

from __future__ import annotations

import pytest

from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Pace, Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("pace", [Pace.SLIDING, Pace.DOMAIN])
def test_it_gives_a_multi_cycle_upgrades_place_to_a_host_where_it_fits_the_budget(pace: str) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=3)
    busy, *free = sorted(hosts, key=lambda h: h.pk)  # the first by id: the one the bound took first
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600, pace=pace)
    # A long driver upgrade first in line on one host: that host has no room for bios this visit
    # (600 + 2400 + 900 s against 3600 s), the others have (600 + 900 s).
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver",
        scope=f"hosts: {busy.hostname}", priority=300, duration_s=2400,
    )  # fmt: skip
    bios = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=900,
        multi_cycle=True, hosts_per_visit=1,
    )  # fmt: skip

    train_tick(train_id=train.pk)

    plan = Visit.objects.get(train=train, state=VisitState.RUNNING).plan
    entry = next(e for e in plan["upgrades"] if e["upgrade"] == bios.pk)
    assert entry["hosts"] == 1  # its one place, on a host where it fits
    assert set(plan["hosts"]) == {busy.pk, free[0].pk}
