"""A forecast visit takes what the train tick's visit would: an upgrade that does not fit every host
is taken on the hosts where it fits (trains/services/visits.py narrows it the same way)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from fleet.models import ComponentVersion
from trains.models import Pace, Train, Upgrade
from trains.selectors_forecast import _State, _Visit, _visit_takes
from trains.services.budget import VisitSizing

NOW = dt.datetime(2030, 1, 7, tzinfo=dt.UTC)
DOMAIN = 7


def upgrade(pk: int, component_id: int, duration_s: int, version: str = "2.0") -> Upgrade:
    target = ComponentVersion(pk=100 + pk, component_id=component_id, version=version, sort_key=version)
    return Upgrade(
        pk=pk, priority=100, created_at=NOW + dt.timedelta(hours=pk), duration_s=duration_s, component_version=target
    )


def backlog(pace: str) -> Any:
    sizing = VisitSizing(
        budget_s=1800,
        overhead_s=600,
        hosts_at_once=40,
        factor=1.0,
        domains=1,
        largest_domain=40,
        waits_for_busiest=pace == Pace.DOMAIN,
    )
    return SimpleNamespace(sizing=sizing, train=Train(cycle_slo_s=86_400, visit_concurrency=1, pace=pace))


def test_beside_a_long_upgrade_left_on_one_host_a_forecast_visit_takes_the_others_on_the_rest() -> None:
    kernel, bios = upgrade(1, component_id=1, duration_s=1500), upgrade(2, component_id=2, duration_s=300)
    visit = _Visit(domain_id=DOMAIN, cycle=2, starts_at=NOW, deadline=NOW + dt.timedelta(days=1), visits_left=1)

    for pace in (Pace.DOMAIN, Pace.SLIDING):
        # The kernel is left on one host of the domain (its visit missed it); bios is pending on both.
        state = _State(remaining={kernel.pk: {DOMAIN: 1}, bios.pk: {DOMAIN: 2}})

        cost = _visit_takes(backlog(pace), state, [kernel, bios], visit).cost_s

        # The kernel's host (2,100 s out, over the 1,800 s budget) keeps bios for the next cycle;
        # the other host takes it now, as the tick's visit would. Unnarrowed, both waited a cycle.
        assert state.remaining == {kernel.pk: {DOMAIN: 0}, bios.pk: {DOMAIN: 1}}, pace
        assert cost == 2100


def test_an_older_release_a_narrower_hotfix_supersedes_on_one_host_is_taken_on_the_others_in_the_same_visit() -> None:
    # bios 2.0 is pending on both hosts of the domain; the hotfix 2.1 only on one (its scope).
    release, hotfix = (
        upgrade(1, component_id=1, duration_s=300),
        upgrade(2, component_id=1, duration_s=300, version="2.1"),
    )
    visit = _Visit(domain_id=DOMAIN, cycle=1, starts_at=NOW, deadline=NOW + dt.timedelta(days=1), visits_left=1)
    state = _State(remaining={release.pk: {DOMAIN: 2}, hotfix.pk: {DOMAIN: 1}})

    _visit_takes(backlog(Pace.DOMAIN), state, [release, hotfix], visit)

    # As the tick's visit: the hotfix on its host, the release on the other. With the newest release
    # standing in for the older on every host, the release waited a whole cycle for its other host.
    assert state.remaining == {release.pk: {DOMAIN: 0}, hotfix.pk: {DOMAIN: 0}}
