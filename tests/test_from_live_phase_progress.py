"""What-if on the live fleet: a pending upgrade's phase in force goes on in the forecast from where it
stands live. The lane copied the phases still to go through but not their progress, and counted the
evidence again from zero from tasks it does not have: a canary that had passed live held in the lane
(its hosts already run the target, none can show it again) and the forecast said the upgrade never
finishes; a phase soaking live soaked again from its first lane success. The forecasts run in this
process (tests/from_live_helpers.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from fleet.models import ComponentVersion, Host, Pool
from fleet.services import installed_version_set
from opsplanner import clock
from opsplanner.models import Event
from simulation.config import SimulationConfig
from simulation.from_live import live_config, live_snapshot, live_workload, snapshot_write
from simulation.policies import TrainsPolicy
from simulation.world import SimPool, World
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.from_live_helpers import forecast, policy
from trains.models import Upgrade, UpgradePhase, UpgradeState
from trains.services.upgrades import upgrade_phase_successes

pytestmark = pytest.mark.django_db

HOUR = 3600


def live_rollout(
    canary: dict[str, Any], *, drive_until_successes: int | None = None, **policy: Any
) -> tuple[Pool, Upgrade]:
    """3 racks of 2 hosts, a train (24 h SLO), bios 2.16.0 rolled out with `canary` (on rack-0001)
    then the rest (with the failure `policy` given); driven live (the real tick and the simulated
    adapters) until the canary has that many successes, and no further."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=1, pool_name="live-p")
    train_create(pool=pool, name="train-live-p", cycle_slo_s=24 * HOUR, visit_estimate_s=HOUR, actor="test")
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test",
        phases=[{"name": "canary", "domain": "rack-0001", **canary},
                {"name": "rest", "percent": 100, "min_successes": 0}],
        **policy,
    )  # fmt: skip
    if drive_until_successes is not None:
        drive_trains(pool, until=lambda: upgrade_phase_successes(upgrade, 0) >= drive_until_successes)
    upgrade.refresh_from_db()
    return pool, upgrade


def canary_of(upgrade: Upgrade) -> UpgradePhase:
    return UpgradePhase.objects.get(upgrade=upgrade, position=0)


def passed_canary(*, soaked_for_s: int, soak_s: int = 2 * HOUR) -> tuple[Pool, Upgrade]:
    """A fixed canary on rack-0001 whose two hosts succeeded live (they run the target) and that has
    soaked `soaked_for_s` of its `soak_s`; the rollout is still in it live."""
    pool, upgrade = live_rollout({"min_successes": 2, "soak_s": soak_s}, drive_until_successes=2)
    reached = clock.now().replace(microsecond=0) - dt.timedelta(seconds=soaked_for_s)
    UpgradePhase.objects.filter(pk=canary_of(upgrade).pk).update(successes_reached_at=reached)
    assert (upgrade.state, upgrade.current_phase) == (UpgradeState.ACTIVE, 0)
    assert pool.hosts.filter(installed_versions__version__version="2.16.0").count() == 2  # rack-0001's
    return pool, upgrade


def lane_arrivals(pool: Pool, tmp_path: Path, *, older: bool = False) -> list[Any]:
    """The live upgrades as the lane receives them, from the snapshot written and read back (`older`:
    as a snapshot taken before the phases' progress was)."""
    now = clock.now().replace(microsecond=0)
    (snapshot,) = live_snapshot(pool.name, now)
    if older:
        snapshot["upgrades"] = [{k: v for k, v in u.items() if k != "phase_progress"} for u in snapshot["upgrades"]]
    snapshot_write(snapshot, tmp_path / "live.json")
    return live_workload(live_config(SimulationConfig(), snapshot, tmp_path / "live.json", now)).arrivals


def one_pool_world(pool: Pool) -> World:
    hosts = list(pool.hosts.order_by("hostname").values_list("id", flat=True))
    return World(pools=[SimPool(id=pool.pk, name=pool.name, number=0, host_ids=hosts, domain_ids=[])])


def lane_copy(pool: Pool, live: Upgrade, arrival: Any) -> tuple[Upgrade, TrainsPolicy]:
    """The lane's copy of a live upgrade (the live one cancelled to make way for it)."""
    Upgrade.objects.filter(pk=live.pk).update(state=UpgradeState.CANCELLED)
    trains = TrainsPolicy(SimulationConfig(hosts=6, pools=1, hosts_per_domain=2), one_pool_world(pool))
    trains.arrive(arrival)
    return Upgrade.objects.get(state=UpgradeState.ACTIVE), trains


def test_it_forecasts_a_fixed_canary_that_already_passed_live_as_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = passed_canary(soaked_for_s=3 * HOUR)  # evidence in, soak over: the live tick moves on next

    result = forecast(monkeypatch, pool)

    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] == 1.0  # the lane held the canary: rack-0001's 2 of 6 hosts, never more
    assert upgrade["full_rollout_hours"] is not None
    lane = Upgrade.objects.get()  # the lane's copy, at the forecast's end
    assert list(lane.phases.values_list("name", flat=True)) == ["rest"]  # it started where live is next
    assert not Event.objects.filter(kind="alert.upgrade_phase_held").exists()


def test_it_carries_the_remaining_soak_of_the_phase_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, live = passed_canary(soaked_for_s=4 * HOUR, soak_s=10 * HOUR)  # 6 h of soak still to go
    reached = canary_of(live).successes_reached_at
    assert reached is not None
    soak_ends = reached + dt.timedelta(hours=10)

    result = forecast(monkeypatch, pool)

    start = dt.datetime.fromisoformat(result["start_at"])
    lane = Upgrade.objects.get()
    canary = canary_of(lane)
    assert canary.graduated_at is not None  # it held in the lane, waiting for evidence it had
    assert canary.successes_reached_at == reached  # the soak runs from live's
    # When the live soak ends (on the lane's 5-minute grid), not a whole soak after the lane's start.
    assert soak_ends <= canary.graduated_at <= soak_ends + dt.timedelta(minutes=5)
    assert canary.graduated_at - start < dt.timedelta(hours=6, minutes=5)
    (graduated,) = Event.objects.filter(kind="upgrade.phase_graduated", subject_id=lane.pk)
    assert graduated.data["carried"] is True
    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] == 1.0


def test_it_needs_only_the_evidence_the_phase_still_lacks_and_keeps_the_hosts_it_picked(tmp_path: Path) -> None:
    # An 'any' canary asking 3 successes of a rack of 2 picks a host of the next rack live; its rack's
    # two hosts succeeded, the picked one not yet.
    pool, live = live_rollout({"min_successes": 3, "selection": "any"}, drive_until_successes=2)
    picked = canary_of(live).picked_hosts
    assert len(picked) == 1
    assert upgrade_phase_successes(live, 0) == 2
    (picked_name,) = Host.objects.filter(pk__in=picked).values_list("hostname", flat=True)

    (snapshot,) = live_snapshot(pool.name, clock.now())
    (arrival,) = lane_arrivals(pool, tmp_path)
    lane, _ = lane_copy(pool, live, arrival)

    canary = canary_of(lane)
    assert (canary.name, canary.min_successes, canary.selection) == ("canary", 1, "any")  # 3 less the 2 it has
    assert canary.picked_hosts == picked  # live's pick, by name: the lane does not pick another
    assert snapshot["upgrades"][0]["phase_progress"] == {
        "successes": 2, "evidence_needed": 3, "successes_reached_at": None, "picked_hosts": [picked_name],
        "domain_in_scope": True, "held_reason": "", "failed_hosts": [], "rate_succeeded_hosts": [], "failures": 0,
        "rate_successes": 0, "breach": "",
    }  # fmt: skip


def test_it_reads_a_snapshot_without_phase_progress_as_before(tmp_path: Path) -> None:
    pool, live = passed_canary(soaked_for_s=4 * HOUR, soak_s=10 * HOUR)
    live_phases = [
        {"name": p.name, "domain": p.domain.name if p.domain else "", "percent": p.percent,
         "min_successes": p.min_successes, "soak_s": p.soak_s, "selection": p.selection}
        for p in live.phases.order_by("position")
    ]  # fmt: skip

    (older,) = lane_arrivals(pool, tmp_path, older=True)
    (newer,) = lane_arrivals(pool, tmp_path)

    assert older.carried is None
    assert older.upgrade["phases"] == live_phases  # as the lane read it before: the evidence from zero
    assert newer.upgrade["phases"][0] == {**live_phases[0], "min_successes": 1}
    assert newer.carried is not None
    assert newer.carried.soak_ends_at is not None
    lane, trains = lane_copy(pool, live, older)
    assert canary_of(lane).successes_reached_at is None
    assert trains.soaking == {}


def test_a_phase_that_had_its_evidence_but_no_soak_yet_soaks_from_the_forecasts_start(tmp_path: Path) -> None:
    # As after a re-onboarding (the phase starts over: its soak from the next tick) or a tick yet to look.
    pool, live = passed_canary(soaked_for_s=0, soak_s=HOUR)
    UpgradePhase.objects.filter(pk=canary_of(live).pk).update(successes_reached_at=None)

    (arrival,) = lane_arrivals(pool, tmp_path)

    assert arrival.carried.soak_ends_at == arrival.at + dt.timedelta(hours=1)
    assert arrival.carried.successes_reached_at == arrival.at
    assert [p["name"] for p in arrival.upgrade["phases"]] == ["canary", "rest"]


def test_a_fixed_canary_held_live_for_want_of_hosts_is_held_in_the_forecast_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # rack-0001 already ran the target when the upgrade came: no success to show, live or in the lane.
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, hosts = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=1, pool_name="live-h")

    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    for host in hosts[:2]:
        installed_version_set(host=host, version=bios)
    train_create(pool=pool, name="train-live-h", cycle_slo_s=24 * HOUR, visit_estimate_s=HOUR, actor="test")
    upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test",
        phases=[{"name": "canary", "domain": "rack-0001"}, {"name": "rest", "percent": 100, "min_successes": 0}],
    )  # fmt: skip

    result = forecast(monkeypatch, pool)

    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] < 1.0  # nobody approves a skip in the lane
    assert canary_of(Upgrade.objects.get()).held_code == "too_few_hosts"


SELECTED = "hosts running bios below 2.16.0 in pool live-p"  # a scope that drops hosts as they reach it


def selected_rollout(canary: dict[str, Any]) -> tuple[Pool, Upgrade]:
    """live_rollout's pool and upgrade with a scope that selects the hosts still below the target."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=1, pool_name="live-p")
    train_create(pool=pool, name="train-live-p", cycle_slo_s=24 * HOUR, visit_estimate_s=HOUR, actor="test")
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test", scope=SELECTED,
        phases=[{"name": "canary", "domain": "rack-0001", **canary},
                {"name": "rest", "percent": 100, "min_successes": 0}],
    )  # fmt: skip
    return pool, upgrade


def test_a_soaking_canary_whose_hosts_all_left_a_selecting_scope_widens_at_once_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lane creates the upgrade again, and upgrade_create refuses a domain phase with no host in
    # scope: the whole what-if failed ("Phase canary: domain rack-0001 has no host in scope").
    pool, upgrade = selected_rollout({"min_successes": 2, "soak_s": 10 * HOUR})
    drive_trains(pool, until=lambda: upgrade_phase_successes(upgrade, 0) >= 2)
    assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 0  # soaking live

    result = forecast(monkeypatch, pool)

    (row,) = policy(result, "trains")["upgrades"]
    assert row["reach_24h"] == 1.0  # the four hosts left, within the day
    (note,) = [note for note in result["notes"] if note.startswith("upgrade ")]  # also: the train's open cycle
    assert note.startswith("upgrade bios 2.16.0: phase canary has no host left in its scope and has its evidence")


def test_a_canary_without_its_evidence_whose_hosts_left_a_selecting_scope_is_left_out_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, _ = selected_rollout({"min_successes": 2, "soak_s": HOUR})
    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    for host in Host.objects.filter(pool=pool, domain__name="rack-0001"):
        installed_version_set(host=host, version=bios)  # by hand: no success of the canary's own

    result = forecast(monkeypatch, pool)

    assert policy(result, "trains")["upgrades"] == []
    (note,) = result["notes"]
    assert "lacks its evidence: it holds on the live fleet until an operator acts; left out here" in note


def test_a_canary_held_live_for_its_escalated_hosts_is_named_in_the_forecasts_notes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lane plays every host in service: it may widen a phase the live fleet holds until an
    # operator acts, and the forecast said nothing of the hold.
    from fleet.models import HostState
    from trains.services.tick import train_tick

    pool, upgrade = live_rollout({"min_successes": 2})
    Host.objects.filter(pool=pool, domain__name="rack-0001").update(state=HostState.ESCALATED)
    train_tick(train_id=pool.trains.get().pk)
    assert canary_of(upgrade).held_code == "too_few_hosts"

    result = forecast(monkeypatch, pool)

    (note,) = [note for note in result["notes"] if note.startswith("upgrade ")]
    assert note.startswith("upgrade bios 2.16.0: phase canary holds on the live fleet (phase canary cannot show")
    assert "the forecast judges the hold anew with every host in service" in note
