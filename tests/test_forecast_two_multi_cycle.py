"""Two multi-cycle releases of one component pending at once: the forecast of the older one counts
only the hosts the visits really take for it, its own and those the newer one supersedes there."""

from __future__ import annotations

import pytest

from fleet.models import Component, ComponentVersion, InstalledVersion
from fleet.services import installed_version_set
from tests.builders import make_fleet, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Cycle, Upgrade, UpgradeState, Visit
from trains.selectors_forecast import upgrades_forecasts
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def test_it_forecasts_the_older_of_two_multi_cycle_releases_in_the_cycle_the_visits_finish_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4)
    make_version(Component.objects.get(name="bios"), "2.17.0")
    first, second, *_ = sorted(hosts, key=lambda h: h.pk)
    for host in (first, second):  # 2.16.0 reached the first hosts by id, as its multi-cycle rollout goes
        installed_version_set(host=host, version=ComponentVersion.objects.get(component__name="bios", version="2.16.0"))
    train = make_train(pool)
    older = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="fix", multi_cycle=True, hosts_per_visit=1
    )
    newer = upgrade_create(
        pool=pool, component="bios", version="2.17.0", reason="newer", multi_cycle=True, hosts_per_visit=1
    )

    forecast = upgrades_forecasts([older, newer])[older.pk]

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=older.pk).state == UpgradeState.COMPLETED)
    older.refresh_from_db()
    finished_in = Cycle.objects.filter(train=train, started_at__lte=older.finished_at).order_by("-number")[0].number
    assert forecast.cycle == finished_in == 1
    # The newer release's one place went to a host the older one still needed: one drain past both.
    plan = Visit.objects.get(train=train, cycle__number=1).plan
    entry = next(e for e in plan["upgrades"] if e["upgrade"] == newer.pk)
    assert (entry["hosts"], entry["supersedes"]) == (1, {str(older.pk): 1})
    assert not InstalledVersion.objects.filter(host__in=[first, second], version__version="2.17.0").exists()
