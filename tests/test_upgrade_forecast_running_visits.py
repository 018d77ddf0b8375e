"""The per-upgrade forecast held against what the train's visits do: a running visit counts only the
hosts it has yet to reach, an upgrade is reached when the last of its visits ends, an upgrade created
during a visit is promised the visit it joins, a stopped train promises nothing, and an upgrade a
visit refused is not counted as reached there. The first four cases come from a reviewer's probes
(helper-24), driven on a virtual clock (tests/forecast_world.py)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client

from fleet.models import Host
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.forecast_world import World, timed_simulator
from tests.test_train_robustness import forbid_bios_above
from tests.trains_builders import make_train, make_user
from trains.models import Upgrade, Visit, VisitState
from trains.selectors_forecast import ForecastCode, upgrades_forecasts
from trains.selectors_promise import PromiseState, upgrade_promise
from trains.services.trains import train_pause, train_resume
from trains.services.upgrade_forecast import DeadlineFix
from trains.services.upgrades import hosts_below_target, upgrade_create

pytestmark = pytest.mark.django_db

ALERT = "alert.upgrade_deadline_at_risk"


def forecast_of(upgrade: Upgrade):
    return upgrades_forecasts([Upgrade.objects.get(pk=upgrade.pk)])[upgrade.pk]


def test_a_running_visits_hosts_that_already_have_the_target_are_not_taken_off_the_pending_again() -> None:
    # One rack of 3 hosts; bios is multi-cycle, one host a visit: cycles 1, 2 and 3. A slow driver on
    # the same hosts keeps visit 1 running after bios is on its one host: 2 hosts left, one a cycle.
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"seconds": 3000}})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, _ = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=3)
        train = make_train(pool, cycle_slo_s=24 * 3600, visit_overhead_s=600)
        bios = upgrade_create(
            pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=600,
            multi_cycle=True, hosts_per_visit=1,
        )  # fmt: skip
        driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="d", duration_s=3000)
        hosts = list(Host.objects.filter(pool=pool).values_list("id", flat=True))
        for _ in range(50):
            world.tick(pool, step_s=1.0)
            if hosts_below_target(bios, hosts).count() == 2:
                break
        assert Visit.objects.get(train=train, cycle__number=1).state == VisitState.RUNNING

        midway = forecast_of(bios)
        done = world.until_every_host(pool, train, [bios, driver], step_s=60.0)

    assert Upgrade.objects.get(pk=bios.pk).promised_cycle == 3
    assert done[bios.pk] == 3
    assert midway.cycle == 3, midway.text  # was cycle 2: its host in visit 1 was taken off twice


def test_with_two_lanes_an_upgrade_is_reached_when_the_last_of_its_visits_ends() -> None:
    # Two racks of 2 hosts, two visits at once. bios (3000 s) on rack-0001 only: its visit lasts
    # 600 + 3000 + 600 s; the driver (600 s) on both racks: rack-0002's visit lasts 1200 s and is
    # played second, but rack-0001's, played first, ends last: the driver is on every host ~4200 s in.
    timed_simulator(**{
        "upgrade:bios:2.16.0": {"seconds": 3000}, "upgrade:gpu-driver:560.35.03": {"seconds": 600},
    })  # fmt: skip
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=4)
        train = make_train(pool, cycle_slo_s=24 * 3600, visit_overhead_s=600, visit_concurrency=2)
        start = world.now[0]
        bios = upgrade_create(
            pool=pool, component="bios", version="2.16.0", reason="r", duration_s=3000,
            scope=f"domain {pool.name}/rack-0001",
        )  # fmt: skip
        driver = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="d", duration_s=600)

        forecast = forecast_of(driver)
        done = world.until_every_host(pool, train, [bios, driver], step_s=10.0)

    assert done[driver.pk] == forecast.cycle == 1
    assert world.reached[driver.pk] - start > dt.timedelta(seconds=4000)
    # Was 1200 s: the end of rack-0002's short visit, which zeroed its last count.
    assert forecast.at - start == dt.timedelta(seconds=4200), forecast.text
    assert Upgrade.objects.get(pk=driver.pk).promised_at == forecast.at


def test_an_upgrade_created_during_a_visit_is_promised_the_visit_it_joins_and_no_deadline_alert() -> None:
    # One rack of 2 hosts: bios (1200 s) runs; the driver (600 s) arrives a minute in and joins the
    # visit's drained hosts (train.visit_joined): every host in cycle 1, ~2400 s after it started.
    timed_simulator(**{
        "upgrade:bios:2.16.0": {"seconds": 1200}, "upgrade:gpu-driver:560.35.03": {"seconds": 600},
    })  # fmt: skip
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
        train = make_train(pool, cycle_slo_s=24 * 3600, visit_overhead_s=600)
        bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="r", duration_s=1200)
        world.tick(pool, rounds=60, step_s=1.0)  # visit 1 starts, its hosts drain
        started = Visit.objects.get(train=train, cycle__number=1).started_at
        deadline = started + dt.timedelta(seconds=2700)
        driver = upgrade_create(
            pool=pool, component="gpu-driver", version="560.35.03", reason="fix", duration_s=600, deadline=deadline,
        )  # fmt: skip
        at_creation = forecast_of(driver)
        world.tick(pool, rounds=1, step_s=1.0)  # the train's next tick lets it join
        joined = forecast_of(driver)
        done = world.until_every_host(pool, train, [bios, driver], step_s=10.0)

    assert Event.objects.filter(kind="train.visit_joined", data__upgrade=driver.pk).exists()
    assert done[driver.pk] == 1
    assert world.reached[driver.pk] - started < dt.timedelta(seconds=2400)
    driver.refresh_from_db()
    # Was cycle 2, ~3000 s in, past the deadline, with an alert advising an emergency train.
    assert (driver.promised_cycle, driver.promised_at - started) == (1, dt.timedelta(seconds=2400))
    assert (at_creation.cycle, at_creation.deadline_met) == (1, True), at_creation.text
    assert (joined.cycle, joined.at) == (1, at_creation.at), joined.text
    assert not Event.objects.filter(kind=ALERT, subject_id=driver.pk).exists()


def test_a_stopped_trains_upgrade_is_not_scheduled_nor_promised_until_the_train_runs() -> None:
    timed_simulator(**{"upgrade:bios:2.16.0": {"seconds": 600}})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2)
        train = make_train(pool, cycle_slo_s=24 * 3600, visit_overhead_s=600)
        operator = make_user()
        train_pause(train_id=train.pk, reason="change freeze for the launch", actor=operator)
        bios = upgrade_create(
            pool=pool, component="bios", version="2.16.0", reason="r", duration_s=600,
            deadline=world.now[0] + dt.timedelta(hours=2),
        )  # fmt: skip
        world.tick(pool, rounds=300, step_s=60.0)  # 5 h pass, the train still paused
        paused = forecast_of(bios)
        promise = upgrade_promise(Upgrade.objects.get(pk=bios.pk), now=world.now[0])
        client = Client()
        client.force_login(make_user(Role.OPERATOR))
        page = client.get("/trains/upgrades/").content.decode()

        train_resume(train_id=train.pk, reason="the launch is out", actor=operator)
        world.tick(pool, rounds=2, step_s=1.0)
        running = forecast_of(bios)

    assert hosts_below_target(bios, [h.pk for h in hosts]).count() == 4  # nothing moved while paused
    # Was scheduled for cycle 1, ~40 min in, deadline met, promised that, and no alert.
    assert (paused.code, paused.cycle, paused.at, paused.deadline_met) == (
        ForecastCode.TRAIN_STOPPED,
        None,
        None,
        False,
    )
    assert paused.text == "its train is paused: not scheduled until it runs"
    assert promise.state == PromiseState.NONE
    alert, *since = Event.objects.filter(kind=ALERT, subject_id=bios.pk).order_by("id")
    assert alert.data["fix"] == DeadlineFix.RESUME_TRAIN, alert.reason
    # Resumed past its deadline: the train's pace misses it now, and the alert says so anew.
    assert [a.data["fix"] for a in since] == [DeadlineFix.NONE_KNOWN]
    assert "is not scheduled while its train is paused, so at risk to reach every host, after its deadline" in (
        alert.reason
    )
    assert "only resuming the train can meet it; resumed now it would meet it: every host by cycle 1" in alert.reason
    assert f'data-forecast="{ForecastCode.TRAIN_STOPPED}"' in page
    assert "replan-hint" not in page  # a replan does not move a stopped train
    # Resumed: the first visit it starts gives the promise.
    assert (running.code, running.cycle) == (ForecastCode.SCHEDULED, 1)
    assert Upgrade.objects.get(pk=bios.pk).promised_cycle == 1


def test_an_upgrade_a_running_visit_refused_as_incompatible_is_not_counted_as_reached_there() -> None:
    # Two racks of 2 hosts; a compatibility rule made after bios 2.16.0 forbids it: visit 1 runs the
    # driver alone and refuses bios (plan["refused"]), whose hosts there are still pending.
    timed_simulator(**{"upgrade:gpu-driver:560.35.03": {"seconds": 600}})
    world = World()
    with clock.use_clock(lambda: world.now[0]):
        pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2)
        train = make_train(pool, cycle_slo_s=24 * 3600, visit_overhead_s=600)
        bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="r", duration_s=600)
        upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="d", duration_s=600)
        forbid_bios_above("2.15.0")
        world.tick(pool, rounds=5, step_s=1.0)
        visit = Visit.objects.get(train=train, cycle__number=1, state=VisitState.RUNNING)

        during = forecast_of(bios)

    assert visit.plan["refused"] == [bios.pk]
    # Was cycle 1 (rack-0001's hosts counted as reached by visit 1), then cycle 2, which no visit
    # keeps either: every visit refuses it, so it is forecast on no host (test_upgrade_forecast_incompatible.py).
    assert (during.code, during.cycle, during.hosts_incompatible) == (ForecastCode.INCOMPATIBLE, None, 4), during.text
