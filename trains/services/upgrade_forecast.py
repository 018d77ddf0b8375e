"""Promises and deadlines, from one forecast of the pool.

Each upgrade's first forecast is kept as its promise (`promised_cycle`, `promised_at`), made once, to
be held against when every host ran it (trains.selectors_promise.upgrade_promise). An upgrade whose
forecast misses its deadline raises an alert that says what would meet it (a higher priority, a
larger buffer, an emergency train, resuming its stopped train), each played forward before it is
advised, or that no change the forecast knows meets it; once per cause (deadline_alerted_at and
deadline_alert_fixes, the fixes alerted: again for a cause not alerted yet, when the one alerted is
gone and another misses it, but not for one that comes back), and once the forecast meets it again
by a margin, an event says it is back on track and the mark is cleared. An upgrade every
visit refuses on some hosts as incompatible promises nothing until they are compatible, nor one whose
phase in force is held until the hold lifts (its alert's fix: skip the phase). A paused
or autostopped train promises nothing: the first visit it starts once resumed does. Runs in the caller's transaction;
one query while every upgrade of the pool has its promise and none has a deadline (one with a
deadline, alerted or not, is judged at each check: its cause may change or go away)."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from django.db.models import Q, TextChoices

from opsplanner.events import event_record
from trains.limits import MAX_UPGRADE_PRIORITY
from trains.models import Pace, Train, Upgrade, UpgradeState
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
    # Nothing the forecast plays meets the deadline; the advice says what the closest, an emergency
    # train, would give (a code of its own: integrations must not read "would meet it" into it).
    NONE_KNOWN = "none_known", "No change the forecast knows meets it"
    RETURN_HOSTS = "return_hosts", "Repair and return the hosts escalated to a human"
    RESUME_TRAIN = "resume_train", "Resume the pool's paused or autostopped train"
    WHOLE_VISITS = "whole_visits", "Take every host of a domain per visit (not multi-cycle)"
    # Every visit refuses it on some hosts (ForecastCode.INCOMPATIBLE): nothing a train does meets it.
    COMPATIBLE_TARGET = "compatible_target", "A target compatible with its hosts, or the rule or their versions changed"
    # Its phase in force is held short of evidence (ForecastCode.PHASE_HELD): no visit widens the rollout.
    SKIP_PHASE = "skip_phase", "Skip the held phase (a second operator approves) or widen its selection"


# Why a deadline is missed, named by the fix its alert gives: a block of its own for each of these
# forecasts; otherwise the train's pace, whose advice (priority, buffer, whole visits, emergency
# train, none known) is played once, as that cause is first alerted, not at every visit start.
BLOCKED_FIXES: dict[str, str] = {
    ForecastCode.PHASE_HELD: DeadlineFix.SKIP_PHASE,
    ForecastCode.TRAIN_STOPPED: DeadlineFix.RESUME_TRAIN,
    ForecastCode.INCOMPATIBLE: DeadlineFix.COMPATIBLE_TARGET,
    ForecastCode.WAITS_FOR_HUMAN: DeadlineFix.RETURN_HOSTS,
}


def upgrades_forecast_check(*, pool_id: int, now: dt.datetime) -> list[int]:
    """Give each active upgrade of the pool that has none its promise, and alert for each whose
    deadline the forecast misses, once per cause (`_deadline_judge`); the ids alerted. The train
    tick and the creation of an upgrade ask it; without a train it waits for one, and a stopped
    train's upgrades get no promise until it runs (their deadlines are at risk meanwhile)."""
    rows = list(
        Upgrade.objects.filter(pool_id=pool_id, state=UpgradeState.ACTIVE, emergency=False)
        .filter(Q(promise_made_at__isnull=True) | Q(deadline__isnull=False))
        .order_by("id")  # written in id order, as every writer of several upgrades (no deadlock)
        .values_list("id", "deadline", "deadline_alert_fixes", "promise_made_at")
    )
    if not rows:
        return []
    backlogs, _ = pool_backlogs([pool_id], now=now)
    backlog = backlogs.get(pool_id)
    if backlog is None:
        return []  # no running train: the upgrade page says "not scheduled"
    done = {} if backlog.stopped else play_forward(backlog, now=now)  # a stopped train promises nothing
    _promises_make(backlog, [upgrade_id for upgrade_id, _, _, made in rows if made is None], done, now)
    by_id = {u.pk: u for u in backlog.upgrades}
    return [
        upgrade_id
        for upgrade_id, deadline, alerted, _ in rows
        if deadline is not None
        and upgrade_id in by_id
        and _deadline_judge(backlog, by_id[upgrade_id], deadline, alerted, done, now)
    ]


def _deadline_judge(
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, alerted: list[str], done: dict, now: dt.datetime
) -> bool:
    """Alert when the forecast misses the deadline for a cause not alerted yet (`alerted`, the fixes
    alerted since the mark was last cleared: none, or the hold lifted, the train resumed, the hosts
    returned, and another cause misses it; a cause that comes back, a train paused again, is not
    alerted twice), saying once that it is back on track when the forecast meets it again; True when
    alerted. Each mark is guarded on the fixes read, so of two checks racing one alerts, or says so."""
    forecast = upgrade_forecast_of(upgrade, backlog, done)
    if forecast.deadline_met is not False and not alerted:
        return False
    # Guarded on the state too: an upgrade offboarded since the read gets no alert.
    mark = Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.ACTIVE, deadline_alert_fixes=alerted)
    if forecast.deadline_met is not False:
        if _clear_of(deadline, forecast, now) and mark.update(deadline_alerted_at=None, deadline_alert_fixes=[]):
            _back_on_track(upgrade, alerted[-1], forecast)
        return False
    if _alerted_for(alerted, forecast):
        return False
    fix, advice = _what_would_meet(backlog, upgrade, deadline, forecast, now)
    if not mark.update(deadline_alerted_at=now, deadline_alert_fixes=[*alerted, fix]):
        return False
    _alert(backlog, upgrade, deadline, forecast, fix, advice)
    return True


# An alert in force is resolved only by a forecast that meets the deadline with room to spare: one
# that hovers at it, moving by a visit's length as visits are measured, would otherwise say "at risk"
# and "back on track" in turn at every visit start.
BACK_ON_TRACK_MARGIN = dt.timedelta(hours=1)
BACK_ON_TRACK_SHARE = 0.1  # of the time left to the deadline, when that is more


def _clear_of(deadline: dt.datetime, forecast: UpgradeForecast, now: dt.datetime) -> bool:
    """Whether the forecast meets the deadline by the margin that resolves an alert in force."""
    margin = max(BACK_ON_TRACK_MARGIN, (deadline - now) * BACK_ON_TRACK_SHARE)
    return forecast.at is not None and forecast.at <= deadline - margin


def _alerted_for(alerted: list[str], forecast: UpgradeForecast) -> bool:
    """Whether the cause of this forecast's miss was alerted already: its block's fix, or for the
    train's pace any pace fix."""
    blocked = BLOCKED_FIXES.get(forecast.code)
    if blocked:
        return blocked in alerted
    return any(fix not in BLOCKED_FIXES.values() for fix in alerted)


def _back_on_track(upgrade: Upgrade, alerted_fix: str, forecast: UpgradeForecast) -> None:
    event_record(
        kind="upgrade.deadline_back_on_track",
        subject=upgrade,
        actor=ACTOR,
        reason=f"upgrade #{upgrade.pk} ({upgrade.component_version}) meets its deadline again: {forecast.text}",
        pool_id=upgrade.pool_id,
        data={
            "upgrade": upgrade.pk,
            "fix": alerted_fix,  # what the alert it resolves advised
            "forecast_at": forecast.at.isoformat() if forecast.at else None,
            "forecast_cycle": forecast.cycle,
        },
    )


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
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, forecast: UpgradeForecast, fix: str, advice: str
) -> None:
    if forecast.hosts_escalated and fix != DeadlineFix.RETURN_HOSTS:
        advice += f"; the {forecast.hosts_escalated} hosts escalated to a human must also be returned in time"
    if forecast.code == ForecastCode.TRAIN_STOPPED:
        state = backlog.train.get_state_display().lower()
        reached = f"is not scheduled while its train is {state}, so at risk to reach every host"
    elif forecast.code == ForecastCode.PHASE_HELD:
        phase = backlog.held[upgrade.pk].name
        reached = f"cannot reach every host: its rollout holds at phase {phase}, short of evidence"
    elif forecast.code == ForecastCode.INCOMPATIBLE:
        refused = forecast.hosts_incompatible
        reached = f"cannot reach every host: every visit refuses it on {refused} hosts as incompatible"
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
            "hosts_incompatible": forecast.hosts_incompatible,
            "fix": fix,
        },
    )


def _what_would_meet(
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, forecast: UpgradeForecast, now: dt.datetime
) -> tuple[str, str]:
    """The cheapest change the forecast says would meet the deadline, as (code, advice): each is
    played before it is advised (an advice followed that still missed was the reviewer's finding),
    and when none the forecast knows meets it, the emergency train, which comes closest, with what it
    would give."""
    if forecast.code == ForecastCode.PHASE_HELD:
        return DeadlineFix.SKIP_PHASE, _skipped_advice(backlog, upgrade, deadline, now)
    if forecast.code == ForecastCode.TRAIN_STOPPED:
        return DeadlineFix.RESUME_TRAIN, _resumed_advice(backlog, upgrade, deadline, now)
    if forecast.code == ForecastCode.INCOMPATIBLE:
        return DeadlineFix.COMPATIBLE_TARGET, (
            "no visit can meet it: only a target compatible with those hosts (a new upgrade), or the "
            "compatibility rule or the hosts' job-facing versions changed, lets the visits take them"
        )
    if forecast.code == ForecastCode.WAITS_FOR_HUMAN:
        return DeadlineFix.RETURN_HOSTS, (
            f"only repairing and returning the {forecast.hosts_escalated} hosts escalated to a human would meet it: "
            "each is reached at its domain's first visit after it returns"
        )
    if upgrade.priority < TOP_PRIORITY:
        raised = play_forward(backlog, now=now, priorities={upgrade.pk: TOP_PRIORITY}).get(upgrade.pk)
        if _meets(raised, deadline):
            return DeadlineFix.RAISE_PRIORITY, (
                f"raising its priority to {TOP_PRIORITY} (now {upgrade.priority}) would meet it: {_by(raised)}"
            )
    sizing = backlog.sizing
    if upgrade.multi_cycle and upgrade.hosts_per_visit and upgrade.hosts_per_visit < sizing.largest_domain:
        # Its hosts_per_visit, not the visits' length, sets its pace: a larger buffer changes nothing.
        whole = play_forward(
            backlog, now=now, priorities={upgrade.pk: TOP_PRIORITY}, whole_visits=frozenset([upgrade.pk])
        ).get(upgrade.pk)
        if _meets(whole, deadline):
            return DeadlineFix.WHOLE_VISITS, (
                f"even first in line its {upgrade.hosts_per_visit} hosts per visit miss it; taking every host of a "
                f"domain per visit (not multi-cycle), first in line, would meet it: {_by(whole)}"
            )
    elif sizing.waves(sizing.largest_domain) > 1:
        advice = _larger_buffer_advice(backlog, upgrade, deadline, now)
        if advice:
            return DeadlineFix.LARGER_BUFFER, advice
    return _emergency_advice(backlog, upgrade, deadline, now)


def _larger_buffer_advice(backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, now: dt.datetime) -> str:
    """A planned buffer that lets every visit take its whole domain at once, played at the upgrade's
    priority, then first in line: the advice if either meets the deadline, else empty."""
    larger = _with_whole_domains(backlog)
    hosts = larger.sizing.hosts_at_once * backlog.train.visit_concurrency
    buffer = f"a planned buffer of {hosts} hosts (whole domains at once)"
    alone = play_forward(larger, now=now).get(upgrade.pk)
    if _meets(alone, deadline):
        return f"even first in line the train's pace misses it; {buffer} would meet it: {_by(alone)}"
    if upgrade.priority >= TOP_PRIORITY:
        return ""
    first = play_forward(larger, now=now, priorities={upgrade.pk: TOP_PRIORITY}).get(upgrade.pk)
    if _meets(first, deadline):
        return (
            f"{buffer} and its priority raised to {TOP_PRIORITY} (now {upgrade.priority}) would meet it: {_by(first)}"
        )
    return ""


def _emergency_advice(
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, now: dt.datetime
) -> tuple[str, str]:
    """What an emergency train for the upgrade alone would give it (`_emergency`), said as it is:
    the last change the forecast knows, so when it misses too, no change the forecast knows meets it
    (NONE_KNOWN)."""
    train = "an emergency train for this upgrade (approved by a second operator, whole domains, down to the hard floor)"
    rushed = play_forward(_emergency(backlog, upgrade), now=now, whole_visits=frozenset([upgrade.pk])).get(upgrade.pk)
    # Its cycles are its own: only the time is said.
    reached = f"every host around {rushed[1]:%Y-%m-%d %H:%M} UTC" if rushed else "every host beyond the forecast"
    if _meets(rushed, deadline):
        return (
            DeadlineFix.EMERGENCY_TRAIN,
            f"even first in line the train's pace misses it; {train} would meet it: {reached}",
        )
    return DeadlineFix.NONE_KNOWN, (
        f"no change the forecast knows meets it; the closest, {train}, one domain at a time, reaches {reached}, "
        "after the deadline (more domains at once may shorten it)"
    )


def _with_whole_domains(backlog: PoolBacklog) -> PoolBacklog:
    """The backlog with a planned buffer that lets each visit take its whole domain at once (the
    running visits keep their plans)."""
    return replace(backlog, sizing=replace(backlog.sizing, hosts_at_once=backlog.sizing.largest_domain))


def _emergency(backlog: PoolBacklog, upgrade: Upgrade) -> PoolBacklog:
    """The backlog an emergency train for the upgrade alone would play, as requested by default
    (emergency.emergency_train_request: one domain at a time, whole domains): a new train, so no open
    cycle, and nothing else to fill its visits (no typical visit length, `_held_for`), sized with the
    pool's train's overhead and correction (the same hosts drain the same way). Approximations: the
    hosts the regular train's running visits hold are played as free, and the domains in its order."""
    train = Train(
        pool=backlog.train.pool,
        emergency=True,
        visit_concurrency=1,
        pace=Pace.DOMAIN,
        cycle_slo_s=backlog.train.cycle_slo_s,
        visit_estimate_s=backlog.train.visit_estimate_s,
    )
    return replace(
        backlog,
        train=train,
        forecast=replace(backlog.forecast, train=train, cycle=None, visit_seconds=0.0),
        visits={},
        sizing=replace(
            backlog.sizing, hosts_at_once=backlog.sizing.largest_domain, stretch_s=None, waits_for_busiest=True
        ),
        upgrades=[upgrade],
        pending={upgrade.pk: backlog.pending.get(upgrade.pk, {})},
        cycle_number=0,
        running={},
    )


def _meets(played: tuple[int, dt.datetime] | None, deadline: dt.datetime) -> bool:
    return played is not None and played[1] <= deadline


def _by(played: tuple[int, dt.datetime] | None) -> str:
    if played is None:
        return "beyond the forecast"
    cycle, at = played
    return f"every host by cycle {cycle}, around {at:%Y-%m-%d %H:%M} UTC"


def _resumed_advice(backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, now: dt.datetime) -> str:
    """What resuming the stopped train now would give the upgrade (played as if it ran)."""
    resumed = play_forward(backlog, now=now).get(upgrade.pk)
    if resumed is None:
        return "only resuming the train can meet it, and resumed now it reaches every host beyond the forecast"
    verdict = "would meet it" if _meets(resumed, deadline) else "would still miss it"
    return f"only resuming the train can meet it; resumed now it {verdict}: {_by(resumed)}"


def _skipped_advice(backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, now: dt.datetime) -> str:
    """What skipping the held phase now would give the upgrade (played as if its phases graduate on
    time, and its train ran)."""
    phase = backlog.held[upgrade.pk].name
    unblock = f"no visit reaches the hosts outside phase {phase} until an operator skips it (a second operator "
    unblock += "approves)"
    refused = backlog.incompatible.get(upgrade.pk)
    if refused is not None:
        return (
            f"{unblock}; even skipped, every visit refuses it on {refused.hosts} hosts as incompatible: only a "
            "target compatible with them (a new upgrade), or the rule or their versions changed, meets it then"
        )
    skipped = play_forward(backlog, now=now).get(upgrade.pk)
    verdict = "would meet it" if _meets(skipped, deadline) else "would still miss it"
    resumed = " and its train resumed" if backlog.stopped else ""
    return (
        f"{unblock}, or a phase that can find its evidence replaces it; skipped now{resumed} it {verdict}: "
        f"{_by(skipped)}"
    )
