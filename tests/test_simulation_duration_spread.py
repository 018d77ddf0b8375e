"""The simulated hosts each take their own time: a log-normal factor per host and kind of work (mean 1,
bounded, fixed by the seed), off in the default scenario and on in the meta scenario."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator

import pytest

from opsplanner.models import SimulatorProfile, WorkItem, WorkKind
from opsplanner.services.simulator import (
    SPREAD_Z_BOUND,
    _duration,
    host_spread_factor,
    simulator_host_spread_set,
)
from simulation.config import SimulationConfig
from simulation.scenarios import scenario_config, simulated_hardware_apply


@pytest.fixture(autouse=True)
def no_spread_after() -> Iterator[None]:
    yield
    simulator_host_spread_set(0.0)


def test_it_gives_every_host_the_same_time_without_a_spread() -> None:
    assert {host_spread_factor(1, host, WorkKind.DRAIN, 0.0) for host in range(100)} == {1.0}
    assert host_spread_factor(1, None, WorkKind.DRAIN, 0.5) == 1.0  # an item without a host


def test_it_draws_the_same_factor_for_the_same_seed_host_and_kind_and_another_for_another() -> None:
    first = host_spread_factor(7, 42, WorkKind.EXECUTE, 0.4)

    assert host_spread_factor(7, 42, WorkKind.EXECUTE, 0.4) == first
    assert host_spread_factor(8, 42, WorkKind.EXECUTE, 0.4) != first
    assert host_spread_factor(7, 43, WorkKind.EXECUTE, 0.4) != first
    assert host_spread_factor(7, 42, WorkKind.DRAIN, 0.4) != first


def test_its_factors_average_one_spread_as_asked_and_stay_within_their_bound() -> None:
    sigma = 0.3
    factors = [host_spread_factor(1, host, kind, sigma) for host in range(5000) for kind in WorkKind.values]
    low, high = (math.exp(sigma * z - sigma * sigma / 2) for z in (-SPREAD_Z_BOUND, SPREAD_Z_BOUND))

    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.02)
    assert statistics.stdev(math.log(f) for f in factors) == pytest.approx(sigma, rel=0.05)
    assert low <= min(factors)
    assert max(factors) <= high
    assert max(factors) > 1.5  # the hosts really differ
    assert min(factors) < 0.6


def test_it_stretches_each_simulated_item_by_its_hosts_factor() -> None:
    profile = SimulatorProfile(seed=3, drain_seconds=900.0, execute_seconds=1800.0, verify_seconds=600.0)
    items = [WorkItem(kind=kind, host_id=11, params={}) for kind in (WorkKind.DRAIN, WorkKind.EXECUTE, WorkKind.VERIFY)]
    plain = [_duration(profile, item) for item in items]

    simulator_host_spread_set(0.3)
    spread = [_duration(profile, item) for item in items]

    assert plain == [900.0, 1800.0, 600.0]
    assert spread == [
        pytest.approx(seconds * host_spread_factor(3, 11, item.kind, 0.3))
        for seconds, item in zip(plain, items, strict=True)
    ]
    assert spread != plain


def test_it_refuses_a_spread_out_of_range_in_words() -> None:
    with pytest.raises(ValueError, match="host spread must be a number from 0 to 3; got -1"):
        simulator_host_spread_set(-1)
    assert SimulationConfig(host_spread=4).errors()["host_spread"] == (
        "host spread must be at most 3 (a factor of e³ either way)."
    )
    assert "host_spread" in SimulationConfig(host_spread=-0.1).errors()


def test_the_default_scenario_has_no_spread_and_the_meta_scenario_has_one() -> None:
    assert SimulationConfig().host_spread == 0.0
    assert scenario_config("default").host_spread == 0.0
    assert 0 < scenario_config("meta").host_spread <= 1


@pytest.mark.django_db
def test_the_scenarios_hardware_sets_the_spread_the_simulated_executor_uses() -> None:
    profile = SimulatorProfile.current()
    item = WorkItem(kind=WorkKind.UNDRAIN, host_id=5, params={})

    simulated_hardware_apply(scenario_config("meta", hosts=400, pools=1))
    meta = _duration(profile, item)
    simulated_hardware_apply(scenario_config("default"))

    sigma = scenario_config("meta").host_spread
    assert meta == pytest.approx(profile.undrain_seconds * host_spread_factor(profile.seed, 5, WorkKind.UNDRAIN, sigma))
    assert _duration(profile, item) == profile.undrain_seconds


def test_a_slow_hosts_drain_takes_its_slow_factor_and_is_not_spread_past_the_drain_deadline() -> None:
    profile = SimulatorProfile(seed=3, drain_seconds=900.0, slow_host_fraction=0.5, slow_drain_factor=4.0)
    simulator_host_spread_set(0.3)
    drains = {host: _duration(profile, WorkItem(kind=WorkKind.DRAIN, host_id=host, params={})) for host in range(200)}
    slow = [host for host, seconds in drains.items() if seconds == 3600.0]

    assert 60 < len(slow) < 140  # about half the hosts are slow: each drains in exactly 4 x 900 s
    assert all(
        drains[h] == pytest.approx(900 * host_spread_factor(3, h, WorkKind.DRAIN)) for h in drains if h not in slow
    )
