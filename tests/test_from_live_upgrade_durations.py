"""What-if on the live fleet: the lane's simulated executor takes each live upgrade's own duration
(duration_s, which its train sizes the visits with), and one without a duration the simulator's
default; the report says what the lane ran with, not the generated fleet's hardware."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Pool
from opsplanner import clock
from opsplanner.models import WorkItem, WorkKind
from simulation.config import SimulationConfig
from simulation.report import report_text
from tests.builders import make_fleet
from tests.from_live_helpers import forecast, policy
from trains.models import Upgrade
from trains.selectors_forecast import upgrades_forecasts
from trains.services.trains import train_create
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db(transaction=True)  # the forecast resets the database as a lane

SIX_HOURS = 6 * 3600


def two_racks_with_a_slow_bios(*, and_a_driver: bool = False) -> tuple[Pool, Upgrade]:
    """Two racks of 4 hosts, a buffer of 4 (a visit takes a rack at once), a train, and bios 2.16.0
    taking 6 h a host; with `and_a_driver`, driver 560.35.03 pending too, with no duration of its own."""
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=4, failure_buffer_hosts=1)
    train_create(pool=pool, name="t", cycle_slo_s=72 * 3600, visit_estimate_s=3600, visit_overhead_s=900, actor="test")
    bios = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow firmware", duration_s=SIX_HOURS, actor="test"
    )
    if and_a_driver:
        upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver", actor="test")
    return pool, bios


def executions_took(component: str) -> set[float]:
    """How long the lane's simulated executor took for each host's execution of the component (seconds)."""
    items = WorkItem.objects.filter(kind=WorkKind.EXECUTE, params__component=component, due_at__isnull=False)
    return {(due - claimed).total_seconds() for due, claimed in items.values_list("due_at", "claimed_at")}


def test_the_what_if_forecasts_a_slow_live_upgrade_about_when_the_live_forecast_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, bios = two_racks_with_a_slow_bios()
    live = upgrades_forecasts([Upgrade.objects.get(pk=bios.pk)])[bios.pk]
    assert live.at is not None
    live_hours = (live.at - clock.now()) / dt.timedelta(hours=1)
    assert live_hours >= 12  # two visits of a rack, each 6 h of work and its overhead

    [row] = policy(forecast(monkeypatch, pool, "trains", days=2), "trains")["upgrades"]

    # Not 2 h (every install in the simulator's 30 min): within a few hours of the live forecast.
    assert row["full_rollout_hours"] is not None
    assert abs(row["full_rollout_hours"] - live_hours) <= 3, (live.text, row)


def test_each_live_upgrade_runs_at_its_own_duration_and_one_without_at_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, _ = two_racks_with_a_slow_bios(and_a_driver=True)

    result = forecast(monkeypatch, pool, "trains", days=2)

    assert [r["full_rollout_hours"] is not None for r in policy(result, "trains")["upgrades"]] == [True, True]
    assert executions_took("bios") == {SIX_HOURS}
    assert executions_took("gpu-driver") == {SimulationConfig().execute_minutes * 60}


def test_a_rolling_what_if_runs_a_slow_live_upgrade_at_its_duration_without_failing_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, _ = two_racks_with_a_slow_bios()

    [row] = policy(forecast(monkeypatch, pool, "rolling", days=2), "rolling")["upgrades"]

    assert row["outcome"] == ""
    assert row["full_rollout_hours"] is not None
    assert executions_took("bios") == {SIX_HOURS}  # announced, so its execution deadline is three times that


def test_the_report_of_a_what_if_says_what_its_lane_ran_with_not_the_generated_fleets_hardware(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, _ = two_racks_with_a_slow_bios(and_a_driver=True)

    text = report_text(forecast(monkeypatch, pool, "trains", days=1)["summary"])

    for generic in ("a visit takes", "domain(s) =", "per pool per week"):
        assert generic not in text
    assert f"Pool {pool.name}: 8 hosts in 2 domains; planned buffer 4 hosts, failure buffer 1 hosts" in text
    assert "Train t: visits of 1 domain(s) at once, each estimated at 1 h (15 min of it drain" in text
    assert "bios 2.16.0 6 h; gpu-driver 560.35.03 30 min (none given: the simulator's default)" in text
