"""The train's own forecast (GET /api/trains/{id}/forecast/, the trains pages, the Gantt's dashed
visits, alert.cycle_will_miss) lasts each visit of its cycle what the per-upgrade forecast plays it
for: the running visit its plan's estimate, the visits to come the work they will take; the train's
typical visit (visit_estimate_s until visits are measured) only where no work is pending. Read at the
typical visit, a 3-rack pool whose one upgrade made each visit 1800 s had its cycle forecast to end
87 minutes before the upgrade's forecast reached its last host (a reviewer's probe, h62)."""

from __future__ import annotations

import datetime as dt

import pytest

from console.gantt.params import gantt_params
from console.gantt.rows import gantt_rows
from fleet.models import Pool
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Cycle, Train, Visit, VisitState
from trains.selectors import train_forecast
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

VISIT = dt.timedelta(seconds=1800)  # 1200 s of bios and 600 s of overhead: a visit's share of the 5400 s SLO
SLACK = dt.timedelta(seconds=5)  # a tick's worth: the forecasts are read a few statements apart


def a_cycle_of_three_visits_of_1800_s() -> tuple[Pool, Train, Visit]:
    """Three racks, an SLO of 5400 s, a train expecting 60 s visits (nothing measured yet) and one
    bios upgrade that makes each visit 1800 s: cycle 1 is open and its first visit runs."""
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool, cycle_slo_s=5400, visit_estimate_s=60, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    train_tick(train_id=train.pk)
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert first.plan["estimate_s"] == VISIT.total_seconds()
    return pool, train, first


def test_the_trains_forecast_ends_the_cycle_when_the_upgrades_forecast_reaches_every_host() -> None:
    pool, train, first = a_cycle_of_three_visits_of_1800_s()
    api = role_client(Role.VIEWER)

    bios = pool.upgrades.get()
    every_host = dt.datetime.fromisoformat(api.get(f"/api/upgrades/{bios.pk}/").json()["forecast"]["at"])
    forecast = api.get(f"/api/trains/{train.pk}/forecast/").json()

    cycle_end = dt.datetime.fromisoformat(forecast["cycle_end"])
    assert abs(cycle_end - every_host) <= SLACK
    assert abs(cycle_end - (first.started_at + 3 * VISIT)) <= SLACK
    ends = sorted(dt.datetime.fromisoformat(d["ends_at"]) for d in forecast["domains"])
    assert ends == [first.started_at + VISIT, first.started_at + 2 * VISIT, first.started_at + 3 * VISIT]
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


def test_a_cycle_whose_planned_visits_overrun_its_deadline_is_alerted_though_its_typical_visits_fit() -> None:
    # The cycle fell behind: its deadline is 1000 s after its first visit started, whose plan says
    # 1800 s, and the two visits after it start past the deadline, where a visit still takes its first
    # upgrade (budget.sizing_within_cycle). Three typical visits of 60 s would end well before it.
    _, train, first = a_cycle_of_three_visits_of_1800_s()
    deadline = first.started_at + dt.timedelta(seconds=1000)
    Cycle.objects.filter(train=train, number=1).update(deadline_at=deadline)

    forecast = train_forecast(Train.objects.get(pk=train.pk))
    train_tick(train_id=train.pk)

    assert forecast.meets_slo is False
    assert forecast.cycle_end is not None
    assert abs(forecast.cycle_end - (first.started_at + 3 * VISIT)) <= SLACK
    alert = Event.objects.get(kind="alert.cycle_will_miss")
    assert alert.data["train"] == train.pk
    assert Cycle.objects.get(train=train, number=1).forecast_end_at == dt.datetime.fromisoformat(
        alert.data["forecast_end"]
    )


def test_a_train_with_no_pending_work_forecasts_its_typical_visit() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool, cycle_slo_s=5400, visit_estimate_s=60)

    forecast = train_forecast(train)

    assert forecast.cycle is None
    assert [d.ends_at - d.starts_at for d in forecast.domains if d.starts_at and d.ends_at] == [
        dt.timedelta(seconds=60)
    ] * 3
