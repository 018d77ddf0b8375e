"""What-if on the live fleet: `simulate --from-live` forecasts a live pool in scratch lanes and never
writes to the live database."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from fleet import services
from fleet.models import CapacityReservation, OptOutWindow, ServicePlacement
from opsplanner import clock
from simulation.config import SimulationConfig
from simulation.from_live import live_snapshot
from tests.builders import make_fleet, make_service


def live_pool() -> str:
    """A pool of 4 racks of 5 hosts with a train (24 h SLO) and one pending upgrade, jobs, an opt-out
    window and a reservation ahead."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, hosts = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name="live-a")
    job = make_service(name="live-job")
    ServicePlacement.objects.bulk_create([ServicePlacement(service=job, host=h) for h in hosts[:8]])
    now = clock.now()
    OptOutWindow.objects.create(
        service=job, starts_at=now + dt.timedelta(hours=2), ends_at=now + dt.timedelta(hours=4), reason="a demo"
    )
    CapacityReservation.objects.create(
        service=job, pool=pool, starts_at=now, ends_at=now + dt.timedelta(days=2), reason="launch",
        min_hosts_in_service=10,
    )  # fmt: skip
    train_create(pool=pool, name="train-live-a", cycle_slo_s=24 * 3600, visit_estimate_s=3600, actor="test")
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test")
    services.pool_create(name="live-empty", workload_class="ai_training", planned_buffer_hosts=1,
                         failure_buffer_hosts=1)  # fmt: skip
    return pool.name


def table_counts() -> dict[str, int]:
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
        counts = {}
        for table in tables:
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            counts[table] = cursor.fetchone()[0]
    return counts


def events_checksum() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY e.id), '')) FROM opsplanner_event e")
        return cursor.fetchone()[0]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the forecast creates scratch databases: no enclosing transaction
def test_a_forecast_from_the_live_pool_runs_every_policy_and_leaves_the_live_database_unchanged(tmp_path: Path) -> None:
    name = live_pool()
    counts, checksum = table_counts(), events_checksum()
    assert counts["opsplanner_event"] > 0  # there is something to disturb
    assert counts["trains_upgrade"] == 1

    call_command(
        "simulate", "--from-live", "--pool", name, "--days", "1", "--lanes", "1", "--json", "--out", str(tmp_path)
    )

    assert table_counts() == counts
    assert events_checksum() == checksum
    summary = json.loads((tmp_path / "summary.json").read_text())
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert set(runs) == {"trains", "trains-sliding", "rolling", "lockstep"}
    for policy, shards in runs.items():
        pools = [pool for shard in shards for pool in shard["pools"]]
        assert [p["name"] for p in pools] == [name], policy
        assert pools[0]["hosts"] == 20
        assert [r[:2] for r in pools[0]["rollouts"]] == [["bios", "2.16.0"]], policy
        if policy == "lockstep":
            # the live reservation keeps 10 of the 20 hosts in service for two days: the gang of 20
            # waits it out, from the forecast's first second (the reservation began just before it)
            assert pools[0]["drains"] == 0
            assert pools[0]["rollouts"][0][3:] == [None, "unfinished"]
        else:  # the pending upgrade (bios 2.16.0 on 20 hosts) is forecast to finish within the day
            assert pools[0]["rollouts"][0][3] is not None, policy
        assert shards[0]["violations"] == [], policy
        assert all(row[0] <= 24 for row in pools[0]["samples"]), policy  # the forecast stops after its day
    trains = next(p for shard in runs["trains"] for p in shard["pools"])
    assert trains["drains"] == 20  # one drain per host: the live train's one cycle
    assert summary["config"]["start_at"]  # time starts at the live now, not the simulator's epoch


@pytest.mark.django_db
def test_a_forecast_of_a_pool_that_does_not_exist_or_has_no_hosts_is_refused_in_one_line() -> None:
    live_pool()

    with pytest.raises(CommandError, match=r"^--from-live: there is no pool named 'nope'$"):
        call_command("simulate", "--from-live", "--pool", "nope")
    with pytest.raises(CommandError, match=r"^--from-live: pool 'live-empty' has no hosts to forecast$"):
        call_command("simulate", "--from-live", "--pool", "live-empty")
    with pytest.raises(CommandError, match="only with --from-live"):
        call_command("simulate", "--pool", "live-a")
    with pytest.raises(CommandError, match="new arrivals do not apply"):
        call_command("simulate", "--from-live", "--upgrades-per-week", "3")


@pytest.mark.django_db
def test_a_live_train_faster_than_the_simulated_hardware_allows_is_refused_naming_the_setting() -> None:
    from trains.services.trains import train_create

    pool, _ = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name="live-fast")
    train_create(pool=pool, name="train-live-fast", cycle_slo_s=1800, visit_estimate_s=450, actor="test")

    with pytest.raises(CommandError, match=r"^--from-live: pool live-fast: --cycle-slo-hours: .*cannot be met"):
        call_command("simulate", "--from-live", "--pool", "live-fast", "--days", "1")


@pytest.mark.django_db
def test_the_live_snapshot_holds_the_pools_hosts_versions_train_pending_upgrade_and_windows_ahead() -> None:
    name = live_pool()

    (snapshot,) = live_snapshot(name, clock.now())

    assert len(snapshot["hosts"]) == 20
    assert [d[0] for d in snapshot["domains"]] == ["rack-0001", "rack-0002", "rack-0003", "rack-0004"]
    assert snapshot["upgrades"] == [["bios", "2.16.0"]]
    assert snapshot["trains"][0]["cycle_slo_s"] == 24 * 3600
    assert snapshot["trains"][0]["domain_order"] == ["rack-0001", "rack-0002", "rack-0003", "rack-0004"]
    assert len(snapshot["installed"]) == 60  # three components on each host
    assert len(snapshot["placements"]) == 8
    assert len(snapshot["optouts"]) == 1
    assert len(snapshot["reservations"]) == 1
    assert snapshot["rules"]  # the compatibility rules travel with the catalogue
    assert [s["pool"]["name"] for s in live_snapshot(None, clock.now())] == [name]  # the empty pool is left out


def test_a_forecast_starts_at_the_live_now_and_ends_its_days_later() -> None:
    config = SimulationConfig(start_at="2026-11-24T02:51:00+00:00", days=3)

    assert config.start == dt.datetime(2026, 11, 24, 2, 51, tzinfo=dt.UTC)
    assert config.end == dt.datetime(2026, 11, 27, 2, 51, tzinfo=dt.UTC)
    assert config.errors() == {}
    assert "start at" in SimulationConfig(start_at="yesterday").errors()["start_at"]
    assert "start at" in SimulationConfig(start_at="2026-11-24T02:51:00").errors()["start_at"]  # no zone
