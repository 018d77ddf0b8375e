"""The deadline alert's advice is played before it is given: a larger buffer is advised only when the
forecast with whole domains at once meets the deadline, an emergency train only when the forecast of
one meets it, and when neither does the alert says no change the forecast knows meets it. The first
case is a reviewer's probe (tests/test_probe_h1_advice.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Pool
from opsplanner import clock
from opsplanner.models import Event
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train
from trains.models import Upgrade
from trains.selectors_forecast import upgrades_forecasts
from trains.services.upgrade_forecast import DeadlineFix
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

ALERT = "alert.upgrade_deadline_at_risk"


def one_rack_one_host_at_a_time(*, deadline_s: float, duration_s: int = 600, cycle_slo_s: int = 24 * 3600) -> Upgrade:
    """One rack of 4 hosts, one out at a time: a visit of 4 waves x (600 s overhead + the work)."""
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=1)
    make_train(pool, cycle_slo_s=cycle_slo_s, visit_overhead_s=600)
    return upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="r", duration_s=duration_s,
        deadline=clock.now() + dt.timedelta(seconds=deadline_s),
    )  # fmt: skip


def forecast_of(upgrade: Upgrade):
    return upgrades_forecasts([Upgrade.objects.get(pk=upgrade.pk)])[upgrade.pk]


def test_a_larger_buffer_that_would_still_miss_is_not_advised_and_the_alert_says_nothing_known_meets_it() -> None:
    # Even the whole rack in one wave takes 1200 s, past a deadline 1000 s away; so does an emergency train.
    bios = one_rack_one_host_at_a_time(deadline_s=1000)

    alert = Event.objects.get(kind=ALERT, subject_id=bios.pk)
    assert alert.data["fix"] != DeadlineFix.LARGER_BUFFER, alert.reason
    assert "no change the forecast knows meets it" in alert.reason
    assert "one domain at a time, reaches every host around " in alert.reason
    # The buffer it was advised before, given: the forecast still misses.
    Pool.objects.filter(pk=bios.pool_id).update(planned_buffer_hosts=4)
    assert forecast_of(bios).deadline_met is False


def test_a_larger_buffer_is_advised_with_what_it_gives_and_followed_it_meets_the_deadline() -> None:
    # 4 waves of 1200 s miss a deadline 2000 s away; one wave of the whole rack (1200 s) meets it.
    bios = one_rack_one_host_at_a_time(deadline_s=2000)

    alert = Event.objects.get(kind=ALERT, subject_id=bios.pk)
    assert alert.data["fix"] == DeadlineFix.LARGER_BUFFER, alert.reason
    assert "a planned buffer of 4 hosts (whole domains at once) would meet it: every host by cycle 1" in alert.reason
    Pool.objects.filter(pk=bios.pool_id).update(planned_buffer_hosts=4)
    assert forecast_of(bios).deadline_met is True


def test_an_emergency_train_is_advised_with_what_it_gives_when_the_train_cannot_take_the_upgrade() -> None:
    # A 3000 s flash on a train of 1800 s cycles: no visit of the train can take it, whatever its buffer
    # (it waits beyond the forecast); an emergency train, not bound by the cycle, takes the whole rack
    # in one visit of 3600 s, within the deadline 2 h away.
    bios = one_rack_one_host_at_a_time(deadline_s=2 * 3600, duration_s=3000, cycle_slo_s=1800)

    alert = Event.objects.get(kind=ALERT, subject_id=bios.pk)
    assert alert.data["fix"] == DeadlineFix.EMERGENCY_TRAIN, alert.reason
    assert "an emergency train for this upgrade" in alert.reason
    assert "would meet it: every host around " in alert.reason
