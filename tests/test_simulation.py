"""The simulator runs the real planner in virtual time: small runs checked for what must hold."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from opsplanner import clock
from opsplanner.selectors.invariants import check_invariants
from simulation.advisor import AdvisorRequest, advice
from simulation.config import SimulationConfig
from simulation.engine import SimulationError, policy_run, scratch_database_check
from simulation.measure import run_measure
from simulation.world import workload_draw

pytestmark = pytest.mark.django_db

SMALL = SimulationConfig(
    hosts=120,
    pools=2,
    hosts_per_domain=10,
    days=2,
    upgrades_per_week=4,
    upgrades_at_start=1,
    host_failures_per_day=0.01,
    upgrade_failure_rate=0.01,
    verify_failure_rate=0.005,
    optout_windows_per_week=3,
    cycle_slo_hours=24,
    seed=7,
)


def simulate(config: SimulationConfig, policy: str, pools: list[int] | None = None) -> dict:
    log = policy_run(config, workload_draw(config), policy, pools=pools)
    return run_measure(config, log)


def without_timing(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "wall_seconds"}


def totals(result: dict, key: str) -> int:
    return sum(pool[key] for pool in result["pools"])


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    first = simulate(SMALL, "trains")
    second = simulate(SMALL, "trains")
    other = simulate(SMALL.replace(seed=8), "trains")

    assert without_timing(first) == without_timing(second)
    assert without_timing(first) != without_timing(other)
    assert totals(first, "drains") > 0  # it did something worth comparing


def test_a_pool_simulated_alone_gives_the_same_result_each_time() -> None:
    first = simulate(SMALL, "trains", pools=[1])
    again = simulate(SMALL, "trains", pools=[1])

    assert [p["name"] for p in first["pools"]] == ["sim-01"]
    assert first["pools"] == again["pools"]


@pytest.mark.parametrize("policy", ["trains", "rolling", "lockstep"])
def test_no_policy_ever_breaks_an_invariant_and_trains_and_rolling_keep_the_floor(policy: str) -> None:
    result = simulate(SMALL, policy)

    assert result["violations"] == []
    assert result["invariant_checks"] >= 1
    assert check_invariants() == []
    if policy != "lockstep":  # lock-step takes the whole pool down: that is what it costs
        assert totals(result, "hours_below_floor") == 0
        for pool in result["pools"]:
            assert pool["min_in_service"] >= pool["floor"]
    assert clock.now() != SMALL.start  # the virtual clock is gone once the run is over


def test_trains_drain_each_host_once_per_cycle_where_rolling_drains_once_per_upgrade() -> None:
    two_at_once = SimulationConfig(
        hosts=80,
        pools=1,
        hosts_per_domain=10,
        days=3,
        upgrades_per_week=0,
        upgrades_at_start=2,
        host_failures_per_day=0,
        upgrade_failure_rate=0,
        verify_failure_rate=0,
        optout_windows_per_week=0,
        cycle_slo_hours=48,
    )
    trains = simulate(two_at_once, "trains")
    rolling = simulate(two_at_once, "rolling")
    lockstep = simulate(two_at_once, "lockstep")

    assert totals(trains, "drains") == 80
    assert totals(rolling, "drains") == 160
    assert totals(lockstep, "drains") == 160
    for result in (trains, rolling, lockstep):
        rollouts = [r for pool in result["pools"] for r in pool["rollouts"]]
        assert len(rollouts) == 2
        assert all(r[3] is not None for r in rollouts), rollouts
    assert totals(lockstep, "hours_below_floor") > 0


def advised(job_hosts_min: int, job_hosts_max: int) -> dict:
    """The advice for one clean pool of 120 hosts (no failures, no opt-outs) with jobs of these sizes."""
    pool = SimulationConfig(
        hosts=120,
        pools=1,
        host_failures_per_day=0,
        upgrade_failure_rate=0,
        verify_failure_rate=0,
        optout_windows_per_week=0,
        job_hosts_min=job_hosts_min,
        job_hosts_max=job_hosts_max,
        cycle_slo_hours=24,
    )
    request = AdvisorRequest(config=pool, sizes=(10, 30, 60), interruption_cost=1, capacity_hour_cost=1)
    return advice(request, {job.key: [simulate(job.config, "trains")] for job in request.jobs()})


def test_the_advisor_picks_larger_domains_as_jobs_span_more_of_them() -> None:
    """The train visits domains back to back, so a job is interrupted about once a cycle whatever the
    size; but a job spanning k domains stays out k visits while its hosts still in service stand idle.
    The larger the jobs, the more capacity small domains strand, until a larger buffer costs less."""
    small, large = advised(4, 8), advised(60, 120)

    stranded = {p["size"]: p["stranded_host_hours"] for p in large["points"]}
    assert stranded[10] > stranded[30] > stranded[60] > 0  # smaller domains strand more of a job
    assert all(p["stranded_host_hours"] < stranded[p["size"]] for p in small["points"])
    for point in large["points"]:  # the capacity term prices buffer and stranded host-hours alike
        assert point["capacity_cost"] == pytest.approx(point["buffer_host_hours"] + point["stranded_host_hours"])
    assert small["recommended"] == 10  # small jobs: the smallest buffer is the cheapest
    assert large["recommended"] > small["recommended"]
    assert "stranded host-hours" in large["reason"]


def test_the_advisor_does_not_simulate_a_size_that_cannot_meet_the_slo() -> None:
    request = AdvisorRequest(
        config=SimulationConfig(hosts=400, cycle_slo_hours=48), sizes=(8, 40), interruption_cost=1, capacity_hour_cost=1
    )

    assert [job.key for job in request.jobs()] == ["size-40"]
    assert request.errors() == {}


def test_bad_configurations_are_refused_with_the_reason() -> None:
    assert "hosts" in SimulationConfig(hosts=0).errors()
    assert "at most 366 days" in SimulationConfig(days=400).errors()["days"]
    assert "does not fit" in SimulationConfig(hosts=100, pools=2, hosts_per_domain=80).errors()["hosts_per_domain"]
    assert "cannot be met" in SimulationConfig(hosts=1000, pools=1, cycle_slo_hours=5).errors()["cycle_slo_hours"]
    assert "some of" in SimulationConfig(policies=("trains", "yolo")).errors()["policies"]
    with pytest.raises(CommandError, match="--days"):
        call_command("simulate", "--days", "-1")
    with pytest.raises(CommandError, match=r"domain sizes|whole numbers"):
        call_command("simulate", "--advise", "--domain-sizes", "ten")


def test_it_refuses_to_simulate_in_a_database_that_is_not_a_scratch_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connection.settings_dict, "NAME", "opsplanner")

    with pytest.raises(SimulationError, match="not a simulation scratch database"):
        scratch_database_check()
