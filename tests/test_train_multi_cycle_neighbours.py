"""A multi-cycle release and its neighbours: the older releases it supersedes take the hosts it
leaves each visit, a host that keeps failing it does not take its one place each visit, and the
forecast counts the hosts a running visit's newer release takes for the older ones."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Component, Host, InstalledVersion, Pool
from opsplanner import clock
from opsplanner.adapters import Adapter
from opsplanner.models import Event, WorkKind
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.builders import make_fleet, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import cycle_ended, make_train
from trains.models import UpgradeState, Visit, VisitState
from trains.selectors_forecast import upgrades_forecasts
from trains.services.tick import train_tick, trains_tick
from trains.services.upgrade_forecast import upgrades_forecast_check
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def hosts_on(pool: Pool, component: str, version: str) -> int:
    return InstalledVersion.objects.filter(host__pool=pool, component__name=component, version__version=version).count()


def fleet_with_bios_2_17(**fleet: int) -> tuple[Pool, list[Host]]:
    """make_fleet's pool and hosts (sized by `fleet`), its catalogue also with bios 2.17.0."""
    instant_simulator()
    pool, hosts = make_fleet(**fleet)
    make_version(Component.objects.get(name="bios"), "2.17.0")
    return pool, hosts


def test_an_older_release_takes_the_hosts_a_multi_cycle_release_leaves_each_visit() -> None:
    pool, _ = fleet_with_bios_2_17(domains=1, hosts_per_domain=4)
    train = make_train(pool)
    fix = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="security fix")
    upgrade_create(
        pool=pool, component="bios", version="2.17.0", reason="slow flash", multi_cycle=True, hosts_per_visit=1
    )

    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    # One host got 2.17.0, the three it left got the fix in the same visit: none runs neither.
    assert (hosts_on(pool, "bios", "2.17.0"), hosts_on(pool, "bios", "2.16.0")) == (1, 3)
    plan = Visit.objects.get(train=train, cycle__number=1).plan
    newer = next(entry for entry in plan["upgrades"] if entry["target"] == "bios 2.17.0")
    assert (newer["hosts"], newer["supersedes"]) == (1, {str(fix.pk): 1})
    fix.refresh_from_db()
    assert fix.state == UpgradeState.COMPLETED


def bad_host_fails_the_driver(bad: Host) -> None:
    """Host `bad` cannot take driver 560.35.03: its install fails every time; its other work items
    (drain, repair, checks) go as the simulator's would."""
    for item in work_items_claim(worker="bad", adapter=Adapter.SIMULATED, kinds=[WorkKind.EXECUTE], host_id=bad.pk):
        params = item.params or {}
        if params.get("component") == "gpu-driver" and params.get("version") == "560.35.03":
            work_item_report(item_id=item.pk, worker="bad", key=f"b{item.pk}", outcome="failed", reason="quirk")
            continue
        versions = {params["component"]: params["version"]} if params.get("component") else {}
        versions.update(params.get("restore") or {})
        result = {"versions": versions}
        work_item_report(item_id=item.pk, worker="bad", key=f"b{item.pk}", outcome="done", result=result)


def test_a_multi_cycle_upgrade_gives_its_place_to_hosts_that_have_not_failed_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, failure_buffer_hosts=2)
    bad = min(hosts, key=lambda h: h.pk)  # the first by id: the one each visit took first
    train = make_train(pool)
    upgrade = upgrade_create(  # max_failures defaults to 2: one bad host is within the policy
        pool=pool, component="gpu-driver", version="560.35.03", reason="slow flash", multi_cycle=True, hosts_per_visit=1
    )

    for _ in range(600):
        trains_tick()
        pool_tick(pool_id=pool.pk)
        bad_host_fails_the_driver(bad)
        simulated_work_step()
        assert not check_invariants()
        if cycle_ended(train, 4):
            break

    assert cycle_ended(train, 4)
    taken = [v.plan.get("hosts", []) for v in Visit.objects.filter(train=train).order_by("cycle__number")]
    assert taken[:4] == [[bad.pk], *([h.pk] for h in sorted(hosts, key=lambda h: h.pk)[1:])]
    assert hosts_on(pool, "gpu-driver", "560.35.03") == 3  # every good host in four cycles
    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.ACTIVE  # the bad host keeps it open: not offboarded, not done


def test_an_older_release_superseded_in_the_running_visit_is_forecast_in_that_cycle() -> None:
    pool, _ = fleet_with_bios_2_17(domains=2, hosts_per_domain=3)
    train = make_train(pool)
    old = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="fix")
    new = upgrade_create(pool=pool, component="bios", version="2.17.0", reason="newer")
    train_tick(train_id=train.pk)  # the first visit: 2.17.0 on its 3 hosts, superseding 2.16.0 there
    assert Visit.objects.filter(train=train, state=VisitState.RUNNING).count() == 1

    forecasts = upgrades_forecasts([old, new])
    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    old.refresh_from_db()
    new.refresh_from_db()
    assert (old.state, new.state) == (UpgradeState.COMPLETED, UpgradeState.COMPLETED)
    assert forecasts[old.pk].cycle == forecasts[new.pk].cycle == 1


def test_no_deadline_alert_for_an_older_release_superseded_in_the_running_visit() -> None:
    pool, _ = fleet_with_bios_2_17(domains=2, hosts_per_domain=3)
    train = make_train(pool, visit_estimate_s=3600)
    # Cycle 1 (two visits of about an hour) ends within 3 h; cycle 2 would end hours later.
    deadline = clock.now() + dt.timedelta(hours=3)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="fix", deadline=deadline)
    upgrade_create(pool=pool, component="bios", version="2.17.0", reason="newer")
    assert not Event.objects.filter(kind="alert.upgrade_deadline_at_risk").exists()
    train_tick(train_id=train.pk)  # the first visit: 2.17.0 on its 3 hosts, superseding 2.16.0 there

    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())  # as a visit start or an upgrade_create asks

    assert not Event.objects.filter(kind="alert.upgrade_deadline_at_risk").exists()


def test_a_newer_release_narrowed_by_the_budget_supersedes_the_older_only_where_it_goes() -> None:
    pool, hosts = fleet_with_bios_2_17(domains=1, hosts_per_domain=3, planned_buffer_hosts=3)
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600)
    # A long driver upgrade on one host, first in line: that host has no room for bios this visit.
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver",
        scope=f"hosts: {hosts[0].hostname}", priority=300, duration_s=2400,
    )  # fmt: skip
    old = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="fix", duration_s=900)
    new = upgrade_create(pool=pool, component="bios", version="2.17.0", reason="newer", duration_s=900)

    train_tick(train_id=train.pk)
    plan = Visit.objects.get(train=train, state=VisitState.RUNNING).plan
    forecasts = upgrades_forecasts([old, new])
    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    entry = next(e for e in plan["upgrades"] if e["upgrade"] == new.pk)
    assert (entry["hosts"], entry["supersedes"]) == (2, {str(old.pk): 2})  # not the busy host's
    old.refresh_from_db()
    assert old.state == UpgradeState.ACTIVE  # the busy host runs neither after cycle 1
    assert forecasts[old.pk].cycle == 2  # and the forecast did not count it reached in cycle 1
