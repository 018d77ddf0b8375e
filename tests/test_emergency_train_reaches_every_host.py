"""An approved emergency train beside a regular train and a broken host: it is not stopped by the
planned buffer the regular work fills, nor by a broken host its pool's failure buffer allows, it
goes on until every host of its scope runs the fix, and when it finishes with hosts left (escalated
to a human, or its target now incompatible there) it says which and why."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Component, Host, HostState, InstalledVersion, Pool
from fleet.services.hosts import host_transition
from fleet.services.inventory import compatibility_rule_create, installed_version_set
from opsplanner import clock
from opsplanner.models import Approval, Event
from opsplanner.services.approvals import approval_decide
from opsplanner.services.failures import host_failure_report
from opsplanner.services.tick import pool_tick
from tests.builders import make_domain, make_fleet, make_host, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Cycle, Train, TrainState, Upgrade, UpgradeState
from trains.services.emergency import emergency_train_request
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

FIX = "2.16.0"


def bios_of(pool: Pool) -> dict[str, str]:
    return dict(
        InstalledVersion.objects.filter(host__pool=pool, component__name="bios").values_list(
            "host__hostname", "version__version"
        )
    )


def approved_emergency(pool: Pool) -> Train:
    """A bios fix over the whole pool, two domains at once, requested by one operator and approved by another."""
    train = emergency_train_request(
        pool=pool, component="bios", version=FIX, reason="CVE", domains_at_once=2, actor=make_user()
    )
    approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
    approval_decide(approval_id=approval.pk, approve=True, reason="CVE confirmed", actor=make_user())
    train.refresh_from_db()
    return train


def fleet_with_a_regular_visit_draining_rack_1(*, planned: int) -> tuple[Pool, list[Host]]:
    """Two racks of 3 hosts, hard floor 1; the regular train's driver visit has drained rack-0001."""
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=planned, failure_buffer_hosts=2)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    regular = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver")
    train_tick(train_id=regular.pk)
    pool_tick(pool_id=pool.pk)
    assert {h.state for h in Host.objects.filter(domain__name="rack-0001")} == {HostState.DRAINING}
    return pool, hosts


def events_of(train: Train, kind: str) -> list[Event]:
    return list(Event.objects.filter(subject_type="trains.train", subject_id=train.pk, kind__startswith=kind))


def until_stopped(train: Train) -> bool:
    return Train.objects.get(pk=train.pk).state != TrainState.RUNNING


def test_an_emergency_train_is_not_autostopped_by_the_planned_buffer_a_regular_visit_fills() -> None:
    pool, _ = fleet_with_a_regular_visit_draining_rack_1(planned=3)
    emergency = approved_emergency(pool)

    train_tick(train_id=emergency.pk)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.RUNNING, emergency.state_reason
    assert not events_of(emergency, "alert.train_autostopped")


def test_an_emergency_train_reaches_the_hosts_a_regular_visit_held_when_it_was_approved() -> None:
    pool, _ = fleet_with_a_regular_visit_draining_rack_1(planned=4)
    emergency = approved_emergency(pool)

    drive_trains(pool, until=lambda: until_stopped(emergency), max_rounds=200)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.FINISHED, emergency.state_reason
    assert Upgrade.objects.get(pk=emergency.upgrade_id).state == UpgradeState.COMPLETED
    assert set(bios_of(pool).values()) == {FIX}
    # Its first cycle ended with rack-0001's hosts below the fix, and said so; a second reached them.
    [left] = events_of(emergency, "train.emergency_hosts_left")
    assert sorted(left.data["hosts"]) == sorted(h.hostname for h in Host.objects.filter(domain__name="rack-0001"))
    assert Cycle.objects.filter(train=emergency).count() == 2


def an_emergency_run_with_a_host_broken_first(*, failure_buffer_hosts: int) -> tuple[Pool, Host, Train]:
    """Two racks of three, a hard floor of 1, the first host reported broken (repaired within a few
    rounds), then an approved emergency driven until it stops."""
    instant_simulator()
    pool, hosts = make_fleet(
        domains=2, hosts_per_domain=3, planned_buffer_hosts=3, failure_buffer_hosts=failure_buffer_hosts
    )
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    broken = hosts[0]
    host_failure_report(host_id=broken.pk, reason="psu")
    emergency = approved_emergency(pool)
    drive_trains(pool, until=lambda: until_stopped(emergency), max_rounds=200)
    return pool, broken, emergency


def test_an_emergency_train_reaches_a_host_that_was_in_repair_when_its_domain_was_visited() -> None:
    pool, broken, emergency = an_emergency_run_with_a_host_broken_first(failure_buffer_hosts=2)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.FINISHED, emergency.state_reason
    assert Upgrade.objects.get(pk=emergency.upgrade_id).state == UpgradeState.COMPLETED
    assert bios_of(pool)[broken.hostname] == FIX
    assert not events_of(emergency, "alert.")


def test_an_emergency_train_left_only_with_escalated_hosts_finishes_with_an_alert_naming_them() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3, failure_buffer_hosts=2)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    escalated = hosts[0]
    host_transition(host_id=escalated.pk, expected="in_service", new="failed", reason="PSU")
    host_transition(host_id=escalated.pk, expected="failed", new="escalated", reason="needs a human")
    emergency = approved_emergency(pool)

    drive_trains(pool, until=lambda: until_stopped(emergency), max_rounds=200)

    emergency.refresh_from_db()
    upgrade = Upgrade.objects.get(pk=emergency.upgrade_id)
    assert emergency.state == TrainState.FINISHED
    assert escalated.hostname in emergency.state_reason
    assert {name for name, version in bios_of(pool).items() if version != FIX} == {escalated.hostname}
    # Its upgrade is not left active with nobody to apply it: cancelled, with the reason.
    assert upgrade.state == UpgradeState.CANCELLED
    assert escalated.hostname in upgrade.state_reason
    [alert] = events_of(emergency, "alert.emergency_hosts_left")
    assert alert.data["hosts"] == [escalated.hostname]
    assert escalated.hostname in alert.reason


def test_an_emergency_train_finishes_with_an_alert_naming_the_hosts_of_a_rack_added_after_its_approval() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3, failure_buffer_hosts=2)
    emergency = approved_emergency(pool)
    newcomer = make_host(make_domain(pool, name="rack-0003"))
    for installed in InstalledVersion.objects.filter(host=hosts[0]).select_related("version"):
        installed_version_set(host=newcomer, version=installed.version)

    drive_trains(pool, until=lambda: until_stopped(emergency), max_rounds=200)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.FINISHED
    assert {name for name, version in bios_of(pool).items() if version != FIX} == {newcomer.hostname}
    assert Upgrade.objects.get(pk=emergency.upgrade_id).state == UpgradeState.CANCELLED
    [alert] = events_of(emergency, "alert.emergency_hosts_left")
    assert alert.data["hosts"] == [newcomer.hostname]


def a_cuda_release_that_forbids_the_fix_on(host: Host) -> None:
    """After the approval (the request checked every host), the host's job-facing cuda moves to a
    release that works with no bios above 2.15.0: the fix is now incompatible there, and there only."""
    cuda = make_version(Component.objects.get(name="cuda-runtime"), "12.8.0")
    compatibility_rule_create(
        job_facing_version=cuda, lower_component=Component.objects.get(name="gpu-driver"), min_version="550.54.14"
    )
    compatibility_rule_create(
        job_facing_version=cuda, lower_component=Component.objects.get(name="bios"), max_version="2.15.0"
    )
    installed_version_set(host=host, version=cuda)


def test_an_emergency_whose_target_became_incompatible_on_one_host_fixes_the_others_and_finishes_naming_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3, failure_buffer_hosts=2)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    emergency = approved_emergency(pool)
    incompatible = hosts[0]
    a_cuda_release_that_forbids_the_fix_on(incompatible)
    now = [clock.now()]

    def half_a_minute_passes() -> None:  # the refusals came back every IDLE_AFTER_EMPTY_CYCLE
        now[0] += dt.timedelta(seconds=30)

    with clock.use_clock(lambda: now[0]):
        drive_trains(pool, until=lambda: until_stopped(emergency), each_round=half_a_minute_passes, max_rounds=200)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.FINISHED
    assert {name for name, version in bios_of(pool).items() if version != FIX} == {incompatible.hostname}
    assert Cycle.objects.filter(train=emergency).count() == 1
    # Refused once, for that host only: the visit went on with the rest of its rack.
    [refused] = Event.objects.filter(kind="train.visit_upgrade_refused")
    assert (refused.data["code"], refused.data["hostnames"]) == ("incompatible", [incompatible.hostname])
    assert Upgrade.objects.get(pk=emergency.upgrade_id).state == UpgradeState.CANCELLED
    [alert] = events_of(emergency, "alert.emergency_hosts_left")
    assert alert.data["hosts"] == [incompatible.hostname]
    assert alert.data["why"] == {incompatible.hostname: "incompatible"}
    assert "cuda-runtime 12.8.0" in alert.reason


def test_an_emergency_train_goes_on_past_a_broken_host_its_pools_failure_buffer_of_one_allows() -> None:
    pool, _broken, emergency = an_emergency_run_with_a_host_broken_first(failure_buffer_hosts=1)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.FINISHED, emergency.state_reason
    assert not events_of(emergency, "alert.train_autostopped")
    assert set(bios_of(pool).values()) == {FIX}


def test_an_emergency_train_stops_itself_once_more_hosts_are_out_broken_than_the_failure_buffer_allows() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3, failure_buffer_hosts=1)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    for broken in hosts[:2]:
        host_transition(host_id=broken.pk, expected="in_service", new="failed", reason="PSU")
    emergency = approved_emergency(pool)

    train_tick(train_id=emergency.pk)

    emergency.refresh_from_db()
    assert emergency.state == TrainState.AUTOSTOPPED
    assert "failure buffer of pool" in emergency.state_reason
    assert events_of(emergency, "alert.train_autostopped")


def test_a_host_refused_again_for_another_reason_in_a_later_cycle_is_named_again() -> None:
    """Invariant 5: a host an emergency visit left out (its fix incompatible there) is named once per
    reason: refused again in a later cycle because its versions changed, it is named again with the
    new reason (found in review: the first reason was the only one said)."""
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3, failure_buffer_hosts=2)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    incompatible, broken = hosts[0], hosts[3]
    host_failure_report(host_id=broken.pk, reason="psu")  # back after cycle 1 visited rack 2: a cycle 2
    emergency = approved_emergency(pool)
    a_cuda_release_that_forbids_the_fix_on(incompatible)
    switched = []

    def another_reason_once_named() -> None:
        if not switched and Event.objects.filter(kind="train.visit_upgrade_refused").exists():
            cuda = make_version(Component.objects.get(name="cuda-runtime"), "12.9.0")
            driver = Component.objects.get(name="gpu-driver")
            compatibility_rule_create(job_facing_version=cuda, lower_component=driver, min_version="550.54.14")
            compatibility_rule_create(
                job_facing_version=cuda, lower_component=Component.objects.get(name="bios"), max_version="2.14.0"
            )
            installed_version_set(host=incompatible, version=cuda)
            switched.append(True)

    drive_trains(pool, until=lambda: until_stopped(emergency), each_round=another_reason_once_named, max_rounds=300)

    assert Cycle.objects.filter(train=emergency).count() >= 2
    refusals = [e.data for e in Event.objects.filter(kind="train.visit_upgrade_refused").order_by("id")]
    [alert] = events_of(emergency, "alert.emergency_hosts_left")
    assert "cuda-runtime 12.9.0" in alert.reason
    assert [list(data["why"]) for data in refusals] == [[incompatible.hostname]] * 2
    assert ["12.9.0" in data["why"][incompatible.hostname] for data in refusals] == [False, True]
