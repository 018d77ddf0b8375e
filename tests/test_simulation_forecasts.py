"""The simulator measures the product's per-upgrade forecast against what then happened."""

from __future__ import annotations

import pytest

from simulation.config import SimulationConfig
from simulation.engine import policy_run
from simulation.measure import run_measure
from simulation.rollout_measures import forecast_summary
from simulation.world import workload_draw
from trains.selectors_forecast import ForecastCode

SCHEDULED = ForecastCode.SCHEDULED.value


def pool(rollouts: list[list], forecasts: list[list]) -> dict:
    return {"rollouts": rollouts, "forecasts": forecasts}


def test_the_forecast_summary_counts_the_upgrades_done_by_their_first_forecast_and_how_late_the_others_were() -> None:
    pools = [
        pool(
            [["bios", "2", 0.0, 10.0, ""], ["nic", "3", 1.0, 30.0, ""], ["gpu", "4", 2.0, None, "unfinished"]],
            [[12.0, SCHEDULED], [20.0, SCHEDULED], [40.0, SCHEDULED]],
        ),
        pool(
            [["bmc", "5", 3.0, 8.0, ""], ["ssd", "6", 4.0, None, "unfinished"], ["os", "7", 5.0, 9.0, ""]],
            # beyond the run's 48 h, beyond the forecast's horizon, and never forecast
            [[60.0, SCHEDULED], [None, ForecastCode.BEYOND_HORIZON.value], [None, ""]],
        ),
    ]

    summary = forecast_summary(pools, end_hours=48.0)

    assert summary["forecasts_due"] == 3  # bios, nic, gpu: forecast to finish within the run
    assert summary["forecasts_kept"] == 1  # bios, 2 h early
    # late: bios -2, nic +10, gpu unfinished at the end (48 - 40 = +8, a lower bound)
    assert summary["forecast_late_median_hours"] == 8.0
    assert summary["forecast_late_p90_hours"] == 10.0


def test_a_policy_without_forecasts_has_no_forecast_measures() -> None:
    rolling = [pool([["bios", "2", 0.0, 10.0, ""]], [[None, ""]])]

    assert set(forecast_summary(rolling, end_hours=48.0).values()) == {None}


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["trains", "trains-sliding"])
def test_each_upgrade_a_train_runs_keeps_the_forecast_it_was_given_as_it_arrived(policy: str) -> None:
    config = SimulationConfig(
        hosts=40, pools=1, hosts_per_domain=10, days=2, upgrades_per_week=7, upgrades_at_start=2, seed=5
    )

    (measured,) = run_measure(config, policy_run(config, workload_draw(config), policy))["pools"]

    rollouts, forecasts = measured["rollouts"], measured["forecasts"]
    assert len(rollouts) >= 3  # two at the start and some on the way
    assert len(forecasts) == len(rollouts)
    for (component, _, arrived, finished, _), (at, code) in zip(rollouts, forecasts, strict=True):
        assert code == SCHEDULED, component  # a running train with room: every one is scheduled
        assert at >= arrived, component  # forecast at its arrival, for later
        if finished is not None:
            # 40 hosts, a visit per domain: what the forecast said is the order of what happened
            assert abs(finished - at) < 24, (component, at, finished)
