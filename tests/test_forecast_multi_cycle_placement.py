"""The forecast places a multi-cycle upgrade's hosts_per_visit places as the visits take them
(trains/services/visits.py, _ranked_selection): on the hosts where it fits the visit's budget, not on
a host a long upgrade ahead of it already fills. Played on the first-numbered hosts, it was left out
of the visit in the forecast where the visit took it, and forecast a cycle late."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest

from fleet.models import Component, ComponentVersion
from tests.builders import make_fleet, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import bounded_bios_beside_a_busy_host, make_train
from trains.models import Cycle, Pace, Train, Upgrade, UpgradeState, Visit
from trains.selectors_forecast import _State, _Visit, _visit_takes, upgrades_forecasts
from trains.services.budget import VisitSizing
from trains.services.upgrades import upgrade_create

NOW = dt.datetime(2030, 1, 7, tzinfo=dt.UTC)
DOMAIN = 7


@pytest.mark.django_db
@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_the_forecast_places_a_multi_cycle_upgrade_beside_a_busy_host_as_the_visit_does(pace: str) -> None:
    instant_simulator()
    # The busy host is the first by id: where the forecast played the bound's place.
    pool, train, _, _, bios = bounded_bios_beside_a_busy_host(pace)

    forecast = upgrades_forecasts([Upgrade.objects.get(pk=bios.pk)])[bios.pk]

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=bios.pk).state == UpgradeState.COMPLETED)
    bios.refresh_from_db()
    finished_in = Cycle.objects.filter(train=train, started_at__lte=bios.finished_at).order_by("-number")[0].number
    # One host a cycle from the first: the first visit took it beside the driver, on another host.
    first = Visit.objects.get(train=train, cycle__number=1).plan
    assert next(e["hosts"] for e in first["upgrades"] if e["upgrade"] == bios.pk) == 1
    assert forecast.cycle == finished_in == 3  # forecast 4 when played on the driver's host


@pytest.mark.django_db
def test_an_older_release_on_the_busy_host_is_forecast_in_the_cycle_its_own_visit_reaches_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=3)
    make_version(Component.objects.get(name="bios"), "2.15.0")
    busy = min(hosts, key=lambda h: h.pk)
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600)
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver",
        scope=f"hosts: {busy.hostname}", priority=300, duration_s=2400,
    )  # fmt: skip
    older = upgrade_create(
        pool=pool, component="bios", version="2.15.0", reason="fix", scope=f"hosts: {busy.hostname}", duration_s=900
    )
    upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=900,
        multi_cycle=True, hosts_per_visit=1,
    )  # fmt: skip

    forecast = upgrades_forecasts([Upgrade.objects.get(pk=older.pk)])[older.pk]

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=older.pk).state == UpgradeState.COMPLETED)
    older.refresh_from_db()
    finished_in = Cycle.objects.filter(train=train, started_at__lte=older.finished_at).order_by("-number")[0].number
    # 2.16.0's first place went beside the driver's host, and 2.15.0 had no room there: the next
    # visit reaches it. Counted as reached by the newer release's host, it was forecast in cycle 1.
    assert forecast.cycle == finished_in == 2


def upgrade(pk: int, component_id: int, duration_s: int, version: str = "2.0", bound: int | None = None) -> Upgrade:
    target = ComponentVersion(pk=100 + pk, component_id=component_id, version=version, sort_key=version)
    return Upgrade(
        pk=pk, priority=300 - pk, created_at=NOW + dt.timedelta(hours=pk), duration_s=duration_s,
        component_version=target, multi_cycle=bound is not None, hosts_per_visit=bound,
    )  # fmt: skip


def backlog(pace: str, hosts_at_once: int = 40) -> Any:
    sizing = VisitSizing(
        budget_s=3600,
        overhead_s=600,
        hosts_at_once=hosts_at_once,
        factor=1.0,
        domains=1,
        largest_domain=40,
        waits_for_busiest=pace == Pace.DOMAIN,
    )
    return SimpleNamespace(sizing=sizing, train=Train(cycle_slo_s=86_400, visit_concurrency=1, pace=pace))


def visit() -> _Visit:
    return _Visit(domain_id=DOMAIN, cycle=1, starts_at=NOW, deadline=NOW + dt.timedelta(days=1), visits_left=1)


@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_a_played_visit_gives_a_multi_cycle_upgrades_place_to_a_host_with_room_beside_a_busy_one(pace: str) -> None:
    # The driver (first in line) on one host; bios, one host a visit, pending on four.
    driver, bios = upgrade(1, component_id=1, duration_s=2400), upgrade(2, component_id=2, duration_s=900, bound=1)
    state = _State(remaining={driver.pk: {DOMAIN: 1}, bios.pk: {DOMAIN: 4}})

    cost = _visit_takes(backlog(pace), state, [driver, bios], visit()).cost_s

    # bios's place goes to a host beside the driver's (600 + 900 s), not to the driver's own.
    assert state.remaining == {driver.pk: {DOMAIN: 0}, bios.pk: {DOMAIN: 3}}
    assert cost == 3000


def test_a_played_visit_gives_the_place_to_the_driver_host_when_it_fits_there() -> None:
    # The common case: room on every host; the place goes to the first-numbered host, the one the
    # other upgrades (and an older release) share, so one drain applies both.
    driver, bios = upgrade(1, component_id=1, duration_s=600), upgrade(2, component_id=2, duration_s=900, bound=1)
    state = _State(remaining={driver.pk: {DOMAIN: 1}, bios.pk: {DOMAIN: 4}})

    cost = _visit_takes(backlog(Pace.DOMAIN), state, [driver, bios], visit()).cost_s

    assert state.remaining == {driver.pk: {DOMAIN: 0}, bios.pk: {DOMAIN: 3}}
    assert cost == 600 + 600 + 900  # one host carries both


def test_an_older_release_is_not_counted_reached_where_the_newer_release_took_another_host() -> None:
    # bios 2.1 (multi-cycle, one host a visit) pending on three hosts, bios 2.0 on one: the driver's.
    driver = upgrade(1, component_id=1, duration_s=2400)
    newer = upgrade(2, component_id=2, duration_s=900, version="2.1", bound=1)
    older = upgrade(3, component_id=2, duration_s=900, version="2.0")
    state = _State(remaining={driver.pk: {DOMAIN: 1}, newer.pk: {DOMAIN: 3}, older.pk: {DOMAIN: 1}})

    _visit_takes(backlog(Pace.DOMAIN), state, [driver, newer, older], visit())

    # 2.1 goes beside the driver's host; 2.0 waits there for a cycle with room (600 + 2400 + 900 s
    # over the 3600 s budget): the newer one's host is not one of its own.
    assert state.remaining == {driver.pk: {DOMAIN: 0}, newer.pk: {DOMAIN: 2}, older.pk: {DOMAIN: 1}}
