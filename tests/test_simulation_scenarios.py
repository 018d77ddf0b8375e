"""Named scenarios (`--scenario meta`), the rollout measures (reach per upgrade, cycles that missed a
keepable SLO) and the lane's statistics before the end-of-run check."""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any

import psycopg
import pytest
from django.core.management.base import CommandError
from django.db import connection

from fleet.models import Host
from fleet.versions import version_sort_key
from opsplanner.models import SimulatorProfile
from opsplanner.services.simulator import host_spread_factor
from simulation.config import EPOCH, SimulationConfig
from simulation.engine import SimulationError, policy_run
from simulation.management.commands.simulate import Command
from simulation.measure import run_measure
from simulation.policies import Rollout
from simulation.rollout_measures import (
    cycles_missed_keepable,
    reach_shares,
    rollout_measures_add,
    rollout_summary,
)
from simulation.runner import (
    LANE_RANDOM_PAGE_COST,
    LANE_STATISTICS_TARGET,
    lane_analyze,
    lane_vacuum,
    scratch_databases,
    scratch_databases_drop,
)
from simulation.scenarios import SCENARIOS, scenario_config, upgrade_execute_seconds
from simulation.world import workload_draw
from tests.builders import make_component, make_fleet


def command_config(*args: str) -> SimulationConfig:
    command = Command()
    options = vars(command.create_parser("manage.py", "simulate").parse_args(list(args)))
    return command._config(options)


def test_the_meta_scenario_has_many_components_upgrades_every_day_a_duration_spread_and_slow_hosts() -> None:
    meta = scenario_config("meta", hosts=2000, pools=1)

    assert meta.errors() == {}
    assert meta.components > 50
    assert meta.upgrades_per_week / 7 >= 2  # several a day per pool
    assert meta.execute_spread > 0
    assert meta.host_spread > 0
    assert 0 < meta.slow_host_fraction < 1
    assert meta.slow_host_factor > 1
    assert scenario_config("default") == SimulationConfig()
    assert "Scenarios are default, meta" in scenario_config("nope").errors()["scenario"]


def test_the_command_line_scenario_fills_in_only_what_is_not_given_and_the_default_is_unchanged() -> None:
    assert command_config() == SimulationConfig()
    meta = command_config("--scenario", "meta", "--hosts", "300", "--components", "55", "--days", "2")

    assert (meta.scenario, meta.hosts, meta.components, meta.days) == ("meta", 300, 55, 2.0)
    assert meta.upgrades_per_week == SCENARIOS["meta"]["upgrades_per_week"]
    with pytest.raises(CommandError, match=r"^--scenario: one of default, meta; got 'huge'$"):
        command_config("--scenario", "huge")
    with pytest.raises(CommandError, match="at most 200 components"):
        command_config("--components", "500")


def test_each_upgrade_gets_its_own_execution_time_around_the_median_decided_by_the_seed() -> None:
    meta = scenario_config("meta")
    times = [upgrade_execute_seconds(meta, f"component-{n}", "1.1.0") for n in range(400)]

    assert times == [upgrade_execute_seconds(meta, f"component-{n}", "1.1.0") for n in range(400)]
    assert times != [upgrade_execute_seconds(meta.replace(seed=2), f"component-{n}", "1.1.0") for n in range(400)]
    median = meta.execute_minutes * 60
    assert 0.85 * median < statistics.median(times) < 1.15 * median
    assert sum(t > 2 * median for t in times) >= 20  # a tail of long-running upgrades
    assert upgrade_execute_seconds(SimulationConfig(), "bios", "1.1.0") == median  # no spread by default


def install(hours: float, host: int, version: str) -> tuple[dt.datetime, int, str]:
    return (EPOCH + dt.timedelta(hours=hours), host, version_sort_key(version))


def test_reach_counts_hosts_on_the_version_or_a_later_one_at_each_horizon_the_run_saw() -> None:
    config = SimulationConfig(days=5)
    rollout = Rollout(pool="p", component="bios", version="1.2.0", arrived=EPOCH + dt.timedelta(hours=10))
    installs = [
        install(0, 1, "1.0.0"),  # the start: every host on 1.0.0
        install(0, 2, "1.0.0"),
        install(0, 3, "1.0.0"),
        install(0, 4, "1.0.0"),
        install(20, 1, "1.2.0"),  # within 24 h
        install(50, 2, "1.2.0"),  # within 72 h
        install(60, 3, "1.3.0"),  # superseded: a later version counts
        install(70, 4, "1.1.0"),  # an older one does not
    ]

    assert reach_shares(config, rollout, installs, 4) == [0.25, 0.75, None]  # 7 days is past the run's end
    assert reach_shares(config.replace(days=30), rollout, installs, 4) == [0.25, 0.75, 0.75]


def cycle(number: int, started: float, ended: float | None, slo: float) -> list[float | int | None]:
    return [number, started, ended, started + slo]


def test_only_cycles_that_missed_an_slo_at_or_above_the_lower_bound_count_as_missed() -> None:
    config = SimulationConfig(hosts=400, pools=4, hosts_per_domain=20, days=10)  # 5 one-hour visits: bound 5 h
    pool = {
        "domains": 5,
        "cycles": [
            cycle(1, 0, 20, 24),  # kept
            cycle(2, 20, 50, 24),  # missed a keepable SLO
            cycle(3, 50, 60, 4),  # missed, but 4 h is below the bound: no schedule could keep it
            cycle(4, 60, None, 24),  # still open at the end (240 h), long past its deadline
        ],
    }

    assert cycles_missed_keepable(config, pool) == 2
    summary = rollout_summary(config, [pool, {"domains": 5, "cycles": [], "reach": [["b", "1", 0, 1.0, 1.0, None]]}])
    assert summary["cycles_missed_keepable"] == 2
    assert (summary["reach_24h_mean"], summary["reach_24h_complete"], summary["reach_7d_upgrades"]) == (1.0, 1, 0)
    assert rollout_summary(config, [{"domains": 5, "cycles": []}])["cycles_missed_keepable"] is None


@pytest.mark.django_db
def test_the_lane_analyze_refreshes_the_planners_statistics_and_refuses_a_live_database(monkeypatch) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fleet_component")  # statistics of the empty table: no rows
    for n in range(7):
        make_component(name=f"analyzed-{n}")

    lane_analyze()

    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'fleet_component'")
        assert cursor.fetchone()[0] == 7
    monkeypatch.setitem(connection.settings_dict, "NAME", "opsplanner")
    with pytest.raises(SimulationError, match="not a simulation scratch database"):
        lane_analyze()


def _host_table_stats() -> tuple[int, float]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # this transaction's cached statistics
        cursor.execute(
            "SELECT s.vacuum_count, c.reltuples FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.relname = 'fleet_host'"
        )
        vacuums, tuples = cursor.fetchone()
        return vacuums, tuples


@pytest.mark.django_db(transaction=True)
def test_the_lane_vacuum_reclaims_the_dead_rows_of_the_lanes_tables_where_autovacuum_is_off() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=6)
    for state in ["maintenance", "in_service", "maintenance", "in_service"]:  # dead row versions
        Host.objects.filter(pk__in=[h.pk for h in hosts]).update(state=state)
    vacuums_before, _ = _host_table_stats()

    lane_vacuum()

    vacuums_after, tuples = _host_table_stats()
    assert vacuums_after == vacuums_before + 1, "fleet_host was vacuumed"
    assert tuples == 6, "and analyzed: the planner knows its live rows"


def _maintenance_of(table: str) -> tuple[int, int]:
    """(vacuums, analyses) PostgreSQL counted of the table."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relname = %s", [table])
        vacuums, analyses = cursor.fetchone()
        return vacuums, analyses


@pytest.mark.django_db(transaction=True)
def test_the_lane_vacuum_can_leave_the_statistics_for_a_later_round() -> None:
    hosts_before, events_before = _maintenance_of("fleet_host"), _maintenance_of("opsplanner_event")

    lane_vacuum(analyze=False)

    hosts_after, events_after = _maintenance_of("fleet_host"), _maintenance_of("opsplanner_event")
    assert hosts_after == (hosts_before[0] + 1, hosts_before[1]), "vacuumed, not analyzed"
    assert events_after == (events_before[0] + 1, events_before[1])
    lane_vacuum()
    assert _maintenance_of("fleet_host") == (hosts_after[0] + 1, hosts_after[1] + 1)


@pytest.mark.django_db
def test_inside_a_transaction_where_postgresql_cannot_vacuum_the_lane_vacuum_still_analyzes() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fleet_component")
    for n in range(5):
        make_component(name=f"vacuumed-{n}")

    lane_vacuum()  # would raise "VACUUM cannot run inside a transaction block" if it tried

    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'fleet_component'")
        assert cursor.fetchone()[0] == 5


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_scratch_lane_is_unlogged_costs_index_probes_as_memory_and_keeps_few_statistics() -> None:
    (url,) = scratch_databases(1, tag="_tuned")
    try:
        with psycopg.connect(url, autocommit=True) as lane:
            logged = lane.execute(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND n.nspname = current_schema() AND c.relpersistence = 'p'"
            ).fetchone()
            settings = dict(
                lane.execute(
                    "SELECT name, setting FROM pg_settings "
                    "WHERE name IN ('random_page_cost', 'synchronous_commit', 'default_statistics_target')"
                ).fetchall()
            )
            targets = dict(
                lane.execute(
                    "SELECT a.attrelid::regclass::text || '.' || a.attname, a.attstattarget FROM pg_attribute a "
                    "WHERE a.attrelid IN ('opsplanner_event'::regclass, 'opsplanner_workitem'::regclass) "
                    "AND a.attnum > 0 AND NOT a.attisdropped"
                ).fetchall()
            )
    finally:
        scratch_databases_drop([url])
    assert logged == (0,), "no table of a lane writes the write-ahead log"
    assert settings == {
        "random_page_cost": str(LANE_RANDOM_PAGE_COST),
        "synchronous_commit": "off",
        "default_statistics_target": str(LANE_STATISTICS_TARGET),  # the daily ANALYZE samples a tenth
    }
    assert targets["opsplanner_event.data"] == targets["opsplanner_event.reason"] == 0
    assert targets["opsplanner_workitem.params"] == targets["opsplanner_workitem.result"] == 0
    # The columns the simulation filters on keep the default (-1 before PostgreSQL 17, NULL since).
    assert targets["opsplanner_workitem.state"] != 0
    assert targets["opsplanner_event.kind"] != 0


META_SMALL = scenario_config(
    "meta", hosts=160, pools=1, days=3, upgrades_at_start=3, optout_windows_per_week=0, host_failures_per_day=0
)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_small_meta_run_keeps_the_invariants_and_measures_how_far_each_upgrade_reached() -> None:
    log = policy_run(META_SMALL, workload_draw(META_SMALL), "trains")
    result = run_measure(META_SMALL, log)
    pools: dict[int, dict[str, Any]] = {pool.id: {"name": pool.name} for pool in log.world.pools}
    rollout_measures_add(META_SMALL, log, pools)

    assert result["violations"] == []
    assert host_spread_factor(1, 1, "drain") == 1.0  # the run's spread of host durations ended with it
    profile = SimulatorProfile.current()
    assert float(profile.slow_host_fraction) == META_SMALL.slow_host_fraction
    upgrade_times = {key: v["seconds"] for key, v in profile.execute_by_kind.items() if key.startswith("upgrade:")}
    assert len(upgrade_times) == len(workload_draw(META_SMALL).arrivals)
    assert len(set(upgrade_times.values())) > 1
    (reach,) = [pool["reach"] for pool in pools.values()]
    assert len(reach) == len(result["pools"][0]["rollouts"])
    for *_, day, three_days, week in reach:
        assert week is None  # the run is three days long
        assert day is None or 0 <= day <= 1
        assert three_days is None or (day is not None and day <= three_days <= 1)
    at_start = [row for row in reach if row[2] == 0]
    assert len(at_start) == 3
    assert all(row[4] == 1.0 for row in at_start)  # the backlog reached every host within 72 h
