"""What-if on the live fleet: `simulate --from-live` forecasts a live pool in scratch lanes and never
writes to the live database."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from fleet import services
from fleet.models import (
    CapacityReservation,
    ComponentVersion,
    InstalledVersion,
    OptOutWindow,
    Pool,
    ServicePlacement,
)
from opsplanner import clock
from simulation import from_live, from_live_lane, runner
from simulation.config import Arrival, SimulationConfig
from simulation.from_live import live_config, live_snapshot, live_workload, snapshot_write
from simulation.management.commands.simulate import sigterm_exits
from simulation.policies import TrainsPolicy
from simulation.world import SimPool, World
from tests.builders import make_fleet, make_host, make_service
from trains.models import Upgrade, UpgradeState


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
    train_create(
        pool=pool, name="train-live-a", cycle_slo_s=24 * 3600, visit_estimate_s=3600, visit_overhead_s=900,
        priority=300, actor="test",
    )  # fmt: skip
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
    with pytest.raises(CommandError, match=r"^--work-dir: not with --from-live"):
        call_command("simulate", "--from-live", "--work-dir", "var/simulations/resume")
    with pytest.raises(CommandError, match=r"^--from-live: there is no pool named 'nope'$"):
        call_command("simulate", "--from-live", "--pool", " nope ")  # spaces around the name, as a form has them


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("option", "named"),
    [
        (["--hosts", "5"], "--hosts"),  # judged against the generated fleet, it named --hosts-per-domain
        (["--hosts-per-domain", "3", "--components", "4"], "--components, --hosts-per-domain"),
        (["--hosts", "9999"], "--hosts"),  # valid, and dropped without a word
    ],
)
def test_a_fleet_shape_option_with_from_live_is_refused_as_the_live_pools_to_say(option: list[str], named: str) -> None:
    live_pool()

    with pytest.raises(CommandError) as refused:
        call_command("simulate", "--from-live", "--pool", "live-a", *option)

    said = f"{named}: not with --from-live, which takes the pool's shape from the live pool"
    assert str(refused.value) == said


@pytest.mark.django_db
def test_the_cycle_slo_option_with_from_live_applies_to_a_pool_without_a_train(tmp_path: Path) -> None:
    pool, _ = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name="live-notrain")
    with pytest.raises(CommandError, match=r"^--from-live: there is no pool named 'nope'$"):  # not refused
        call_command("simulate", "--from-live", "--pool", "nope", "--cycle-slo-hours", "30")
    now = clock.now()
    (snapshot,) = live_snapshot(pool.name, now)

    config = live_config(SimulationConfig(cycle_slo_hours=30), snapshot, tmp_path / "live.json", now)

    assert config.cycle_slo_hours == 30  # a pool with a train takes its train's (live_config)


@pytest.mark.django_db
def test_a_live_train_faster_than_the_simulated_hardware_allows_is_refused_without_naming_an_option() -> None:
    from trains.services.trains import train_create

    pool, _ = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name="live-fast")
    train_create(pool=pool, name="train-live-fast", cycle_slo_s=1800, visit_estimate_s=450, actor="test")

    # The SLO is the live train's, not an option given: the message names no option.
    with pytest.raises(CommandError, match=r"^--from-live: pool live-fast: cycle slo hours: [^-]*cannot be met"):
        call_command("simulate", "--from-live", "--pool", "live-fast", "--days", "1")


@pytest.mark.django_db
def test_the_live_snapshot_holds_the_pools_hosts_versions_train_pending_upgrade_and_windows_ahead() -> None:
    name = live_pool()

    (snapshot,) = live_snapshot(name, clock.now())

    assert len(snapshot["hosts"]) == 20
    assert [d[0] for d in snapshot["domains"]] == ["rack-0001", "rack-0002", "rack-0003", "rack-0004"]
    assert [(u["component"], u["version"]) for u in snapshot["upgrades"]] == [("bios", "2.16.0")]
    assert snapshot["trains"][0]["cycle_slo_s"] == 24 * 3600
    assert (snapshot["trains"][0]["priority"], snapshot["trains"][0]["visit_overhead_s"]) == (300, 900)
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


def scoped_live_pool(name: str = "live-s") -> tuple[Pool, Upgrade]:
    """4 racks of 5 hosts with a train, and a pending upgrade of rack-0001 only with its own phases and
    failure policy, a priority, a deadline, a duration and a bounded number of hosts per visit."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name=name)
    train_create(pool=pool, name=f"train-{name}", cycle_slo_s=24 * 3600, visit_estimate_s=3600, actor="test")
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="firmware fix", scope=f"domain {name}/rack-0001",
        phases=[{"name": "canary", "percent": 40, "min_successes": 1, "soak_s": 600},
                {"name": "rest", "percent": 100, "selection": "any", "min_successes": 0}],
        max_failures=1, max_failure_rate=0.25, failure_rate_min_hosts=3, multi_cycle=True, hosts_per_visit=4,
        priority=40, deadline=clock.now() + dt.timedelta(days=3), duration_s=1200, actor="test",
    )  # fmt: skip
    return pool, upgrade


def one_pool_world(pool: Pool) -> World:
    hosts = list(pool.hosts.order_by("hostname").values_list("id", flat=True))
    return World(pools=[SimPool(id=pool.pk, name=pool.name, number=0, host_ids=hosts, domain_ids=[])])


POLICY_FIELDS = (
    "scope", "max_failures", "max_failure_rate", "failure_rate_min_hosts", "multi_cycle", "hosts_per_visit",
    "priority", "deadline", "duration_s",
)  # fmt: skip
PHASE_FIELDS = ("name", "domain_id", "percent", "min_successes", "soak_s", "selection")


@pytest.mark.django_db
def test_a_live_upgrade_arrives_in_the_lane_with_its_scope_phases_and_policy(tmp_path: Path) -> None:
    pool, live = scoped_live_pool()
    now = clock.now().replace(microsecond=0)
    (snapshot,) = live_snapshot(pool.name, now)
    snapshot_write(snapshot, tmp_path / "live.json")
    config = live_config(SimulationConfig(), snapshot, tmp_path / "live.json", now)
    (arrival,) = live_workload(config).arrivals
    Upgrade.objects.filter(pk=live.pk).update(state=UpgradeState.CANCELLED)  # make way for its copy

    TrainsPolicy(config, one_pool_world(pool)).arrive(arrival)

    copy = Upgrade.objects.get(state=UpgradeState.ACTIVE)
    assert [getattr(copy, f) for f in POLICY_FIELDS] == [getattr(live, f) for f in POLICY_FIELDS]
    phases = [[getattr(p, f) for f in PHASE_FIELDS] for p in copy.phases.order_by("position")]
    assert phases == [[getattr(p, f) for f in PHASE_FIELDS] for p in live.phases.order_by("position")]


@pytest.mark.django_db
def test_a_simulated_release_keeps_the_simulators_own_failure_policy_over_the_whole_pool() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=5, failure_buffer_hosts=1, pool_name="sim-like")
    config = SimulationConfig(hosts=10, pools=1, hosts_per_domain=5)

    TrainsPolicy(config, one_pool_world(pool)).arrive(
        Arrival(at=clock.now(), pool=0, component="bios", version="2.16.0")
    )

    upgrade = Upgrade.objects.get()
    assert upgrade.scope == f"pool {pool.name}"
    assert upgrade.max_failures == config.hosts_per_pool
    assert (upgrade.failure_rate_min_hosts, upgrade.duration_s, upgrade.phases.count()) == (50, None, 1)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the forecast creates scratch databases: no enclosing transaction
def test_a_forecast_of_an_upgrade_scoped_to_one_rack_drains_only_that_racks_hosts(tmp_path: Path) -> None:
    pool, _ = scoped_live_pool()
    in_scope = pool.hosts.filter(domain__name="rack-0001").count()

    call_command(
        "simulate", "--from-live", "--pool", pool.name, "--days", "1", "--lanes", "1", "--policies",
        "trains,rolling", "--json", "--out", str(tmp_path),
    )  # fmt: skip

    runs = json.loads((tmp_path / "runs.json").read_text())
    for policy in ("trains", "rolling"):
        (forecast,) = [p for shard in runs[policy] for p in shard["pools"]]
        assert forecast["drains"] == in_scope < forecast["hosts"], policy
        assert forecast["rollouts"][0][3] is not None, policy  # the rack is done within the day
        assert forecast["reach"][0][3] == 1.0, policy  # all of its own hosts (a quarter of the pool's)


def shards_that_fail(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: str) -> None:
    """Every shard a forecast starts prints a progress line and then `error`, and exits 3 (no scratch
    database is made: the shard never gets to use one)."""
    script = tmp_path / "failing-shard"
    script.write_text(f"#!/bin/sh\necho 'simulate[trains pools 0]: day 0' >&2\necho '{error}' >&2\nexit 3\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    monkeypatch.setattr(from_live, "scratch_databases", lambda lanes, tag="": [f"sqlite:///{tmp_path}/lane"] * lanes)
    monkeypatch.setattr(from_live, "scratch_databases_drop", lambda urls: None)


@pytest.mark.django_db
def test_a_forecast_whose_shard_fails_is_refused_in_one_line_that_says_why(monkeypatch, tmp_path: Path) -> None:
    name = live_pool()
    shards_that_fail(monkeypatch, tmp_path, "CommandError: the lane refused the upgrade")

    with pytest.raises(CommandError) as refused:
        call_command("simulate", "--from-live", "--pool", name, "--days", "1", "--policies", "trains")

    message = str(refused.value)
    assert message.startswith("--from-live: the trains shard (trains, pools 0) failed with exit 3")
    assert message.endswith(": CommandError: the lane refused the upgrade")
    assert "\n" not in message


def small_buffer_pool(name: str = "live-small") -> Pool:
    """One rack of 6 hosts whose planned buffer is 2 hosts (a third of the rack), a train and a pending
    upgrade: the shape of most demo pools."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=2, failure_buffer_hosts=1, pool_name=name)
    train_create(pool=pool, name=f"train-{name}", cycle_slo_s=24 * 3600, visit_estimate_s=3600, actor="test")
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test")
    return pool


@pytest.mark.django_db
def test_a_planned_buffer_smaller_than_a_domain_is_forecast_as_it_is_in_waves(tmp_path: Path) -> None:
    pool = small_buffer_pool()
    now = clock.now()
    (snapshot,) = live_snapshot(pool.name, now)

    config = live_config(SimulationConfig(), snapshot, tmp_path / "live.json", now)

    assert config.errors() == {}
    assert config.planned_buffer_hosts == pool.planned_buffer_hosts < config.hosts_per_domain
    whole_domain = config.replace(planned_buffer_size=None)  # what the forecast assumed before
    assert config.cycle_lower_bound_hours == 3 * whole_domain.cycle_lower_bound_hours  # 6 hosts, 2 at a time


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the forecast creates scratch databases: no enclosing transaction
def test_a_pool_with_a_planned_buffer_smaller_than_a_domain_is_forecast_through_its_pending_upgrade(
    tmp_path: Path,
) -> None:
    pool = small_buffer_pool()

    call_command(
        "simulate", "--from-live", "--days", "1", "--lanes", "1", "--policies", "trains", "--json",
        "--out", str(tmp_path),
    )  # fmt: skip

    (shard,) = json.loads((tmp_path / "runs.json").read_text())["trains"]
    (forecast,) = shard["pools"]
    assert forecast["name"] == pool.name
    assert forecast["drains"] == forecast["hosts"] == 6
    assert forecast["rollouts"][0][3] is not None  # done within the day
    assert shard["violations"] == []


@pytest.mark.django_db
def test_a_host_running_a_withdrawn_version_keeps_it_in_the_snapshot() -> None:
    from fleet.services.catalogue import component_version_withdraw

    pool, _ = make_fleet(domains=1, hosts_per_domain=3, failure_buffer_hosts=1, pool_name="live-w")
    bios = ComponentVersion.objects.get(component__name="bios", version="2.14.0")
    component_version_withdraw(version_id=bios.pk, reason="bricks the BMC", actor="test")
    assert InstalledVersion.objects.filter(version=bios).count() == 3  # still running it, live

    (snapshot,) = live_snapshot(pool.name, clock.now())

    versions = {(name, version): withdrawal for name, version, _, *withdrawal in snapshot["versions"]}
    assert {(c, v) for _, c, v in snapshot["installed"]} <= set(versions)  # every installed row has its version
    assert versions[("bios", "2.14.0")][0] is not None
    assert versions[("bios", "2.14.0")][1:] == ["bricks the BMC", "operator"]
    assert versions[("bios", "2.16.0")] == [None, "", ""]


@pytest.mark.django_db
def test_the_lane_writes_a_withdrawn_version_withdrawn_and_the_hosts_running_it() -> None:
    host = make_host(hostname="lane-w-1")
    withdrawn_at = clock.now().replace(microsecond=0)
    snapshot = {
        "components": [["fw-w", "fw-w", "lower_level", True, True]],
        "versions": [["fw-w", "1.0.0", None, withdrawn_at.isoformat(), "bricks the BMC", "operator"]],
        "installed": [["lane-w-1", "fw-w", "1.0.0"]],
    }

    from_live_lane._catalogue(snapshot, clock.now())
    from_live_lane._installed(snapshot, {"lane-w-1": host.pk}, clock.now())

    version = ComponentVersion.objects.get(component__name="fw-w")
    assert (version.withdrawn_at, version.withdrawn_reason, version.withdrawn_by) == (
        withdrawn_at,
        "bricks the BMC",
        "operator",
    )
    assert list(InstalledVersion.objects.filter(host=host).values_list("version_id", flat=True)) == [version.pk]


def test_two_forecasts_run_at_once_name_their_lanes_apart() -> None:
    command = [sys.executable, "manage.py", "shell", "-v0", "-c",
               "from simulation.from_live import live_run_tag; print(live_run_tag())"]  # fmt: skip
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    tags = [run.communicate(timeout=60)[0].strip() for run in runs]

    assert tags[0] != tags[1]
    assert all(re.fullmatch(from_live.LIVE_TAGS, tag) for tag in tags), tags


def lanes_made(*tags: str) -> list[str]:
    """An empty scratch database per tag, named as a run's first lane."""
    names = [f"{connection.settings_dict['NAME']}{tag}_0_sim" for tag in tags]
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'CREATE DATABASE "{name}"')
    return names


def databases() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database")
        return {name for (name,) in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)  # databases are created and dropped outside any transaction
def test_the_sweep_drops_the_lanes_of_a_killed_forecast_and_leaves_those_of_a_running_one() -> None:
    killed, running, advisor = lanes_made("_live999999991", "_live999999992", "_advisor999999993")
    try:
        with runner.lanes_claimed("_live999999992"):  # a forecast still running
            swept = runner.scratch_databases_swept(from_live.LIVE_TAGS)
            assert swept == [killed]
            assert {killed, running, advisor} & databases() == {running, advisor}
    finally:
        runner.scratch_databases_drop([f"postgresql:///{name}" for name in (killed, running, advisor)])


def test_sigterm_ends_a_run_through_its_cleanup_as_an_exit() -> None:
    before = signal.getsignal(signal.SIGTERM)
    cleanups: list[str] = []

    def a_run_sent_sigterm() -> None:
        with sigterm_exits():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)  # the signal ends this at once
            finally:
                cleanups.append("shards stopped, lanes dropped")

    with pytest.raises(SystemExit) as exited:
        a_run_sent_sigterm()

    assert cleanups == ["shards stopped, lanes dropped"]
    assert exited.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.django_db
def test_a_live_train_whose_slo_its_onboarded_racks_no_longer_meet_is_forecast_as_it_is() -> None:
    from simulation.from_live import _trains_snapshot
    from trains.models import Train
    from trains.services.cycles import _stops_complete
    from trains.services.trains import train_create

    pool, _ = make_fleet(domains=4, hosts_per_domain=5, failure_buffer_hosts=1, pool_name="live-grown")
    train = train_create(pool=pool, name="train-grown", cycle_slo_s=24 * 3600, visit_estimate_s=6 * 3600, actor="t")
    rack = services.domain_create(pool=pool, name="rack-0005", position=5)
    for _ in range(5):
        make_host(rack)
    assert _stops_complete(train) == ["rack-0005"]  # the fleet added a stop: 5 x 6 h no longer fit 24 h
    (spec,) = _trains_snapshot(pool)["trains"]
    Train.objects.filter(pk=train.pk).delete()  # make way for its copy
    world = one_pool_world(pool)
    world.trains[pool.pk] = [spec]

    TrainsPolicy(SimulationConfig(hosts=25, pools=1, hosts_per_domain=5), world).setup()

    copy = Train.objects.get()
    assert (copy.cycle_slo_s, copy.visit_estimate_s) == (24 * 3600, 6 * 3600)
    assert list(copy.stops.order_by("position").values_list("domain__name", flat=True)) == spec["domain_order"]
    assert len(spec["domain_order"]) == 5


@pytest.mark.django_db
def test_a_live_pools_failure_buffer_in_hosts_is_the_floor_its_forecast_is_measured_against(tmp_path: Path) -> None:
    from simulation.measure import _pool_base

    pool, _ = make_fleet(domains=1, hosts_per_domain=47, planned_buffer_hosts=10, failure_buffer_hosts=3)
    now = clock.now()
    (snapshot,) = live_snapshot(pool.name, now)

    config = live_config(SimulationConfig(), snapshot, tmp_path / "live.json", now)

    assert config.failure_buffer_hosts == 3  # 47 x (3 / 47) came out as 2.999...: 2
    assert _pool_base(config, pool.name)["floor"] == 47 - 10 - 3
