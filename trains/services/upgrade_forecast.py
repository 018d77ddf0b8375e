"""Promises and deadlines, from one forecast of the pool.

Each upgrade's first forecast is kept as its promise (`promised_cycle`, `promised_at`), made once, to
be held against when every host ran it (trains.selectors_forecast.upgrade_promise). An upgrade whose
forecast misses its deadline raises an alert that says what would meet it (a higher priority, a
larger buffer, an emergency train, resuming its stopped train), once (deadline_alerted_at). A paused
or autostopped train promises nothing: the first visit it starts once resumed does. Runs in the caller's transaction;
one query while every upgrade of the pool has its promise and none waits on a deadline."""

from __future__ import annotations

import datetime as dt

from django.db.models import Q, TextChoices

from opsplanner.events import event_record
from trains.limits import MAX_UPGRADE_PRIORITY
from trains.models import Upgrade, UpgradeState
from trains.selectors_forecast import (
    ForecastCode,
    PoolBacklog,
    UpgradeForecast,
    play_forward,
    pool_backlogs,
    upgrade_forecast_of,
)
from trains.services.actor import ACTOR

TOP_PRIORITY = MAX_UPGRADE_PRIORITY


class DeadlineFix(TextChoices):
    RAISE_PRIORITY = "raise_priority", "Raise its priority"
    LARGER_BUFFER = "larger_buffer", "A larger planned buffer"
    EMERGENCY_TRAIN = "emergency_train", "An emergency train"
    RETURN_HOSTS = "return_hosts", "Repair and return the hosts escalated to a human"
    RESUME_TRAIN = "resume_train", "Resume the pool's paused or autostopped train"
    WHOLE_VISITS = "whole_visits", "Take every host of a domain per visit (not multi-cycle)"


def upgrades_forecast_check(*, pool_id: int, now: dt.datetime) -> list[int]:
    """Give each active upgrade of the pool that has none its promise, and alert for each whose
    deadline the forecast misses (not alerted before); the ids alerted. The train tick and the
    creation of an upgrade ask it; without a train it waits for one, and a stopped train's upgrades
    get no promise until it runs (their deadlines are at risk meanwhile)."""
    rows = list(
        Upgrade.objects.filter(pool_id=pool_id, state=UpgradeState.ACTIVE, emergency=False)
        .filter(Q(promise_made_at__isnull=True) | Q(deadline__isnull=False, deadline_alerted_at__isnull=True))
        .order_by("id")  # written in id order, as every writer of several upgrades (no deadlock)
        .values_list("id", "deadline", "deadline_alerted_at", "promise_made_at")
    )
    if not rows:
        return []
    backlogs, _ = pool_backlogs([pool_id], now=now)
    backlog = backlogs.get(pool_id)
    if backlog is None:
        return []  # no running train: the upgrade page says "not scheduled"
    done = {} if backlog.stopped else play_forward(backlog, now=now)  # a stopped train promises nothing
    _promises_make(backlog, [upgrade_id for upgrade_id, _, _, made in rows if made is None], done, now)
    alerted = []
    by_id = {u.pk: u for u in backlog.upgrades}
    for upgrade_id, deadline, alerted_at, _ in rows:
        if deadline is None or alerted_at is not None or upgrade_id not in by_id:
            continue
        forecast = upgrade_forecast_of(by_id[upgrade_id], backlog, done)
        if forecast.deadline_met is not False:
            continue
        # Guarded on the state too: an upgrade offboarded since the read gets no alert.
        active = Upgrade.objects.filter(pk=upgrade_id, state=UpgradeState.ACTIVE)
        if active.filter(deadline_alerted_at__isnull=True).update(deadline_alerted_at=now):
            _alert(backlog, by_id[upgrade_id], deadline, forecast, now)
            alerted.append(upgrade_id)
    return alerted


def _promises_make(backlog: PoolBacklog, upgrade_ids: list[int], done: dict, now: dt.datetime) -> None:
    """Record the forecast of each of these upgrades as its promise (guarded: made once) with an event."""
    by_id = {u.pk: u for u in backlog.upgrades}
    for upgrade_id in upgrade_ids:
        upgrade = by_id.get(upgrade_id)
        if upgrade is None:
            continue
        forecast = upgrade_forecast_of(upgrade, backlog, done)
        if forecast.code not in (ForecastCode.SCHEDULED, ForecastCode.BEYOND_HORIZON):
            continue
        if not Upgrade.objects.filter(pk=upgrade_id, state=UpgradeState.ACTIVE, promise_made_at__isnull=True).update(
            promise_made_at=now, promised_cycle=forecast.cycle, promised_at=forecast.at
        ):
            continue  # another tick made it, or it was offboarded since the read
        event_record(
            kind="upgrade.promised",
            subject=upgrade,
            actor=ACTOR,
            reason=f"upgrade #{upgrade.pk} ({upgrade.component_version}) {forecast.text}",
            pool_id=upgrade.pool_id,
            data={
                "upgrade": upgrade.pk,
                "cycle": forecast.cycle,
                "at": forecast.at.isoformat() if forecast.at else None,
            },
        )


def _alert(
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, forecast: UpgradeForecast, now: dt.datetime
) -> None:
    fix, advice = _what_would_meet(backlog, upgrade, deadline, forecast, now)
    if forecast.hosts_escalated and fix != DeadlineFix.RETURN_HOSTS:
        advice += f"; the {forecast.hosts_escalated} hosts escalated to a human must also be returned in time"
    if forecast.code == ForecastCode.TRAIN_STOPPED:
        state = backlog.train.get_state_display().lower()
        reached = f"is not scheduled while its train is {state}, so at risk to reach every host"
    elif forecast.code == ForecastCode.WAITS_FOR_HUMAN:
        reached = (
            f"is on every host a visit can take; the {forecast.hosts_escalated} escalated to a human keep it from "
            "every host"
        )
    else:
        when = f"by cycle {forecast.cycle}, around {forecast.at:%Y-%m-%d %H:%M} UTC" if forecast.at else None
        reached = f"reaches every host {when or 'not within the forecast'}"
    event_record(
        kind="alert.upgrade_deadline_at_risk",
        subject=upgrade,
        actor=ACTOR,
        reason=f"upgrade #{upgrade.pk} ({upgrade.component_version}) {reached}, after its deadline "
        f"{deadline:%Y-%m-%d %H:%M} UTC; {advice}",
        pool_id=upgrade.pool_id,
        data={
            "upgrade": upgrade.pk,
            "deadline": deadline.isoformat(),
            "forecast_at": forecast.at.isoformat() if forecast.at else None,
            "forecast_cycle": forecast.cycle,
            "hosts_escalated": forecast.hosts_escalated,
            "fix": fix,
        },
    )


def _what_would_meet(
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, forecast: UpgradeForecast, now: dt.datetime
) -> tuple[str, str]:
    """The cheapest change the forecast says would meet the deadline, as (code, advice)."""
    if forecast.code == ForecastCode.TRAIN_STOPPED:
        return DeadlineFix.RESUME_TRAIN, _resumed_advice(backlog, upgrade, deadline, now)
    if forecast.code == ForecastCode.WAITS_FOR_HUMAN:
        return DeadlineFix.RETURN_HOSTS, (
            f"only repairing and returning the {forecast.hosts_escalated} hosts escalated to a human would meet it: "
            "each is reached at its domain's first visit after it returns"
        )
    if upgrade.priority < TOP_PRIORITY:
        raised = play_forward(backlog, now=now, priorities={upgrade.pk: TOP_PRIORITY}).get(upgrade.pk)
        if raised is not None and raised[1] <= deadline:
            return DeadlineFix.RAISE_PRIORITY, (
                f"raising its priority to {TOP_PRIORITY} (now {upgrade.priority}) would meet it: every host by "
                f"cycle {raised[0]}, around {raised[1]:%Y-%m-%d %H:%M} UTC"
            )
    sizing = backlog.sizing
    if upgrade.multi_cycle and upgrade.hosts_per_visit and upgrade.hosts_per_visit < sizing.largest_domain:
        # Its hosts_per_visit, not the visits' length, sets its pace: a larger buffer changes nothing.
        whole = play_forward(
            backlog, now=now, priorities={upgrade.pk: TOP_PRIORITY}, whole_visits=frozenset([upgrade.pk])
        ).get(upgrade.pk)
        if whole is not None and whole[1] <= deadline:
            return DeadlineFix.WHOLE_VISITS, (
                f"even first in line its {upgrade.hosts_per_visit} hosts per visit miss it; taking every host of a "
                f"domain per visit (not multi-cycle), first in line, would meet it: every host by cycle {whole[0]}, "
                f"around {whole[1]:%Y-%m-%d %H:%M} UTC"
            )
    elif sizing.waves(sizing.largest_domain) > 1:
        hosts = sizing.largest_domain * backlog.train.visit_concurrency
        return DeadlineFix.LARGER_BUFFER, (
            f"even first in line the train's pace misses it; a planned buffer of {hosts} hosts (whole domains at "
            "once) or an emergency train would shorten the visits"
        )
    return DeadlineFix.EMERGENCY_TRAIN, (
        "even first in line the train's pace misses it; an emergency train for this upgrade (approved by a second "
        "operator, larger domains, down to the hard floor) would meet it"
    )


def _resumed_advice(backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, now: dt.datetime) -> str:
    """What resuming the stopped train now would give the upgrade (played as if it ran)."""
    resumed = play_forward(backlog, now=now).get(upgrade.pk)
    if resumed is None:
        return "only resuming the train can meet it, and resumed now it reaches every host beyond the forecast"
    cycle, at = resumed
    verdict = "would meet it" if at <= deadline else "would still miss it"
    return (
        f"only resuming the train can meet it; resumed now it {verdict}: every host by cycle {cycle}, "
        f"around {at:%Y-%m-%d %H:%M} UTC"
    )
