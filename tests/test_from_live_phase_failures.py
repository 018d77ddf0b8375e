"""What-if on the live fleet: the failures counted against a pending upgrade in its phase in force go
on counting in the forecast. The lane carried the phase's successes but not its failures (the tasks
that showed them live are not copied): an upgrade one failure from being offboarded live was
forecast as if it had none, and the forecast promised a rollout the live fleet may well stop. The
forecasts run in this process (tests/from_live_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import ComponentVersion, Host, Pool
from fleet.models.hosts import RETIRED
from fleet.services import installed_version_set
from opsplanner import clock
from opsplanner.events import event_record
from opsplanner.models import Event, HostTask, TaskState
from opsplanner.models.operations import FailureCode
from simulation.config import SimulationConfig
from simulation.from_live import live_config, live_snapshot, live_workload, snapshot_write
from tests.driving import drive_trains, instant_simulator
from tests.from_live_helpers import forecast
from tests.test_from_live_phase_progress import canary_of, lane_copy, live_rollout
from trains.models import Upgrade, UpgradeState
from trains.services.phase_hosts import live_hosts_carried
from trains.services.upgrade_policy import train_upgrades
from trains.services.upgrades import upgrade_phase_failures, upgrade_phase_successes, upgrades_rate_successes

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def as_in_a_lane() -> Iterator[None]:
    """The lane's counts carry its live copies' hosts, as the simulator runs a what-if lane
    (simulation/engine.py); phases that carry none count as on the live fleet."""
    with live_hosts_carried():
        yield


def canary_with_a_failed_host(*, selection: str = "any", **policy: Any) -> tuple[Pool, Upgrade]:
    """An 'any' canary asking 2 successes of rack-0001's 2 hosts, both of which took the target live;
    one of them failed after all (its task failed, the version stayed: the lane has no reason to take
    it again). 1 success, 1 failure: the canary picks one host of the pool for the success it lacks."""
    pool, upgrade = live_rollout({"min_successes": 2, "selection": selection}, drive_until_successes=2, **policy)
    task = HostTask.objects.filter(operation__visit_link__upgrade=upgrade, state=TaskState.DONE).order_by("id")[0]
    HostTask.objects.filter(pk=task.pk).update(
        state=TaskState.FAILED, failure_code=FailureCode.EXECUTE_FAILED, failure_reason="install failed"
    )
    event_record(
        kind="task.state_changed", subject=task, actor="test", reason="install failed", pool_id=pool.pk,
        data={"from": TaskState.DONE, "to": TaskState.FAILED},
    )  # fmt: skip
    assert (upgrade_phase_successes(upgrade, 0), upgrade_phase_failures(upgrade, canary_of(upgrade))) == (1, 1)
    return pool, upgrade


def canary_with_a_host_to_retry(**policy: Any) -> tuple[Pool, Upgrade, Host]:
    """A fixed canary on rack-0001 (2 successes asked) whose one host succeeded live and whose other
    failed live and runs the old version again (as after a repair): the lane's canary takes it again,
    and only it (the other runs the target)."""
    pool, upgrade = canary_with_a_failed_host(selection="fixed", **policy)
    failed = HostTask.objects.get(operation__visit_link__upgrade=upgrade, state=TaskState.FAILED).host
    old = ComponentVersion.objects.get(component__name="bios", version="2.14.0")
    installed_version_set(host=failed, version=old)
    return pool, upgrade, failed


def lane_tasks_of(lane: Upgrade, host: Host) -> list[str]:
    return list(HostTask.objects.filter(operation__visit_link__upgrade=lane, host=host).values_list("state", flat=True))


def lane_of(pool: Pool, live: Upgrade, tmp_path: Path, *, strip: tuple[str, ...] = ()) -> tuple[Upgrade, Any]:
    """The lane's copy of the live upgrade, from the snapshot written and read back (without the
    phase progress's keys `strip`, as a snapshot taken before they were), and its arrival."""
    now = clock.now().replace(microsecond=0)
    (snapshot,) = live_snapshot(pool.name, now)
    for key in strip:
        del snapshot["upgrades"][0]["phase_progress"][key]
    snapshot_write(snapshot, tmp_path / "live.json")
    (arrival,) = live_workload(live_config(SimulationConfig(), snapshot, tmp_path / "live.json", now)).arrivals
    lane, _ = lane_copy(pool, live, arrival)
    return lane, arrival


def lane_failures_until_offboarded(pool: Pool, lane: Upgrade, *, rounds: int = 30) -> int:
    """Drive the lane's train with every install failing until it offboards the upgrade (or for
    `rounds`); how many of its tasks failed."""
    instant_simulator(execute_failure_rate=1)
    driven: list[int] = []

    def settled() -> bool:
        driven.append(1)
        return Upgrade.objects.get(pk=lane.pk).state != UpgradeState.ACTIVE or len(driven) >= rounds

    drive_trains(pool, until=settled, max_rounds=rounds)
    return HostTask.objects.filter(operation__visit_link__upgrade=lane, state=TaskState.FAILED).count()


def test_an_upgrade_one_failure_from_its_limit_live_is_offboarded_at_its_first_failure_in_the_lane(
    tmp_path: Path,
) -> None:
    pool, live = canary_with_a_failed_host(max_failures=1)
    lane, _ = lane_of(pool, live, tmp_path)

    assert lane_failures_until_offboarded(pool, lane) == 1
    lane.refresh_from_db()
    assert lane.state == UpgradeState.OFFBOARDED  # it waited for two, as if the live failure had not happened
    (offboarded,) = Event.objects.filter(kind="upgrade.offboarded", subject_id=lane.pk)
    assert offboarded.reason == "2 hosts failed in phase canary, more than the 1 its policy allows"


def test_the_failure_rate_counts_the_hosts_the_live_phase_finished(tmp_path: Path) -> None:
    # 1 failure of 2 finished live: under the 3 hosts the rate needs. One more failure makes 2 of 3.
    pool, live = canary_with_a_failed_host(max_failures=10, max_failure_rate=0.5, failure_rate_min_hosts=3)
    lane, _ = lane_of(pool, live, tmp_path)

    assert lane_failures_until_offboarded(pool, lane) == 1  # it waited for three, counting from nothing
    (offboarded,) = Event.objects.filter(kind="upgrade.offboarded", subject_id=lane.pk)
    assert offboarded.reason.startswith("2 of 3 hosts failed in phase canary (67%)")


def test_an_upgrade_over_its_limit_live_is_offboarded_at_the_forecasts_first_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The live tick offboards it at its next look; it has not looked yet.
    pool, _ = canary_with_a_failed_host(max_failures=0)

    result = forecast(monkeypatch, pool)

    lane = Upgrade.objects.get()
    assert lane.state == UpgradeState.OFFBOARDED
    assert not HostTask.objects.filter(operation__visit_link__upgrade=lane).exists()  # no task of it was tried
    notes = [note for note in result["notes"] if note.startswith("upgrade ")]
    assert notes == [
        "upgrade bios 2.16.0: 1 hosts failed in phase canary, more than the 0 its policy allows on the live fleet: "
        "its tick offboards it at its next look, the forecast at its first"
    ]


def test_the_lanes_tick_counts_the_carried_failures_and_a_later_phase_counts_from_zero(tmp_path: Path) -> None:
    pool, live = canary_with_a_failed_host(max_failures=1, max_failure_rate=0.5)
    (snapshot,) = live_snapshot(pool.name, clock.now())
    progress = snapshot["upgrades"][0]["phase_progress"]
    assert (progress["failures"], progress["rate_successes"], progress["breach"]) == (1, 1, "")

    lane, _ = lane_of(pool, live, tmp_path)

    assert train_upgrades(pool.trains.get()).failures == {lane.pk: 1}
    assert not lane.phases.get(position=1).carried_hosts.exists()
    carried = canary_of(lane).carried_hosts.order_by("failed")
    hosts = dict(Host.objects.filter(pool=pool).values_list("id", "hostname"))
    assert [(hosts[c.host_id], c.failed) for c in carried] == [
        (*progress["rate_succeeded_hosts"], False),
        (*progress["failed_hosts"], True),
    ]


def test_a_snapshot_without_the_failures_reads_as_none_carried(tmp_path: Path) -> None:
    pool, live = canary_with_a_failed_host(max_failures=1)

    lane, arrival = lane_of(
        pool, live, tmp_path, strip=("failed_hosts", "rate_succeeded_hosts", "failures", "rate_successes", "breach")
    )

    assert (arrival.carried.failed_hosts, arrival.carried.rate_succeeded_hosts) == ((), ())
    assert (canary_of(lane).carries_live_hosts, canary_of(lane).carried_hosts.exists()) == (False, False)
    assert train_upgrades(pool.trains.get()).failures == {lane.pk: 0}


def test_a_host_that_failed_live_and_fails_again_in_the_lane_counts_once(tmp_path: Path) -> None:
    # The policy allows 1 host to fail: the live one. Counted per phase, the retry made it 2 and the
    # lane offboarded an upgrade the live tick keeps (it counts a host once however often it failed).
    pool, live, retried = canary_with_a_host_to_retry(max_failures=1)
    lane, _ = lane_of(pool, live, tmp_path)

    lane_failures_until_offboarded(pool, lane, rounds=12)

    assert TaskState.FAILED in lane_tasks_of(lane, retried)  # the lane took it again, and it failed
    assert upgrade_phase_failures(lane, canary_of(lane)) == 1
    assert Upgrade.objects.get(pk=lane.pk).state == UpgradeState.ACTIVE
    assert not Event.objects.filter(kind="upgrade.offboarded", subject_id=lane.pk).exists()


def test_a_host_that_failed_live_and_succeeds_in_the_lane_stays_a_failure_and_is_no_success_of_the_rate(
    tmp_path: Path,
) -> None:
    # Live, a host that failed then caught up is one finished host, a failure (test_upgrade_failure_rate:
    # test_hosts_that_failed_then_caught_up_count_once_as_failures_and_do_not_dilute_the_rate). The
    # lane counted its success for the rate too: 1 failure of 3 finished hosts, where live it is 1 of 2.
    pool, live, retried = canary_with_a_host_to_retry(max_failures=10, max_failure_rate=0.5)
    lane, _ = lane_of(pool, live, tmp_path)
    instant_simulator()

    drive_trains(pool, until=lambda: TaskState.DONE in lane_tasks_of(lane, retried))

    canary = canary_of(lane)
    assert upgrade_phase_failures(lane, canary) == 1
    assert upgrades_rate_successes([canary], up_to=None) == {lane.pk: 1}  # the live success only
    assert upgrades_rate_successes([canary], up_to=5) == {lane.pk: 1}


def test_a_host_the_live_phase_counted_failed_that_left_the_pool_still_counts_in_the_lane(tmp_path: Path) -> None:
    pool, live = canary_with_a_failed_host(max_failures=1)
    now = clock.now().replace(microsecond=0)
    (snapshot,) = live_snapshot(pool.name, now)
    snapshot["upgrades"][0]["phase_progress"]["failed_hosts"] = ["gone-0001"]  # as if it had left the pool
    snapshot_write(snapshot, tmp_path / "live.json")
    (arrival,) = live_workload(live_config(SimulationConfig(), snapshot, tmp_path / "live.json", now)).arrivals

    lane, _ = lane_copy(pool, live, arrival)

    assert list(canary_of(lane).carried_hosts.filter(failed=True).values_list("host_id", flat=True)) == [None]
    assert upgrade_phase_failures(lane, canary_of(lane)) == 1


def test_the_live_fleets_counts_read_no_carried_hosts_and_plan_as_before(tmp_path: Path) -> None:
    # Planned with a branch for carried hosts, the tick's capped success count took 10 ms to plan
    # where it took 3.7: only a lane's counts read them.
    pool, live = canary_with_a_failed_host(max_failures=1, max_failure_rate=0.5)
    lane, _ = lane_of(pool, live, tmp_path)
    phase = canary_of(lane)

    with live_hosts_carried(False), CaptureQueriesContext(connection) as live_counts:
        failures = upgrade_phase_failures(lane, phase)
        upgrades_rate_successes([phase], up_to=5)
        train_upgrades(pool.trains.get())

    assert failures == 0  # the lane's own tasks have none: what is carried is not read
    assert not [q["sql"] for q in live_counts.captured_queries if "trains_carriedhost" in q["sql"]]
    with CaptureQueriesContext(connection) as lane_counts:
        assert upgrade_phase_failures(lane, phase) == 1
    assert any("trains_carriedhost" in q["sql"] for q in lane_counts.captured_queries)


def test_a_host_the_live_phase_counted_failed_that_was_retired_since_still_counts_in_the_lane(tmp_path: Path) -> None:
    pool, live = canary_with_a_failed_host(max_failures=1)
    failed = HostTask.objects.get(operation__visit_link__upgrade=live, state=TaskState.FAILED).host
    Host.all_objects.filter(pk=failed.pk).update(state=RETIRED)  # the snapshot read its name as a KeyError

    lane, _ = lane_of(pool, live, tmp_path)

    assert list(canary_of(lane).carried_hosts.filter(failed=True).values_list("host_id", flat=True)) == [None]
    assert upgrade_phase_failures(lane, canary_of(lane)) == 1
