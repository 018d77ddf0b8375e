"""An upgrade whose rollout phase in force is held (its hosts cannot show the evidence it needs) waits
for an operator: no visit takes the hosts outside the phase. Its forecast says so (`phase_held`) with
why, gives no cycle or date for every host, promises nothing, misses its deadline, and the deadline
alert's fix is to skip the phase. Once the hold lifts, the forecast schedules it again."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client

from fleet.models import Host, HostState, Pool
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from opsplanner.services.approvals import approval_decide
from tests.api_helpers import token_client
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.test_train_robustness import forbid_bios_above
from tests.test_upgrade_forecast_incompatible import WHY, on_cuda_12_6, rack
from tests.test_upgrade_phase_evidence import already_upgraded, phase_of
from tests.trains_builders import make_train, make_user
from trains.models import Train, Upgrade
from trains.models.upgrades import PhaseHoldCode
from trains.selectors_forecast import ForecastCode, UpgradeForecast, upgrades_forecasts
from trains.services.phases import upgrade_phase_skip_request
from trains.services.tick import train_tick
from trains.services.upgrade_forecast import DeadlineFix, upgrades_forecast_check
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

ALERT = "alert.upgrade_deadline_at_risk"
HELD = "its rollout holds at phase canary, short of evidence: the hosts outside it wait for an operator"


def forecast_of(upgrade: Upgrade) -> UpgradeForecast:
    return upgrades_forecasts([Upgrade.objects.get(pk=upgrade.pk)])[upgrade.pk]


def a_canary_rack_that_cannot_succeed(why: str) -> tuple[Pool, Train, Upgrade]:
    """Three racks of two; bios 2.16.0 with a fixed canary phase on rack-0001 whose hosts already run
    it, are escalated to a human, or are refused as incompatible. Made before the pool's train (no
    promise yet); the train's first tick holds the canary."""
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=3)  # two escalated: no autostop
    canary = rack(pool, 1)
    if why == "already at the target":
        already_upgraded(canary)
    elif why == "incompatible":
        on_cuda_12_6(rack(pool, 2) + rack(pool, 3))
    upgrade = upgrade_create(
        pool=pool,
        component="bios",
        version="2.16.0",
        reason="rollout",
        duration_s=1200,
        deadline=clock.now() + dt.timedelta(days=2),
        phases=[{"name": "canary", "domain": "rack-0001"}, {"name": "rest", "percent": 100, "min_successes": 0}],
    )
    if why == "escalated":
        Host.objects.filter(pk__in=[h.pk for h in canary]).update(state=HostState.ESCALATED)
    elif why == "incompatible":
        forbid_bios_above("2.15.0")  # rack-0001 alone still runs cuda 12.4.1
    train = make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)
    train_tick(train_id=train.pk)
    assert phase_of(upgrade).held_code == PhaseHoldCode.TOO_FEW_HOSTS
    return pool, train, upgrade


@pytest.mark.parametrize(
    ("why", "escalated", "incompatible"),
    [("already at the target", 0, 0), ("escalated", 2, 0), ("incompatible", 0, 2)],
)
def test_it_forecasts_a_held_phase_with_no_date_no_promise_and_a_deadline_alert_to_skip_it(
    why: str, escalated: int, incompatible: int
) -> None:
    pool, _, upgrade = a_canary_rack_that_cannot_succeed(why)

    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    forecast = forecast_of(upgrade)
    assert (forecast.code, forecast.cycle, forecast.at, forecast.deadline_met) == (
        ForecastCode.PHASE_HELD,
        None,
        None,
        False,
    ), forecast.text
    assert (forecast.hosts_escalated, forecast.hosts_incompatible) == (escalated, incompatible)
    assert forecast.text.startswith(f"{HELD}; misses its deadline ")
    assert f"; held as {phase_of(upgrade).held_reason}" in forecast.text  # the operator sees why
    assert Upgrade.objects.get(pk=upgrade.pk).promise_made_at is None
    assert not Event.objects.filter(kind="upgrade.promised", subject_id=upgrade.pk).exists()
    alert = Event.objects.get(kind=ALERT, subject_id=upgrade.pk)
    assert alert.data["fix"] == DeadlineFix.SKIP_PHASE
    assert (alert.data["forecast_at"], alert.data["forecast_cycle"]) == (None, None)
    assert "cannot reach every host: its rollout holds at phase canary, short of evidence" in alert.reason
    assert "no visit reaches the hosts outside phase canary until an operator skips it" in alert.reason


def test_its_alert_says_a_skip_now_would_meet_the_deadline() -> None:
    pool, _, upgrade = a_canary_rack_that_cannot_succeed("already at the target")

    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    alert = Event.objects.get(kind=ALERT, subject_id=upgrade.pk).reason
    assert "skipped now it would meet it: every host by cycle 1, around " in alert


def test_its_alert_says_a_canary_refused_as_incompatible_still_misses_it_once_skipped() -> None:
    pool, _, upgrade = a_canary_rack_that_cannot_succeed("incompatible")

    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    alert = Event.objects.get(kind=ALERT, subject_id=upgrade.pk).reason
    assert "even skipped, every visit refuses it on 2 hosts as incompatible" in alert
    assert WHY in forecast_of(upgrade).text  # the hold's reason names the refusal


def test_once_the_held_phase_is_skipped_the_forecast_schedules_it_again_and_promises_that() -> None:
    pool, _, upgrade = a_canary_rack_that_cannot_succeed("already at the target")
    assert forecast_of(upgrade).code == ForecastCode.PHASE_HELD
    approval = upgrade_phase_skip_request(upgrade_id=upgrade.pk, reason="rack-0001 got it by hand", actor=make_user())

    approval_decide(approval_id=approval.pk, approve=True, reason="checked", actor=make_user())
    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    forecast = forecast_of(upgrade)
    assert (forecast.code, forecast.cycle, forecast.deadline_met) == (ForecastCode.SCHEDULED, 1, True), forecast.text
    assert forecast.at is not None
    assert forecast.text.startswith("reaches every host by cycle 1, around ")
    promised = Upgrade.objects.get(pk=upgrade.pk)
    assert (promised.promised_cycle, promised.promised_at is not None) == (1, True)


def test_once_the_escalated_canary_hosts_return_the_hold_lifts_and_the_forecast_schedules_it_again() -> None:
    pool, train, upgrade = a_canary_rack_that_cannot_succeed("escalated")
    assert forecast_of(upgrade).code == ForecastCode.PHASE_HELD
    Host.objects.filter(pk__in=[h.pk for h in rack(pool, 1)]).update(state=HostState.IN_SERVICE)

    train_tick(train_id=train.pk)

    assert phase_of(upgrade).held_code == ""
    forecast = forecast_of(upgrade)
    assert (forecast.code, forecast.cycle, forecast.deadline_met) == (ForecastCode.SCHEDULED, 1, True), forecast.text
    assert Upgrade.objects.get(pk=upgrade.pk).promised_cycle == 1


def test_the_api_and_the_upgrade_page_show_the_held_phase_forecast_with_no_replan_hint() -> None:
    _, _, upgrade = a_canary_rack_that_cannot_succeed("already at the target")
    api = token_client(make_user(Role.VIEWER))
    page = Client()
    page.force_login(make_user(Role.OPERATOR))

    shown = api.get(f"/api/upgrades/{upgrade.pk}/").json()["forecast"]
    html = page.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()

    assert (shown["code"], shown["cycle"], shown["at"], shown["deadline_met"]) == ("phase_held", None, None, False)
    assert shown["text"].startswith(HELD)
    assert f'data-forecast="{ForecastCode.PHASE_HELD}"' in html
    assert "its rollout holds at phase canary, short of evidence" in html
    assert "replan-hint" not in html  # a replan does not lift a hold
