"""The trains keep moving when the fleet changes under them: a scope that no longer matches, a
retired host, a target that became incompatible, an emergency with nothing left to do, and one
train whose tick fails while the others go on."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Component, ComponentVersion, Host, InstalledVersion, Pool
from fleet.services.host_changes import host_retire
from fleet.services.hosts import host_transition
from fleet.services.inventory import compatibility_rule_create, installed_version_set
from opsplanner import clock
from opsplanner.models import Approval, Event, HostTask
from opsplanner.services.approvals import approval_decide
from opsplanner.services.escalations import host_escalation_release
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_domain, make_fleet, make_host
from tests.driving import instant_simulator
from tests.trains_builders import cycle_ended, make_train, make_user
from trains.models import Cycle, Pace, Train, TrainState, Upgrade, UpgradeState, Visit, VisitOperation
from trains.selectors_forecast import pool_backlogs, upgrades_forecasts
from trains.services.budget import train_sizing
from trains.services.cycles import IDLE_AFTER_EMPTY_CYCLE
from trains.services.emergency import emergency_train_request
from trains.services.tick import trains_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def rounds(pool: Pool, n: int) -> None:
    for _ in range(n):
        trains_tick()
        pool_tick(pool_id=pool.pk)
        simulated_work_step()


def installed(pool: Pool, component: str) -> set[str]:
    return set(
        InstalledVersion.objects.filter(host__pool=pool, component__name=component).values_list(
            "version__version", flat=True
        )
    )


def forbid_bios_above(version: str) -> None:
    """A compatibility rule made after the upgrades: cuda 12.4.1 works with no bios above `version`."""
    compatibility_rule_create(
        job_facing_version=ComponentVersion.objects.get(component__name="cuda-runtime", version="12.4.1"),
        lower_component=Component.objects.get(name="bios"),
        max_version=version,
    )


def state_of(upgrade: Upgrade) -> str:
    return Upgrade.objects.get(pk=upgrade.pk).state


def rolled_back_ticks() -> list[str]:
    return list(Event.objects.filter(kind="train.tick_rolled_back").values_list("reason", flat=True))


# --- 1. scopes the fleet moved past, and one train failing ----------------------------------------
def test_an_upgrade_whose_scope_no_longer_matches_any_host_completes() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = upgrade_create(
        pool=pool,
        component="bios",
        version="2.16.0",
        reason="rollout",
        scope=f"hosts running bios below 2.16.0 in pool {pool.name}",
    )

    rounds(pool, 30)

    assert installed(pool, "bios") == {"2.16.0"}
    assert state_of(upgrade) == UpgradeState.COMPLETED
    assert "matches no live host any more" in Upgrade.objects.get(pk=upgrade.pk).state_reason
    assert cycle_ended(train, 1)
    assert rolled_back_ticks() == []


def test_a_retired_host_named_by_a_scope_is_dropped_and_the_others_complete() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    named = hosts[:3]
    upgrade = upgrade_create(
        pool=pool,
        component="bios",
        version="2.16.0",
        reason="rollout",
        scope="hosts: " + ", ".join(h.hostname for h in named),
    )
    host_retire(hostname=named[2].hostname, reason="leaves the fleet")

    rounds(pool, 30)

    assert state_of(upgrade) == UpgradeState.COMPLETED
    assert Upgrade.objects.get(pk=upgrade.pk).state_reason.startswith("all 2 hosts run bios 2.16.0")
    assert set(InstalledVersion.objects.filter(component__name="bios", version__version="2.16.0").values_list(
        "host_id", flat=True
    )) == {named[0].pk, named[1].pk}  # fmt: skip
    assert cycle_ended(train, 1)
    assert rolled_back_ticks() == []


@pytest.mark.parametrize("renamed", ["pool", "host"])
def test_an_upgrade_whose_scope_names_something_renamed_since_is_not_completed_and_the_tick_says_why(
    renamed: str,
) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    make_train(pool)
    scope = f"pool {pool.name}" if renamed == "pool" else f"hosts: {hosts[0].hostname}, {hosts[1].hostname}"
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", scope=scope)
    # A rename the admin allows: the stored scope names something no longer there.
    if renamed == "pool":
        Pool.objects.filter(pk=pool.pk).update(name=f"{pool.name}-renamed")
    else:
        Host.objects.filter(pk=hosts[1].pk).update(hostname=f"{hosts[1].hostname}-renamed")

    rounds(pool, 5)

    assert state_of(upgrade) == UpgradeState.ACTIVE  # not completed: nobody did its work
    assert rolled_back_ticks()
    assert ("no pool named" if renamed == "pool" else "Unknown hosts") in rolled_back_ticks()[-1]


def test_a_train_tick_failing_for_the_same_reason_says_so_once_per_ten_minutes_not_at_every_beat() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", scope=f"pool {pool.name}")
    Pool.objects.filter(pk=pool.pk).update(name=f"{pool.name}-renamed")
    instant = [clock.now()]

    with clock.use_clock(lambda: instant[0]):
        for _ in range(5):  # five beats, 2 s apart
            trains_tick()
            instant[0] += dt.timedelta(seconds=2)
        said_once = rolled_back_ticks()
        instant[0] += dt.timedelta(minutes=10)
        trains_tick()

    assert len(said_once) == 1
    assert "no pool named" in said_once[0]
    assert rolled_back_ticks() == said_once * 2  # and again once the ten minutes have passed


def test_the_forecast_reads_a_scope_as_the_tick_does() -> None:
    """A retired host named by the scope is dropped, the others still count (the whole pool was
    taken instead, as soon as one name no longer resolved)."""
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    make_train(pool)
    scope = "hosts: " + ", ".join(h.hostname for h in hosts[:3])
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", scope=scope)
    installed_version_set(host=hosts[0], version=ComponentVersion.objects.get(component__name="bios", version="2.16.0"))
    host_retire(hostname=hosts[1].hostname, reason="leaves the fleet")

    backlogs, _ = pool_backlogs([pool.pk], now=clock.now())

    assert backlogs[pool.pk].pending[upgrade.pk] == {hosts[2].domain_id: 1}


def test_one_train_that_fails_does_not_stop_the_others(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import trains.services.tick as tick

    instant_simulator()
    first_pool, _ = make_fleet(domains=1, hosts_per_domain=2, pool_name="pool-a")
    second_pool, _ = make_fleet(domains=1, hosts_per_domain=2, pool_name="pool-b")
    failing = make_train(first_pool, name="train-a")  # ticked first (trains tick by name)
    healthy = make_train(second_pool, name="train-b")
    for pool in (first_pool, second_pool):
        upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    forecasts = tick.trains_forecasts_with_visits

    def broken_for_the_first(trains: list[Train], **kwargs: object) -> object:
        if any(train.pk == failing.pk for train in trains):
            raise RuntimeError("the forecast of train-a broke")
        return forecasts(trains, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tick, "trains_forecasts_with_visits", broken_for_the_first)

    reports = trains_tick()

    assert [(r.train_id, r.rolled_back) for r in reports] == [(failing.pk, True), (healthy.pk, False)]
    assert not Cycle.objects.filter(train=failing).exists()  # its tick rolled back whole
    assert Cycle.objects.filter(train=healthy).exists()
    event = Event.objects.get(kind="train.tick_rolled_back")
    assert (event.subject_type, event.subject_id, event.pool_id) == ("trains.train", failing.pk, first_pool.pk)
    assert event.reason == "RuntimeError: the forecast of train-a broke"
    assert "tick of train" in caplog.text


# --- 2. a target that became incompatible ---------------------------------------------------------
@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_an_upgrade_that_became_incompatible_is_left_out_of_the_visit_with_its_reason(pace: str) -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    make_train(pool, pace=pace)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    forbid_bios_above("2.15.0")

    rounds(pool, 30)

    assert installed(pool, "gpu-driver") == {"560.35.03"}  # the visits went on with the other work
    assert installed(pool, "bios") == {"2.14.0"}
    assert state_of(driver) == UpgradeState.COMPLETED
    assert state_of(bios) == UpgradeState.ACTIVE
    refused = Event.objects.filter(kind="train.visit_upgrade_refused").order_by("id")
    assert refused.exists()
    assert {e.data["code"] for e in refused} == {"incompatible"}
    assert {e.data["upgrade"] for e in refused} == {bios.pk}
    assert "would break a compatibility rule" in refused[0].reason
    assert not HostTask.objects.filter(operation__component_version=bios.component_version).exists()
    assert rolled_back_ticks() == []


def test_a_visit_is_measured_against_the_work_it_does_not_the_upgrade_left_out_as_incompatible() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=3600)
    driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", duration_s=60)
    forbid_bios_above("2.15.0")
    sizing = train_sizing(train)

    trains_tick()

    visit = Visit.objects.get(train=train, state="running")
    started = Event.objects.get(kind="train.visit_started", subject_id=visit.pk)
    assert started.data["cost_s"] == round(sizing.cost_s(2, [3600, 60]))  # planned with both
    # Measured from here on against the driver alone, over the hosts it drains.
    assert visit.plan["cost_s"] == round(sizing.cost_s(2, [sizing.work_s(driver)]))
    assert visit.plan["hosts"] == sorted(HostTask.objects.filter(pool_id=pool.pk).values_list("host_id", flat=True))


def test_a_sliding_visit_leaves_out_an_upgrade_that_became_incompatible_as_it_releases_hosts() -> None:
    instant_simulator()
    # One host out at a time: the visit releases its hosts one by one.
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    train = make_train(pool, pace=Pace.SLIDING)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    first = hosts[0]
    for _ in range(30):  # until the first host released is back, before the train releases the next
        rounds(pool, 1)
        if Host.objects.get(pk=first.pk).state == "in_service" and installed_on(first) == "2.16.0":
            break
    visit = train.visits.get()
    assert sorted(h for e in visit.plan["unreleased"] for h in e["hosts"]) == [
        hosts[1].pk,
        hosts[1].pk,
        hosts[2].pk,
        hosts[2].pk,
    ]
    forbid_bios_above("2.15.0")

    rounds(pool, 30)

    assert installed(pool, "gpu-driver") == {"560.35.03"}
    assert [installed_on(h) for h in hosts] == ["2.16.0", "2.14.0", "2.14.0"]
    assert state_of(driver) == UpgradeState.COMPLETED
    # Once in the visit: its hosts still to come no longer wait for it.
    refused = Event.objects.get(kind="train.visit_upgrade_refused", subject_id=visit.pk)
    assert (refused.data["upgrade"], refused.data["code"]) == (bios.pk, "incompatible")
    assert Visit.objects.get(pk=visit.pk).plan["refused"] == [bios.pk]
    assert rolled_back_ticks() == []


def installed_on(host: Host) -> str:
    return InstalledVersion.objects.get(host=host, component__name="bios").version.version


def test_a_late_upgrade_that_became_incompatible_does_not_join_the_visit() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=1, hosts_per_domain=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    trains_tick()  # the visit starts; its hosts wait for the core
    late = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="late")
    forbid_bios_above("2.15.0")

    trains_tick()

    refused = Event.objects.get(kind="train.visit_upgrade_refused")
    assert (refused.data["upgrade"], refused.data["code"]) == (late.pk, "incompatible")
    visit = train.visits.get()
    assert late.pk in visit.plan["late_seen"]
    assert not Event.objects.filter(kind="train.visit_joined").exists()
    assert rolled_back_ticks() == []


# --- 3. retired hosts in the forecast -------------------------------------------------------------
def test_the_forecast_counts_live_hosts_only_and_never_a_negative_pending_count() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    target = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    for host in hosts[1:]:
        installed_version_set(host=host, version=target)
    host_retire(hostname=hosts[3].hostname, reason="leaves the fleet")
    make_train(pool)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    backlogs, _ = pool_backlogs([pool.pk], now=clock.now())

    assert backlogs[pool.pk].pending[upgrade.pk] == {hosts[0].domain_id: 1}
    assert upgrades_forecasts([upgrade])[upgrade.pk].cycle is not None  # one host still to do: not "done now"


# --- 4. an emergency with nothing left to do -------------------------------------------------------
def test_an_emergency_train_whose_upgrade_has_nothing_left_to_do_finishes() -> None:
    instant_simulator()
    requester, approver = make_user(), make_user()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = emergency_train_request(pool=pool, component="bios", version="2.16.0", reason="CVE", actor=requester)
    target = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    for host in Host.objects.filter(pool=pool):
        installed_version_set(host=host, version=target)
    approval = train_approval(train)
    approval_decide(approval_id=approval.pk, approve=True, reason="CVE confirmed", actor=approver)

    rounds(pool, 3)

    train.refresh_from_db()
    assert train.state == TrainState.FINISHED
    assert "nothing left to do" in train.state_reason
    assert state_of(train.upgrade) == UpgradeState.COMPLETED
    assert not Cycle.objects.filter(train=train).exists()
    assert Event.objects.filter(kind="train.finished", subject_id=train.pk).count() == 1


def train_approval(train: Train) -> Approval:
    return Approval.objects.get(subject_type="trains.train", subject_id=train.pk)


# --- 5. pending work no visit can take ---------------------------------------------------------------
def test_a_train_whose_only_pending_host_is_escalated_opens_no_cycle_until_the_host_is_back() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    escalated = hosts[0]
    host_transition(host_id=escalated.pk, expected="in_service", new="failed", reason="PSU")
    host_transition(host_id=escalated.pk, expected="failed", new="escalated", reason="needs a human")
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    start = clock.now()
    now = [start]

    with clock.use_clock(lambda: now[0]):
        for _ in range(60):
            rounds(pool, 1)
            now[0] += dt.timedelta(seconds=2)  # the beat's cadence
            if cycle_ended(train, 1):
                break
        assert set(installed(pool, "bios")) == {"2.14.0", "2.16.0"}  # every other host got it
        assert Cycle.objects.filter(train=train).count() == 1  # and no cycle opened for the escalated one
        for _ in range(3):  # hours of ticks while a person looks at the host: no empty cycles
            now[0] += IDLE_AFTER_EMPTY_CYCLE
            rounds(pool, 5)
        assert Cycle.objects.filter(train=train).count() == 1
        host_escalation_release(host_id=escalated.pk, reason="PSU replaced", actor="op")
        for _ in range(30):  # verified and returned (in repair meanwhile: still no cycle for it)
            rounds(pool, 1)
            now[0] += dt.timedelta(seconds=2)
            if Cycle.objects.filter(train=train).count() == 2:
                break
        assert Cycle.objects.filter(train=train).count() == 2
        for _ in range(60):
            rounds(pool, 1)
            now[0] += dt.timedelta(seconds=2)
            if cycle_ended(train, 2):
                break
    assert set(installed(pool, "bios")) == {"2.16.0"}
    assert VisitOperation.objects.filter(visit__cycle__train=train, visit__cycle__number=2).exists()  # not empty


def test_a_domain_given_hosts_after_the_train_was_created_becomes_a_stop_and_is_visited() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    rack = make_domain(pool, name="rack-new")
    newcomer = make_host(rack)
    installed_version_set(host=newcomer, version=ComponentVersion.objects.get(component__name="bios", version="2.14.0"))
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    rounds(pool, 60)

    assert state_of(upgrade) == UpgradeState.COMPLETED
    assert installed_on(newcomer) == "2.16.0"
    assert list(train.stops.order_by("position").values_list("domain__name", flat=True))[-1] == "rack-new"
    added = Event.objects.get(kind="train.stops_added")
    assert added.data == {"domains": ["rack-new"]}
    assert Visit.objects.filter(train=train, domain=rack).count() == 1


def test_a_stop_added_by_the_fleet_that_makes_the_slo_unkeepable_raises_an_alert_with_the_numbers() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    # Two visits of an hour fit a 2-h SLO; the third domain's does not.
    train = make_train(pool, cycle_slo_s=7200, visit_estimate_s=3600)
    rack = make_domain(pool, name="rack-new")
    newcomer = make_host(rack)
    installed_version_set(host=newcomer, version=ComponentVersion.objects.get(component__name="bios", version="2.14.0"))
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    trains_tick()

    alert = Event.objects.get(kind="alert.cycle_slo_unkeepable", subject_id=train.pk)
    assert alert.reason == (
        f"train {train.name} now has 1 more stops. A cycle of 3 visits of 3600 s, 1 at a time, takes at least "
        "10800 s; the SLO of 7200 s cannot be met. Raise the SLO or visit more domains at once."
    )
    assert Event.objects.get(kind="train.stops_added").data == {"domains": ["rack-new"]}


def test_a_stop_added_within_the_slo_raises_no_alert() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2)
    make_train(pool, cycle_slo_s=3 * 3600, visit_estimate_s=3600)
    make_host(make_domain(pool, name="rack-new"))
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    trains_tick()

    assert Event.objects.filter(kind="train.stops_added").exists()
    assert not Event.objects.filter(kind="alert.cycle_slo_unkeepable").exists()
