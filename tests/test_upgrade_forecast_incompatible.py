"""An upgrade whose target became incompatible with its hosts (a compatibility rule made after it
was created) is refused by every visit to their domains: the forecast says it cannot be scheduled
there, names how many hosts and why, promises nothing on them, and its deadline is not met."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Component, ComponentVersion, Host, InstalledVersion, Pool
from fleet.services.inventory import component_version_create, installed_version_set
from opsplanner import clock
from opsplanner.models import Event
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.test_train_robustness import forbid_bios_above
from tests.trains_builders import make_train
from trains.models import Train, Upgrade
from trains.selectors_forecast import ForecastCode, UpgradeForecast, upgrades_forecasts
from trains.services.upgrade_forecast import DeadlineFix, upgrades_forecast_check
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

ALERT = "alert.upgrade_deadline_at_risk"
WHY = "bios 2.16.0 does not work with cuda-runtime 12.4.1 (needs [any, 2.15.0])"


def three_racks_of_two() -> tuple[Pool, Train]:
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    return pool, make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)


def bios_rollout(pool: Pool, **fields: object) -> Upgrade:
    return upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200, **fields)  # type: ignore[arg-type]


def forecast_of(upgrade: Upgrade) -> UpgradeForecast:
    return upgrades_forecasts([Upgrade.objects.get(pk=upgrade.pk)])[upgrade.pk]


def rack(pool: Pool, position: int) -> list[Host]:
    return list(pool.hosts.filter(domain__position=position).order_by("id"))


def bios_on(hosts: list[Host]) -> list[str]:
    return [InstalledVersion.objects.get(host=h, component__name="bios").version.version for h in hosts]


def on_cuda_12_6(hosts: list[Host]) -> None:
    """These hosts run a cuda runtime no rule pins: any bios works with it."""
    cuda = Component.objects.get(name="cuda-runtime")
    newer = ComponentVersion.objects.filter(component=cuda, version="12.6.0").first()
    newer = newer or component_version_create(component=cuda, version="12.6.0")
    for host in hosts:
        installed_version_set(host=host, version=newer)


def test_an_upgrade_every_visit_refuses_as_incompatible_cannot_be_scheduled_and_misses_its_deadline() -> None:
    pool, _ = three_racks_of_two()
    bios = bios_rollout(pool, deadline=clock.now() + dt.timedelta(days=2))
    forbid_bios_above("2.15.0")  # cuda 12.4.1, on every host, now works with no bios above 2.15.0

    forecast = forecast_of(bios)

    assert (forecast.code, forecast.cycle, forecast.at) == (ForecastCode.INCOMPATIBLE, None, None)
    assert (forecast.deadline_met, forecast.hosts_incompatible) == (False, 6)
    assert forecast.text.startswith("cannot be scheduled on its 6 hosts below the target: ")
    assert WHY in forecast.text
    # What the train does: every visit refuses it, and no host ever gets it.
    drive_trains(pool, until=lambda: Event.objects.filter(kind="train.visit_upgrade_refused").count() >= 3)
    assert bios_on(list(pool.hosts.order_by("id"))) == ["2.14.0"] * 6


def test_its_deadline_alert_says_no_visit_can_meet_it_until_the_target_is_compatible() -> None:
    pool, _ = three_racks_of_two()
    bios = bios_rollout(pool, deadline=clock.now() + dt.timedelta(days=2))
    forbid_bios_above("2.15.0")

    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    alert = Event.objects.get(kind=ALERT, subject_id=bios.pk)
    assert alert.data["fix"] == DeadlineFix.COMPATIBLE_TARGET
    assert alert.data["hosts_incompatible"] == 6
    assert "every visit refuses it on 6 hosts" in alert.reason
    assert Upgrade.objects.get(pk=bios.pk).promise_made_at is not None  # made at creation, when it was compatible


def test_an_upgrade_refused_on_one_rack_is_forecast_on_the_others_and_says_the_rest_waits() -> None:
    pool, _ = three_racks_of_two()
    on_cuda_12_6(rack(pool, 2) + rack(pool, 3))
    bios = bios_rollout(pool, deadline=clock.now() + dt.timedelta(days=2))
    forbid_bios_above("2.15.0")  # rack 1 only still runs cuda 12.4.1

    forecast = forecast_of(bios)

    assert (forecast.code, forecast.cycle, forecast.at) == (ForecastCode.INCOMPATIBLE, None, None)
    assert (forecast.deadline_met, forecast.hosts_incompatible) == (False, 2)
    assert forecast.text.startswith("cannot be scheduled on 2 of its 6 hosts below the target: ")
    assert WHY in forecast.text
    assert "; reaches the 4 others by cycle 1, around " in forecast.text
    drive_trains(pool, until=lambda: bios_on(rack(pool, 2) + rack(pool, 3)) == ["2.16.0"] * 4)
    assert bios_on(rack(pool, 1)) == ["2.14.0"] * 2
    assert forecast_of(bios).text.startswith("cannot be scheduled on its 2 hosts below the target: ")


def test_one_incompatible_host_keeps_the_upgrade_from_its_whole_rack_as_the_visit_refuses_it_whole() -> None:
    pool, _ = three_racks_of_two()
    first, second = rack(pool, 1)
    on_cuda_12_6([second, *rack(pool, 2), *rack(pool, 3)])
    bios = bios_rollout(pool)
    forbid_bios_above("2.15.0")  # only the first host of rack 1 still runs cuda 12.4.1

    forecast = forecast_of(bios)

    assert (forecast.code, forecast.hosts_incompatible) == (ForecastCode.INCOMPATIBLE, 2)
    assert forecast.deadline_met is None
    assert forecast.text.startswith("cannot be scheduled on 2 of its 6 hosts below the target: ")
    assert "would break a compatibility rule on 1 of them" in forecast.text
    drive_trains(pool, until=lambda: bios_on(rack(pool, 2) + rack(pool, 3)) == ["2.16.0"] * 4)
    assert bios_on([first, second]) == ["2.14.0", "2.14.0"]


def test_an_upgrade_compatible_with_its_hosts_is_scheduled_though_a_rule_names_its_component() -> None:
    pool, _ = three_racks_of_two()
    bios = bios_rollout(pool)
    forbid_bios_above("2.16.0")  # a rule on bios that 2.16.0 keeps

    forecast = forecast_of(bios)

    assert (forecast.code, forecast.cycle, forecast.hosts_incompatible) == (ForecastCode.SCHEDULED, 1, 0)


def test_an_older_release_a_compatible_newer_one_takes_over_is_not_forecast_incompatible() -> None:
    """bios 2.16.0 breaks cuda 12.4.1; the fix 2.16.1 is rolled out and the rule lets cuda 12.4.1 run
    bios up to 2.15.0 or from 2.16.1. Every visit gives the hosts 2.16.1 (the newest release takes
    them), which reaches the 2.16.0 upgrade too: it completes in cycle 1. Its forecast is scheduled,
    with no deadline alert (found in review: it said it could never be scheduled)."""
    from fleet.services.inventory import compatibility_rule_create
    from tests.builders import make_version
    from trains.models import UpgradeState

    pool, _ = three_racks_of_two()
    bios = bios_rollout(pool, deadline=clock.now() + dt.timedelta(days=2))
    make_version(Component.objects.get(name="bios"), "2.16.1")
    upgrade_create(pool=pool, component="bios", version="2.16.1", reason="hotfix", duration_s=1200)
    cuda = ComponentVersion.objects.get(component__name="cuda-runtime", version="12.4.1")
    bios_component = Component.objects.get(name="bios")
    compatibility_rule_create(job_facing_version=cuda, lower_component=bios_component, max_version="2.15.0")
    compatibility_rule_create(job_facing_version=cuda, lower_component=bios_component, min_version="2.16.1")

    forecast = forecast_of(bios)
    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    assert (forecast.code, forecast.cycle, forecast.hosts_incompatible) == (ForecastCode.SCHEDULED, 1, 0), forecast.text
    assert not Event.objects.filter(kind=ALERT, subject_id=bios.pk).exists()
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=bios.pk).state != UpgradeState.ACTIVE)
    assert Upgrade.objects.get(pk=bios.pk).state == UpgradeState.COMPLETED
    assert not Event.objects.filter(kind="train.visit_upgrade_refused").exists()


def test_a_canary_rack_every_visit_refuses_holds_its_phase_with_an_alert_that_says_why() -> None:
    """The canary phase's rack has a host the target became incompatible with: every visit to it
    refuses the step, so the canary can never show its success. The phase holds with an alert naming
    the refusal (found in review: counted as pending, it waited for ever without a word)."""
    pool, _ = three_racks_of_two()
    _first, second = rack(pool, 1)
    on_cuda_12_6([second, *rack(pool, 2), *rack(pool, 3)])  # only the first host keeps cuda 12.4.1
    bios = bios_rollout(
        pool, phases=[{"name": "canary", "domain": "rack-0001"}, {"name": "rest", "percent": 100, "min_successes": 0}]
    )
    forbid_bios_above("2.15.0")

    drive_trains(pool, until=lambda: Event.objects.filter(kind="alert.upgrade_phase_held").exists())

    [alert] = Event.objects.filter(kind="alert.upgrade_phase_held", subject_id=bios.pk)
    assert alert.data["code"] == "too_few_hosts"
    assert f"2 more are in domains whose visits refuse it as incompatible: {WHY}" in alert.reason
    assert bios_on(rack(pool, 1) + rack(pool, 2) + rack(pool, 3)) == ["2.14.0"] * 6  # the rollout did not widen
