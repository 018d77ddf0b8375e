"""The train's own forecast (GET /api/trains/{id}/forecast/, the trains pages, the Gantt's dashed
visits, Cycle.forecast_end_at and alert.cycle_will_miss) lasts each visit of its open cycle what the
per-upgrade forecast plays it for: the running visit until its plan's estimate (and past it, a while
longer: trains.selectors.running_visit_end), the visits to come what their work costs, as the train
tick stored them on the cycle when what they depend on last changed (trains/services/cycle_played.py).
Read at the train's typical visit, a 3-rack pool whose one upgrade made each visit 1800 s had its
cycle forecast to end 87 minutes before the upgrade's forecast reached its last host (issue 24)."""

from __future__ import annotations

import datetime as dt

import pytest

from console.gantt.params import gantt_params
from console.gantt.rows import gantt_rows
from fleet.models import Host, HostState, Pool
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Cycle, Train, Upgrade, Visit, VisitState
from trains.selectors import OVERDUE_MIN_SHARE, running_visit_end
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

VISIT = dt.timedelta(seconds=1800)  # 1200 s of bios and 600 s of overhead
SLACK = dt.timedelta(seconds=5)  # a tick's worth: the forecasts are read a few statements apart
SECOND = dt.timedelta(seconds=1)


def a_cycle_of_three_visits_of_1800_s(slo_s: int = 5400) -> tuple[Pool, Train, Visit]:
    """Three racks, an SLO of 5400 s (unless told), a train expecting 60 s visits (nothing measured yet) and one
    bios upgrade that makes each visit 1800 s: cycle 1 is open and its first visit runs."""
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool, cycle_slo_s=slo_s, visit_estimate_s=60, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    train_tick(train_id=train.pk)
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert first.plan["estimate_s"] == VISIT.total_seconds()
    return pool, train, first


def a_driver_on_the_last_rack(pool: Pool, *, duration_s: int) -> Upgrade:
    """A driver upgrade scoped to the hosts of the pool's last rack: that rack's visits cost more."""
    last_rack = Host.objects.filter(domain__pool=pool).order_by("-domain__position").first()
    assert last_rack is not None
    hosts = Host.objects.filter(domain_id=last_rack.domain_id).values_list("hostname", flat=True)
    return upgrade_create(
        pool=pool,
        component="gpu-driver",
        version="560.35.03",
        reason="rollout",
        duration_s=duration_s,
        scope="hosts: " + ", ".join(hosts),
    )


def forecasts_of(train: Train, upgrade_id: int) -> tuple[dt.datetime, dict[str, object]]:
    """When the upgrade's forecast reaches its last host, and the train's forecast (both by the API)."""
    api = role_client(Role.VIEWER)
    every_host = dt.datetime.fromisoformat(api.get(f"/api/upgrades/{upgrade_id}/").json()["forecast"]["at"])
    return every_host, api.get(f"/api/trains/{train.pk}/forecast/").json()


def test_it_ends_the_cycle_when_the_upgrades_forecast_reaches_every_host() -> None:
    pool, train, first = a_cycle_of_three_visits_of_1800_s()

    every_host, forecast = forecasts_of(train, pool.upgrades.get().pk)

    cycle_end = dt.datetime.fromisoformat(str(forecast["cycle_end"]))
    assert abs(cycle_end - every_host) <= SLACK
    assert abs(cycle_end - (first.started_at + 3 * VISIT)) <= SLACK
    assert forecast["meets_slo"] is True


def test_the_gantts_dashed_visits_last_what_their_work_takes() -> None:
    _, _, first = a_cycle_of_three_visits_of_1800_s()
    params, form = gantt_params(
        {"start": first.started_at.isoformat(), "end": (first.started_at + 4 * VISIT).isoformat()}
    )
    assert params is not None, form.errors

    dashed = [bar for row in gantt_rows(params).rows for bar in row.bars if bar.css.startswith("forecast")]

    assert sorted((bar.start, bar.end) for bar in dashed) == [
        (first.started_at + VISIT, first.started_at + 2 * VISIT),
        (first.started_at + 2 * VISIT, first.started_at + 3 * VISIT),
    ]


def test_it_agrees_with_the_upgrades_forecast_when_the_domains_work_costs_differ() -> None:
    # bios on every host (1200 s), and a driver (2400 s) on the last rack's hosts only: that rack's
    # visit takes both, 4200 s with the overhead, its two neighbours 1800 s each.
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool, cycle_slo_s=4 * 3600, visit_estimate_s=60, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    driver = a_driver_on_the_last_rack(pool, duration_s=2400)
    train_tick(train_id=train.pk)
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)

    every_host, forecast = forecasts_of(train, driver.pk)

    ends = sorted(dt.datetime.fromisoformat(str(d["ends_at"])) for d in forecast["domains"])  # type: ignore[union-attr]
    assert ends == [
        first.started_at + VISIT,
        first.started_at + 2 * VISIT,
        first.started_at + 2 * VISIT + 4200 * SECOND,
    ]
    cycle_end = dt.datetime.fromisoformat(str(forecast["cycle_end"]))
    assert abs(cycle_end - every_host) <= SLACK


def test_an_overrunning_visit_raises_the_cycle_alert_before_the_deadline() -> None:
    # The three visits fill the SLO exactly: the first one overrunning its plan makes the cycle miss.
    _, train, first = a_cycle_of_three_visits_of_1800_s()
    cycle = Cycle.objects.get(train=train, number=1)
    overrun = first.started_at + VISIT + dt.timedelta(seconds=300)  # its hosts not back yet

    with clock.use_clock(lambda: overrun):
        train_tick(train_id=train.pk)

    alert = Event.objects.get(kind="alert.cycle_will_miss")
    assert alert.created_at < cycle.deadline_at
    # Run on as long again as it overran (300 s), then the two visits to come at their 1800 s.
    forecast_end = dt.datetime.fromisoformat(alert.data["forecast_end"])
    assert forecast_end == overrun + dt.timedelta(seconds=300) + 2 * VISIT
    assert Cycle.objects.get(pk=cycle.pk).forecast_end_at == forecast_end
    # The alert names the visit that overran, so an operator knows it is a prediction from it.
    assert f"the visit of {first.domain.name} runs 5 min past its expected 30 min" in alert.reason


def test_an_overdue_visit_is_expected_to_run_on_never_to_end_now() -> None:
    started = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    visit = Visit(state=VisitState.RUNNING, started_at=started, plan={"estimate_s": 1000})

    on_time = running_visit_end(visit, 60, started + dt.timedelta(seconds=400))
    just_over = running_visit_end(visit, 60, started + dt.timedelta(seconds=1001))
    long_over = running_visit_end(visit, 60, started + dt.timedelta(seconds=1500))
    no_plan = running_visit_end(Visit(state=VisitState.RUNNING, started_at=started, plan={}), 60, started)

    assert on_time == started + dt.timedelta(seconds=1000)
    assert just_over == started + dt.timedelta(seconds=1001 + OVERDUE_MIN_SHARE * 1000)
    assert long_over == started + dt.timedelta(seconds=1500 + 500)
    assert no_plan == started + dt.timedelta(seconds=60)


def test_the_stored_durations_are_played_again_when_an_upgrade_arrives_and_when_a_visit_starts() -> None:
    pool, train, first = a_cycle_of_three_visits_of_1800_s(slo_s=4 * 3600)  # room for a longer visit
    cycle = Cycle.objects.get(train=train, number=1)
    later = [d.pk for d in pool.domains.order_by("position")][1:]
    assert cycle.played_s == {str(later[0]): 1800.0, str(later[1]): 1800.0}

    train_tick(train_id=train.pk)  # nothing changed: not played again
    assert Cycle.objects.get(pk=cycle.pk).played_key == cycle.played_key

    # A driver for the last rack: its visit now takes both.
    a_driver_on_the_last_rack(pool, duration_s=1200)
    train_tick(train_id=train.pk)
    assert Cycle.objects.get(pk=cycle.pk).played_s == {str(later[0]): 1800.0, str(later[1]): 3000.0}

    # The first visit ends, the second starts: only the last one is still to come.
    Visit.objects.filter(pk=first.pk).update(state=VisitState.DONE, ended_at=first.started_at + VISIT)
    with clock.use_clock(lambda: first.started_at + VISIT):
        train_tick(train_id=train.pk)
    assert Visit.objects.get(train=train, domain_id=later[0]).state == VisitState.RUNNING
    assert Cycle.objects.get(pk=cycle.pk).played_s == {str(later[1]): 3000.0}


def test_the_stored_durations_follow_a_later_racks_hosts_breaking_and_coming_back() -> None:
    # Both hosts of the last rack out broken: its visit this cycle has nothing to take (0 s); back
    # in service, it takes the bios again (1800 s). Neither moves a visit or an upgrade.
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=3)
    train = make_train(pool, cycle_slo_s=4 * 3600, visit_estimate_s=60, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    train_tick(train_id=train.pk)
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    cycle = Cycle.objects.get(train=train, number=1)
    last_rack = pool.domains.order_by("-position").first()
    assert last_rack is not None

    Host.objects.filter(domain=last_rack).update(state=HostState.REPAIR)
    train_tick(train_id=train.pk)
    assert Cycle.objects.get(pk=cycle.pk).played_s[str(last_rack.pk)] == 0

    Host.objects.filter(domain=last_rack).update(state=HostState.IN_SERVICE)
    train_tick(train_id=train.pk)
    assert Cycle.objects.get(pk=cycle.pk).played_s[str(last_rack.pk)] == VISIT.total_seconds()
    _, forecast = forecasts_of(train, pool.upgrades.get().pk)
    cycle_end = dt.datetime.fromisoformat(str(forecast["cycle_end"]))
    assert abs(cycle_end - (first.started_at + 3 * VISIT)) <= SLACK


def test_the_stored_durations_are_played_again_when_an_upgrade_is_replanned() -> None:
    # Four hosts a rack, two out at once: a visit takes the bios in two waves (3600 s); replanned
    # to two hosts a visit, the visits to come take one wave (1800 s). No visit starts or ends.
    from trains.services.replan import upgrade_replan

    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=4, planned_buffer_hosts=2, failure_buffer_hosts=3)
    train = make_train(pool, cycle_slo_s=6 * 3600, visit_estimate_s=60, visit_overhead_s=600)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    train_tick(train_id=train.pk)
    cycle = Cycle.objects.get(train=train, number=1)
    assert set(cycle.played_s.values()) == {2 * VISIT.total_seconds()}

    upgrade_replan(upgrade_id=bios.pk, actor="ops", multi_cycle=True, hosts_per_visit=2)
    train_tick(train_id=train.pk)

    assert set(Cycle.objects.get(pk=cycle.pk).played_s.values()) == {VISIT.total_seconds()}
