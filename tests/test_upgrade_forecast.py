"""Per-upgrade forecast and deadline: each upgrade reaches every host "by cycle N, around <date>"
from its place in the backlog (API and upgrades page); a deadline that cannot be met raises an alert
that says what would meet it."""

from __future__ import annotations

import datetime as dt

import pytest
from rest_framework.test import APIClient

from fleet.models import Pool
from fleet.services import installed_version_set
from fleet.services.inventory import domain_create
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.builders import _catalogue, make_fleet, make_host
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Cycle, Train, Upgrade, UpgradeState, Visit, VisitState
from trains.selectors_forecast import (
    FORECAST_QUERIES,
    ForecastCode,
    UpgradeForecast,
    play_forward,
    pool_backlogs,
    upgrades_forecasts,
)
from trains.selectors_promise import PromiseState, UpgradePromise, upgrade_promise
from trains.services.tick import train_tick
from trains.services.upgrade_forecast import DeadlineFix, upgrades_forecast_check
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

# Three domains, one visit at a time, a 5400 s cycle: 1800 s a visit, which fits one upgrade of
# 1200 s work plus 600 s overhead. A cycle with work in every domain lasts 3 x 1800 s = 1.5 h.
CYCLE = dt.timedelta(seconds=5400)


def one_upgrade_per_visit() -> tuple[Pool, Train]:
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    return pool, make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)


def create(pool: Pool, component: str, version: str, **fields: object) -> Upgrade:
    fields = {"reason": "rollout", "duration_s": 1200, **fields}
    return upgrade_create(pool=pool, component=component, version=version, **fields)  # type: ignore[arg-type]


def forecast_of(upgrade: Upgrade) -> UpgradeForecast:
    return upgrades_forecasts([Upgrade.objects.get(pk=upgrade.pk)])[upgrade.pk]


def test_the_forecast_per_upgrade_moves_when_a_higher_priority_upgrade_arrives() -> None:
    pool, _ = one_upgrade_per_visit()
    before = clock.now()
    bios = create(pool, "bios", "2.16.0")

    alone = forecast_of(bios)
    assert (alone.code, alone.cycle) == (ForecastCode.SCHEDULED, 1)
    assert before + CYCLE <= alone.at <= clock.now() + CYCLE
    assert alone.text.startswith("reaches every host by cycle 1, around ")

    driver = create(pool, "gpu-driver", "560.35.03", priority=500)

    behind = forecast_of(bios)
    assert behind.cycle == 2
    assert behind.at >= alone.at + CYCLE
    assert forecast_of(driver).cycle == 1


def test_the_forecast_counts_the_open_cycle_and_what_its_visits_already_took() -> None:
    pool, train = one_upgrade_per_visit()
    bios = create(pool, "bios", "2.16.0")
    driver = create(pool, "gpu-driver", "560.35.03")
    train_tick(train_id=train.pk)  # cycle 1 opens; its first visit takes bios (the older one)

    assert forecast_of(bios).cycle == 1
    assert forecast_of(driver).cycle == 2


def test_the_open_cycles_visits_last_what_their_work_takes_not_the_trains_typical_visit() -> None:
    # The train expects 60 s visits (visit_estimate_s, nothing measured yet); bios makes each of the
    # three 1800 s. Read at the train forecast's times, the open cycle ended 3 minutes after it
    # started, and a meta run's first upgrade was forecast at 25 h and still rolling out at 10 days.
    pool, train = one_upgrade_per_visit()
    bios = create(pool, "bios", "2.16.0")
    train_tick(train_id=train.pk)  # cycle 1 opens; its first visit takes bios
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    visit = dt.timedelta(seconds=first.plan["estimate_s"])
    assert visit == dt.timedelta(seconds=1800)

    forecast = forecast_of(bios)

    assert forecast.cycle == 1
    assert abs(forecast.at - (first.started_at + 3 * visit)) < dt.timedelta(seconds=1)


def test_the_forecast_gives_the_visits_of_a_cycle_behind_its_deadline_less_than_their_share_as_the_tick_does() -> None:
    pool, train = one_upgrade_per_visit()
    bios = create(pool, "bios", "2.16.0")
    train_tick(train_id=train.pk)  # cycle 1 opens; its first visit takes bios
    on_time = forecast_of(bios)
    # The cycle fell behind: when its second visit starts, 1600 s are left for the last two visits,
    # 800 s each, and an upgrade too long for that may stretch a visit to 1000 s (the other visit
    # down to its 600 s overhead); bios needs 1800 s, so the tick would leave it for cycle 2.
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    second = first.started_at + dt.timedelta(seconds=first.plan["estimate_s"])  # when the first is done
    Cycle.objects.filter(train=train, number=1).update(deadline_at=second + dt.timedelta(seconds=1600))

    behind = forecast_of(bios)

    assert (on_time.cycle, behind.cycle) == (1, 2)
    assert behind.at >= second + dt.timedelta(seconds=2 * 1800)  # its other two domains' visits, in cycle 2


def test_a_played_visit_that_takes_work_lasts_at_least_the_trains_typical_recent_visit() -> None:
    # Upgrades keep arriving at the rate that filled the recent visits and join them behind the known
    # work, so a visit that takes a small upgrade lasts as long as the recent ones did; a domain with
    # nothing to take is skipped, as the tick skips it.
    pool, _ = one_upgrade_per_visit()
    everywhere = create(pool, "bios", "2.16.0", duration_s=60)  # 660 s a visit with the overhead
    rack_3 = create(pool, "gpu-driver", "560.35.03", duration_s=60, scope=f"domain {pool.name}/rack-0003")
    now = clock.now()
    backlog = pool_backlogs([pool.pk], now=now)[0][pool.pk]
    backlog.forecast.visit_seconds = 60.0  # recent visits as short as the work: the work decides
    short = play_forward(backlog, now=now)
    backlog.forecast.visit_seconds = 1500.0  # recent visits took 1500 s

    filled = play_forward(backlog, now=now)

    # rack-0003's visit, the last, takes both upgrades: 720 s of work and overhead.
    assert short[everywhere.pk][1] == short[rack_3.pk][1] == now + dt.timedelta(seconds=660 + 660 + 720)
    assert filled[everywhere.pk][1] == filled[rack_3.pk][1] == now + 3 * dt.timedelta(seconds=1500)


def test_a_played_domain_with_nothing_to_take_is_skipped_whatever_the_recent_visits_took() -> None:
    pool, _ = one_upgrade_per_visit()
    rack_3 = create(pool, "bios", "2.16.0", duration_s=60, scope=f"domain {pool.name}/rack-0003")
    now = clock.now()
    backlog = pool_backlogs([pool.pk], now=now)[0][pool.pk]
    backlog.forecast.visit_seconds = 1500.0

    assert play_forward(backlog, now=now)[rack_3.pk][1] == now + dt.timedelta(seconds=1500)


def test_an_upgrade_without_a_running_train_says_it_is_not_scheduled() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    assert forecast_of(upgrade).code == ForecastCode.NO_TRAIN


def test_a_deadline_a_higher_priority_would_meet_raises_an_alert_saying_so() -> None:
    pool, _ = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)

    late = create(pool, "bios", "2.16.0", deadline=clock.now() + CYCLE + dt.timedelta(minutes=30))

    alert = Event.objects.get(kind="alert.upgrade_deadline_at_risk", subject_id=late.pk)
    assert alert.data["fix"] == DeadlineFix.RAISE_PRIORITY
    assert alert.data["forecast_cycle"] == 2
    assert "raising its priority to 1000 (now 100) would meet it" in alert.reason
    assert forecast_of(late).deadline_met is False
    # One alert per upgrade, not one per check.
    train_tick(train_id=Train.objects.get(pool=pool).pk)
    assert Event.objects.filter(kind="alert.upgrade_deadline_at_risk").count() == 1


def test_a_deadline_no_change_can_meet_says_so_with_what_the_closest_an_emergency_train_gives() -> None:
    pool, _ = one_upgrade_per_visit()

    rushed = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(minutes=30))

    alert = Event.objects.get(kind="alert.upgrade_deadline_at_risk", subject_id=rushed.pk)
    assert alert.data["fix"] == DeadlineFix.NONE_KNOWN
    assert "no change the forecast knows meets it; the closest, an emergency train" in alert.reason


def test_a_multi_cycle_upgrades_deadline_alert_advises_whole_visits_not_a_buffer_that_changes_nothing() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=3)
    make_train(pool, visit_estimate_s=3600)
    slow = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", multi_cycle=True, hosts_per_visit=1,
        deadline=clock.now() + dt.timedelta(hours=3),
    )  # fmt: skip

    alert = Event.objects.get(kind="alert.upgrade_deadline_at_risk", subject_id=slow.pk)
    assert alert.data["fix"] == DeadlineFix.WHOLE_VISITS
    assert "its 1 hosts per visit miss it; taking every host of a domain per visit" in alert.reason
    # A larger buffer (the advice it got before) leaves the forecast where it was; whole visits meet it.
    Pool.objects.filter(pk=pool.pk).update(planned_buffer_hosts=6)
    assert forecast_of(slow).deadline_met is False
    Upgrade.objects.filter(pk=slow.pk).update(multi_cycle=False, hosts_per_visit=None)
    assert forecast_of(Upgrade.objects.get(pk=slow.pk)).deadline_met is True


def test_a_deadline_that_is_met_raises_nothing_and_the_forecast_says_so() -> None:
    pool, _ = one_upgrade_per_visit()

    relaxed = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(days=2))

    assert not Event.objects.filter(kind="alert.upgrade_deadline_at_risk").exists()
    forecast = forecast_of(relaxed)
    assert forecast.deadline_met is True
    assert "meets its deadline" in forecast.text


def test_the_api_shows_each_upgrades_forecast_and_takes_a_priority_and_deadline() -> None:
    pool, _ = one_upgrade_per_visit()
    client = APIClient()
    client.force_authenticate(make_user(Role.OPERATOR))
    deadline = (clock.now() + dt.timedelta(days=3)).isoformat()

    created = client.post(
        "/api/upgrades/",
        {"pool": pool.pk, "component": "bios", "version": "2.16.0", "reason": "rollout", "priority": 300,
         "deadline": deadline, "duration_s": 1200},
        format="json",
    )  # fmt: skip
    listed = client.get("/api/upgrades/")

    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["priority"], body["duration_s"]) == (300, 1200)
    assert body["forecast"]["code"] == "scheduled"
    assert body["forecast"]["cycle"] == 1
    assert body["forecast"]["deadline_met"] is True
    listed_forecast = listed.json()["results"][0]["forecast"]
    assert (listed_forecast["code"], listed_forecast["cycle"]) == ("scheduled", 1)


def test_the_upgrades_page_shows_the_forecast() -> None:
    from django.test import Client

    pool, _ = one_upgrade_per_visit()
    upgrade = create(pool, "bios", "2.16.0")
    client = Client()
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/upgrades/").content.decode()

    assert f'data-forecast="{ForecastCode.SCHEDULED}"' in page
    assert forecast_of(upgrade).text in page


def test_forecasting_six_upgrades_of_a_pool_with_a_train_costs_the_queries_of_two() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.trains_builders import nic_firmware

    pool, train = one_upgrade_per_visit()
    nic_firmware()
    targets = [("bios", "2.16.0"), ("gpu-driver", "560.35.03"), ("nic-firmware", "22.4")]
    for component, version in targets[:2]:
        create(pool, component, version)
    train_tick(train_id=train.pk)  # an open cycle with a running visit: every part of the read is used

    def queries() -> int:
        upgrades = list(Upgrade.objects.filter(pool=pool))
        with CaptureQueriesContext(connection) as captured:
            forecasts = upgrades_forecasts(upgrades)
        assert {f.code for f in forecasts.values()} == {ForecastCode.SCHEDULED}
        return len(captured)

    for_two = queries()
    for _ in range(2):
        for component, version in targets:
            create(pool, component, version, scope=f"pool {pool.name}")
    assert queries() == for_two == FORECAST_QUERIES


def test_the_hosts_pending_per_domain_are_those_below_the_target_or_without_the_component_within_the_scope() -> None:
    from fleet.models import ComponentVersion
    from fleet.services import installed_version_set
    from tests.builders import make_version
    from tests.trains_builders import nic_firmware
    from trains.selectors_forecast import pool_backlogs

    pool, _ = one_upgrade_per_visit()  # racks 1-3 of 2 hosts, each running bios 2.14.0 and driver 550
    other, _ = make_fleet(domains=1, hosts_per_domain=2)  # another pool's hosts never count
    make_train(other)
    racks = [list(pool.hosts.filter(domain__position=n).order_by("id")) for n in (1, 2, 3)]
    bios = {v.version: v for v in ComponentVersion.objects.filter(component__name="bios")}
    bios["2.18.0"] = make_version(bios["2.14.0"].component, "2.18.0")
    installed_version_set(host=racks[0][0], version=bios["2.16.0"])  # at the target
    installed_version_set(host=racks[2][1], version=bios["2.18.0"])  # beyond it: supersedes it there
    installed_version_set(host=racks[1][0], version=ComponentVersion.objects.get(version="560.35.03"))
    nic_firmware()  # no host runs any nic-firmware yet

    pool_wide = create(pool, "bios", "2.16.0")
    driver = create(pool, "gpu-driver", "560.35.03")
    nic = create(pool, "nic-firmware", "22.4")
    rack_2 = create(pool, "bios", "2.16.0", scope=f"domain {pool.name}/rack-0002")
    racks_of = {rack[0].domain_id: n for n, rack in enumerate(racks, start=1)}

    backlog = pool_backlogs([pool.pk, other.pk], now=clock.now())[0][pool.pk]

    pending = {u: {racks_of[d]: n for d, n in by_domain.items()} for u, by_domain in backlog.pending.items()}
    assert pending[pool_wide.pk] == {1: 1, 2: 2, 3: 1}
    assert pending[driver.pk] == {1: 2, 2: 1, 3: 2}
    assert pending[nic.pk] == {1: 2, 2: 2, 3: 2}
    assert pending[rack_2.pk] == {2: 2}


def test_the_forecast_takes_again_the_hosts_recent_visits_missed_at_their_domains_next_visits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opsplanner.models import HostTask, TaskState
    from tests.driving import drive_trains
    from trains.selectors_missed import hosts_missed, trains_missed_share

    # Cycle 1 runs a BIOS release whose execution fails on every host (kept on by its policy).
    instant_simulator(execute_by_kind={"upgrade:bios:2.16.0": {"failure_rate": 1.0}})
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=6)  # every host may be in repair
    train = make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)
    create(pool, "bios", "2.16.0", max_failures=100)
    drive_trains(pool, until=lambda: Cycle.objects.filter(train=train, number=1, ended_at__isnull=False).exists())
    assert set(HostTask.objects.filter(pool_id=pool.pk).values_list("state", flat=True)) >= {TaskState.FAILED}
    instant_simulator()  # mended; the forecasts below only read
    driver = create(pool, "gpu-driver", "560.35.03", priority=900)  # first in line: the bios waits behind it

    monkeypatch.setattr("trains.selectors_missed.MISSED_MIN_TASKS", 10**6)  # not measured: every host succeeds
    as_if_none_missed = forecast_of(driver)
    monkeypatch.setattr("trains.selectors_missed.MISSED_MIN_TASKS", 1)
    share = trains_missed_share([train.pk], now=clock.now())[train.pk]
    expected = forecast_of(driver)

    # Each repaired host caught up once in its drain (operation__visit_link__catch_up) and failed again:
    # those tasks neither count as finished nor make up for a miss.
    passes = HostTask.objects.filter(pool_id=pool.pk, operation__visit_link__catch_up=False)
    assert HostTask.objects.filter(operation__visit_link__catch_up=True, state=TaskState.FAILED).exists()
    assert share == passes.filter(state=TaskState.FAILED, failure_code="execute_failed").count() / passes.count()
    assert hosts_missed(share, 6) >= 1
    # Its 6 hosts are all visited in the next cycle; those missed wait for their domains' visits a cycle later.
    assert (as_if_none_missed.code, expected.code) == (ForecastCode.SCHEDULED, ForecastCode.SCHEDULED)
    assert expected.cycle == as_if_none_missed.cycle + 1
    assert expected.at > as_if_none_missed.at
    assert f"with the {hosts_missed(share, 6)} hosts its visits are expected to miss taken again" in expected.text


def test_a_host_whose_check_failed_after_the_install_is_not_a_missed_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsplanner.models import HostTask, TaskState
    from tests.driving import drive_trains
    from trains.selectors_missed import trains_missed_share

    instant_simulator(verify_failure_rate=1.0)
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=6)
    train = make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)
    create(pool, "bios", "2.16.0", max_failures=100)
    failed = HostTask.objects.filter(pool_id=pool.pk, state=TaskState.FAILED, operation__visit_link__isnull=False)
    drive_trains(pool, until=failed.exists)  # a check failed after the install
    instant_simulator()  # the repairs' own checks pass: the hosts come back and the cycle ends
    drive_trains(pool, until=lambda: Cycle.objects.filter(train=train, number=1, ended_at__isnull=False).exists())
    monkeypatch.setattr("trains.selectors_missed.MISSED_MIN_TASKS", 1)

    assert set(failed.values_list("failure_code", flat=True)) == {"check_failed"}
    assert trains_missed_share([train.pk], now=clock.now()) == {train.pk: 0.0}


def test_no_host_is_expected_missed_while_fewer_than_half_a_host_would_be() -> None:
    from trains.selectors_missed import hosts_missed

    assert [hosts_missed(0.004, 100), hosts_missed(0.005, 100), hosts_missed(0.006, 1000), hosts_missed(1.0, 6)] == [
        0,
        1,
        6,
        6,
    ]


def test_the_upgrade_form_takes_a_priority_a_deadline_and_a_time_per_host() -> None:
    from django.test import Client

    from tests.test_web_trains_forms import error_of, upgrade_form

    pool, _ = one_upgrade_per_visit()
    client = Client()
    client.force_login(make_user(Role.OPERATOR))
    deadline = clock.now() + dt.timedelta(days=2)

    response = client.post(
        "/trains/upgrades/new/",
        upgrade_form(pool.name, priority="700", deadline=f"{deadline:%Y-%m-%dT%H:%M}", duration_s="900"),
    )
    past = client.post("/trains/upgrades/new/", upgrade_form(pool.name, deadline="2001-01-01T00:00"))

    assert response.status_code == 302, response.content.decode()[:2000]
    upgrade = Upgrade.objects.get(pool=pool)
    assert (upgrade.priority, upgrade.duration_s) == (700, 900)
    assert upgrade.deadline == deadline.replace(second=0, microsecond=0)
    assert past.status_code == 400
    assert "The deadline is in the past." in error_of(past, "deadline")


# --- the promise: the first forecast, kept and held against what happened ---------------------------
def promise_of(upgrade: Upgrade) -> UpgradePromise:
    return upgrade_promise(Upgrade.objects.get(pk=upgrade.pk), now=clock.now())


def test_an_upgrade_keeps_its_first_forecast_as_its_promise_when_a_later_arrival_moves_its_forecast() -> None:
    pool, train = one_upgrade_per_visit()
    bios = create(pool, "bios", "2.16.0")
    promised = promise_of(bios)

    create(pool, "gpu-driver", "560.35.03", priority=500)
    train_tick(train_id=train.pk)
    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())  # asked again: made once

    assert (promised.state, promised.cycle) == (PromiseState.PENDING, 1)
    assert forecast_of(bios).cycle == 2  # the forecast moved, the promise did not
    assert (promise_of(bios).cycle, promise_of(bios).at) == (1, promised.at)
    event = Event.objects.get(kind="upgrade.promised", subject_id=bios.pk)
    assert event.data["cycle"] == 1
    assert "reaches every host by cycle 1, around " in event.reason


def test_an_upgrade_created_without_a_running_train_gets_its_promise_when_a_train_starts_a_visit() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    upgrade = create(pool, "bios", "2.16.0")
    assert promise_of(upgrade).state == PromiseState.NONE

    train = make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)
    train_tick(train_id=train.pk)

    promise = promise_of(upgrade)
    assert (promise.state, promise.cycle) == (PromiseState.PENDING, 1)
    assert promise.made_at is not None


def test_the_promise_is_held_against_when_every_host_ran_it_and_says_by_how_much() -> None:
    from tests.driving import drive_trains

    pool, _ = one_upgrade_per_visit()
    kept = create(pool, "bios", "2.16.0")
    late = create(pool, "gpu-driver", "560.35.03")
    # The driver's promise was for an hour ago (as if it had been made then and the train fell behind).
    past = clock.now() - dt.timedelta(hours=1)
    Upgrade.objects.filter(pk=late.pk).update(promised_at=past)
    assert promise_of(late).state == PromiseState.OVERDUE
    assert promise_of(late).text.endswith("h overdue")

    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state="active").exists())

    on_time, missed = promise_of(kept), promise_of(late)
    assert (on_time.state, missed.state) == (PromiseState.KEPT, PromiseState.MISSED)
    assert on_time.late_s is not None
    assert on_time.late_s <= 0
    assert missed.late_s is not None
    assert missed.late_s >= 3600
    assert "missed by 1." in missed.text
    completed = {e.subject_id: e for e in Event.objects.filter(kind="upgrade.completed")}
    assert completed[kept.pk].data["promise"] == PromiseState.KEPT
    assert completed[late.pk].data["promise"] == PromiseState.MISSED
    assert completed[late.pk].data["late_s"] >= 3600
    assert "missed by" in completed[late.pk].reason


def test_the_api_and_the_upgrades_page_show_each_upgrades_promise() -> None:
    from django.test import Client

    pool, _ = one_upgrade_per_visit()
    api = APIClient()
    api.force_authenticate(make_user(Role.OPERATOR))
    created = api.post(
        "/api/upgrades/",
        {"pool": pool.pk, "component": "bios", "version": "2.16.0", "reason": "rollout", "duration_s": 1200},
        format="json",
    )
    assert created.status_code == 201, created.content
    promise = created.json()["promise"]
    assert (promise["state"], promise["cycle"]) == ("pending", 1)
    assert promise["late_s"] < 0
    upgrade = Upgrade.objects.get(pk=created.json()["id"])
    Upgrade.objects.filter(pk=upgrade.pk).update(promised_at=clock.now() - dt.timedelta(hours=2))

    listed = api.get("/api/upgrades/").json()["results"][0]["promise"]
    browser = Client()
    browser.force_login(make_user(Role.VIEWER))
    page = browser.get("/trains/upgrades/").content.decode()

    assert listed["state"] == "overdue"
    assert 'data-promise="overdue"' in page
    assert promise_of(upgrade).text.split(":")[0] in page
    made_at = promise_of(upgrade).made_at
    assert made_at is not None
    assert f'On <time datetime="{made_at.isoformat()}">{made_at:%Y-%m-%d %H:%M} UTC</time> its train' in page


def test_an_upgrade_pending_on_a_rack_onboarded_after_the_train_is_forecast_where_the_train_visits_it() -> None:
    # The rack's hosts came after the train: its next cycle adds the rack as its last stop
    # (trains.selectors.stops_to_add); played on the train's stops alone, the forecast never reached
    # them, promised nothing within its horizon and raised a deadline alert with the wrong advice.
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    rack = domain_create(pool=pool, name="rack-0003", position=3)
    catalogue = _catalogue()
    for host in (make_host(rack), make_host(rack)):
        for name, version in (("cuda-runtime", "12.4.1"), ("gpu-driver", "550.127.05"), ("bios", "2.14.0")):
            installed_version_set(host=host, version=catalogue[name][version])
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="rollout", deadline=clock.now() + dt.timedelta(days=2)
    )

    forecast = upgrades_forecasts([upgrade])[upgrade.pk]
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED)

    assert Cycle.objects.filter(train=train).count() == 1  # the first cycle took the rack
    assert (forecast.code, forecast.cycle) == (ForecastCode.SCHEDULED, 1)
    assert not Event.objects.filter(kind="alert.upgrade_deadline_at_risk", subject_id=upgrade.pk).exists()


def test_hosts_escalated_to_a_human_below_a_target_are_counted_apart_and_never_played() -> None:
    from fleet.models import ComponentVersion, Host, HostState
    from tests.trains_builders import nic_firmware

    pool, _ = one_upgrade_per_visit()  # racks 1-3 of 2 hosts, each running bios 2.14.0 and driver 550
    racks = [list(pool.hosts.filter(domain__position=n).order_by("id")) for n in (1, 2, 3)]
    installed_version_set(
        host=racks[0][0], version=ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    )
    installed_version_set(host=racks[1][0], version=ComponentVersion.objects.get(version="560.35.03"))
    nic_firmware()
    # A visit takes hosts in service: these two wait for a human however many visits pass.
    Host.objects.filter(pk__in=[racks[0][0].pk, racks[1][1].pk]).update(state=HostState.ESCALATED)

    pool_wide = create(pool, "bios", "2.16.0")
    driver = create(pool, "gpu-driver", "560.35.03")
    nic = create(pool, "nic-firmware", "22.4")
    rack_2 = create(pool, "bios", "2.16.0", scope=f"domain {pool.name}/rack-0002")
    racks_of = {rack[0].domain_id: n for n, rack in enumerate(racks, start=1)}

    backlog = pool_backlogs([pool.pk], now=clock.now())[0][pool.pk]

    pending = {u: {racks_of[d]: n for d, n in by_domain.items()} for u, by_domain in backlog.pending.items()}
    assert pending[pool_wide.pk] == {1: 1, 2: 1, 3: 2}  # rack 1's escalated host already runs the target
    assert pending[driver.pk] == {1: 1, 3: 2}
    assert pending[nic.pk] == {1: 1, 2: 1, 3: 2}
    assert pending[rack_2.pk] == {2: 1}
    assert backlog.escalated == {pool_wide.pk: 1, driver.pk: 2, nic.pk: 2, rack_2.pk: 1}
    forecast = forecast_of(driver)
    assert (forecast.code, forecast.hosts_escalated) == (ForecastCode.SCHEDULED, 2)
    assert forecast.text.startswith(f"reaches every host but the 2 escalated to a human by cycle {forecast.cycle}, ")
    assert forecast.text.endswith(
        "the 2 hosts escalated to a human get it at their domain's first visit after they return"
    )


def test_an_upgrade_left_only_on_escalated_hosts_waits_for_a_human_and_its_deadline_alert_says_so() -> None:
    from fleet.models import ComponentVersion, Host, HostState

    pool, train = one_upgrade_per_visit()
    escalated, *others = list(pool.hosts.order_by("id"))
    for host in others:
        installed_version_set(host=host, version=ComponentVersion.objects.get(component__name="bios", version="2.16.0"))
    Host.objects.filter(pk=escalated.pk).update(state=HostState.ESCALATED)

    bios = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(days=2))
    train_tick(train_id=train.pk)

    forecast = forecast_of(bios)
    assert (forecast.code, forecast.cycle, forecast.at) == (ForecastCode.WAITS_FOR_HUMAN, None, None)
    assert (forecast.deadline_met, forecast.hosts_escalated) == (False, 1)
    assert Upgrade.objects.get(pk=bios.pk).state == UpgradeState.ACTIVE  # the escalated host still runs 2.14.0
    alert = Event.objects.get(kind="alert.upgrade_deadline_at_risk", subject_id=bios.pk)
    assert alert.data["fix"] == DeadlineFix.RETURN_HOSTS
    assert alert.data["hosts_escalated"] == 1
    assert "the 1 escalated to a human keep it from every host" in alert.reason
    assert Upgrade.objects.get(pk=bios.pk).promise_made_at is None  # nothing a train could promise
