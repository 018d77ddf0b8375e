"""A deadline alert says why the deadline is missed and what would meet it (its fix). The upgrade is
alerted once per cause: when that cause goes away (the held phase is skipped, the train resumes) and
the deadline is still missed for another reason, the operator hears the new advice; when the
forecast meets the deadline again, the alert is resolved (`upgrade.deadline_back_on_track`) and a
later miss is alerted again."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import transaction

from opsplanner import clock
from opsplanner.models import Event
from opsplanner.services.approvals import approval_decide
from tests.driving import in_threads
from tests.test_forecast_phase_held import a_canary_rack_that_cannot_succeed, forecast_of
from tests.test_upgrade_forecast import create, one_upgrade_per_visit
from tests.trains_builders import make_user
from trains.models import Upgrade
from trains.selectors_forecast import ForecastCode
from trains.services.phases import upgrade_phase_skip_request
from trains.services.tick import train_tick
from trains.services.trains import train_pause, train_resume
from trains.services.upgrade_forecast import DeadlineFix, upgrades_forecast_check

pytestmark = pytest.mark.django_db

ALERT = "alert.upgrade_deadline_at_risk"
BACK = "upgrade.deadline_back_on_track"


def fixes_alerted(upgrade: Upgrade) -> list[str]:
    return [e.data["fix"] for e in Event.objects.filter(kind=ALERT, subject_id=upgrade.pk).order_by("id")]


def back_on_track(upgrade: Upgrade) -> list[Event]:
    return list(Event.objects.filter(kind=BACK, subject_id=upgrade.pk))


def skip_the_held_phase(upgrade: Upgrade) -> None:
    approval = upgrade_phase_skip_request(upgrade_id=upgrade.pk, reason="got it by hand", actor=make_user())
    approval_decide(approval_id=approval.pk, approve=True, reason="checked", actor=make_user())


def a_held_canary_due_in(due: dt.timedelta) -> tuple[int, Upgrade]:
    """A canary phase held short of evidence, alerted with the fix to skip it; due `due` from now."""
    pool, _, upgrade = a_canary_rack_that_cannot_succeed("already at the target")
    Upgrade.objects.filter(pk=upgrade.pk).update(deadline=clock.now() + due)  # as created, not a replan
    upgrades_forecast_check(pool_id=pool.pk, now=clock.now())
    assert fixes_alerted(upgrade) == [DeadlineFix.SKIP_PHASE]
    return pool.pk, upgrade


def test_a_skipped_phase_that_still_misses_the_deadline_alerts_again_with_the_new_advice() -> None:
    pool_id, upgrade = a_held_canary_due_in(dt.timedelta(minutes=30))

    skip_the_held_phase(upgrade)
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())

    assert forecast_of(upgrade).code == ForecastCode.SCHEDULED
    assert fixes_alerted(upgrade) == [DeadlineFix.SKIP_PHASE, DeadlineFix.NONE_KNOWN]
    assert Upgrade.objects.get(pk=upgrade.pk).deadline_alert_fixes == [DeadlineFix.SKIP_PHASE, DeadlineFix.NONE_KNOWN]
    assert back_on_track(upgrade) == []
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())  # the same cause: said once
    assert len(fixes_alerted(upgrade)) == 2


def test_a_skipped_phase_that_meets_the_deadline_says_it_is_back_on_track_and_clears_the_mark() -> None:
    pool_id, upgrade = a_held_canary_due_in(dt.timedelta(days=2))

    skip_the_held_phase(upgrade)
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())  # said once

    [back] = back_on_track(upgrade)
    assert (back.data["fix"], back.data["forecast_cycle"]) == (DeadlineFix.SKIP_PHASE, 1)  # what it resolves
    assert back.reason.startswith(f"upgrade #{upgrade.pk} ({upgrade.component_version}) meets its deadline again: ")
    assert "reaches every host by cycle 1" in back.reason
    assert Upgrade.objects.values_list("deadline_alerted_at", "deadline_alert_fixes").get(pk=upgrade.pk) == (None, [])


def test_a_forecast_that_meets_the_deadline_narrowly_leaves_the_alert_in_force() -> None:
    # One hovering at the deadline would say "at risk" and "back on track" in turn at every check.
    pool_id, upgrade = a_held_canary_due_in(dt.timedelta(days=2))
    skip_the_held_phase(upgrade)
    at = forecast_of(upgrade).at
    assert at is not None

    Upgrade.objects.filter(pk=upgrade.pk).update(deadline=at + dt.timedelta(minutes=10))
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())
    assert back_on_track(upgrade) == []
    assert Upgrade.objects.get(pk=upgrade.pk).deadline_alert_fixes == [DeadlineFix.SKIP_PHASE]

    Upgrade.objects.filter(pk=upgrade.pk).update(deadline=at + dt.timedelta(days=1))
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())
    assert len(back_on_track(upgrade)) == 1


def test_a_deadline_missed_again_after_it_was_back_on_track_is_alerted_again() -> None:
    pool_id, upgrade = a_held_canary_due_in(dt.timedelta(days=2))
    skip_the_held_phase(upgrade)
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())
    assert len(back_on_track(upgrade)) == 1

    Upgrade.objects.filter(pk=upgrade.pk).update(deadline=clock.now() + dt.timedelta(minutes=30))
    upgrades_forecast_check(pool_id=pool_id, now=clock.now())

    assert fixes_alerted(upgrade) == [DeadlineFix.SKIP_PHASE, DeadlineFix.NONE_KNOWN]


def test_a_resumed_train_whose_upgrade_still_misses_its_deadline_alerts_with_the_advice_that_now_applies() -> None:
    pool, train = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)
    train_pause(train_id=train.pk, reason="change freeze", actor=make_user())
    late = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(hours=2))
    assert fixes_alerted(late) == [DeadlineFix.RESUME_TRAIN]

    train_resume(train_id=train.pk, reason="freeze over", actor=make_user())
    train_tick(train_id=train.pk)  # the first visit once resumed judges the deadline again

    assert fixes_alerted(late) == [DeadlineFix.RESUME_TRAIN, DeadlineFix.RAISE_PRIORITY]
    train_tick(train_id=train.pk)
    assert len(fixes_alerted(late)) == 2


def test_a_cause_that_comes_back_is_not_alerted_again() -> None:
    # A nightly freeze: paused, judged, resumed, judged, over and over. Each cause is said once.
    pool, train = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)
    late = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(hours=2))
    for _ in range(3):
        train_pause(train_id=train.pk, reason="change freeze", actor=make_user())
        upgrades_forecast_check(pool_id=pool.pk, now=clock.now())
        train_resume(train_id=train.pk, reason="freeze over", actor=make_user())
        upgrades_forecast_check(pool_id=pool.pk, now=clock.now())

    assert sorted(fixes_alerted(late)) == sorted([DeadlineFix.RAISE_PRIORITY, DeadlineFix.RESUME_TRAIN])


def two_checks_racing(pool_id: int) -> None:
    start = threading.Barrier(2)

    def check() -> None:
        start.wait(30)
        with transaction.atomic():  # as the tick runs it
            upgrades_forecast_check(pool_id=pool_id, now=clock.now())

    assert in_threads(check, check) == []


@pytest.mark.django_db(transaction=True)
def test_two_checks_racing_after_the_cause_changed_alert_once() -> None:
    pool_id, upgrade = a_held_canary_due_in(dt.timedelta(minutes=30))
    skip_the_held_phase(upgrade)

    two_checks_racing(pool_id)

    assert fixes_alerted(upgrade) == [DeadlineFix.SKIP_PHASE, DeadlineFix.NONE_KNOWN]


@pytest.mark.django_db(transaction=True)
def test_two_checks_racing_once_the_deadline_is_met_again_say_it_is_back_on_track_once() -> None:
    pool_id, upgrade = a_held_canary_due_in(dt.timedelta(days=2))
    skip_the_held_phase(upgrade)

    two_checks_racing(pool_id)

    assert len(back_on_track(upgrade)) == 1
