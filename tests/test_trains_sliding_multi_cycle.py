"""A multi-cycle upgrade's hosts_per_visit places go to hosts where it fits the visit's budget: a
host busy with a long upgrade ahead of it in the queue does not take the place and leave it unused."""

from __future__ import annotations

import pytest

from tests.driving import instant_simulator
from tests.trains_builders import bounded_bios_beside_a_busy_host
from trains.models import Pace, Visit, VisitState
from trains.services.tick import train_tick

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("pace", [Pace.SLIDING, Pace.DOMAIN])
def test_it_gives_a_multi_cycle_upgrades_place_to_a_host_where_it_fits_the_budget(pace: str) -> None:
    instant_simulator()
    # The busy host is the first by id: the one the bound took first.
    _, train, busy, free, bios = bounded_bios_beside_a_busy_host(pace)

    train_tick(train_id=train.pk)

    plan = Visit.objects.get(train=train, state=VisitState.RUNNING).plan
    entry = next(e for e in plan["upgrades"] if e["upgrade"] == bios.pk)
    assert entry["hosts"] == 1  # its one place, on a host where it fits
    assert set(plan["hosts"]) == {busy.pk, free[0].pk}
