"""Deadlines: an upgrade whose forecast misses its deadline raises an alert that says what would
meet it (a higher priority, a larger buffer, an emergency train). Runs in the caller's transaction;
one alert per upgrade (deadline_alerted_at), and none while no upgrade of the pool has a deadline."""

from __future__ import annotations

import datetime as dt

from django.db.models import TextChoices

from opsplanner.events import event_record
from trains.models import Upgrade, UpgradeState
from trains.selectors_forecast import PoolBacklog, play_forward, pool_backlogs
from trains.services.actor import ACTOR

TOP_PRIORITY = 1000


class DeadlineFix(TextChoices):
    RAISE_PRIORITY = "raise_priority", "Raise its priority"
    LARGER_BUFFER = "larger_buffer", "A larger planned buffer"
    EMERGENCY_TRAIN = "emergency_train", "An emergency train"


def upgrades_deadline_check(*, pool_id: int, now: dt.datetime) -> list[int]:
    """Alert for each active upgrade of the pool whose deadline the forecast misses (not alerted
    before); the ids alerted. One query when no upgrade of the pool waits on a deadline."""
    waiting = list(
        Upgrade.objects.filter(
            pool_id=pool_id, state=UpgradeState.ACTIVE, emergency=False, deadline__isnull=False,
            deadline_alerted_at__isnull=True,
        ).values_list("id", "deadline")
    )  # fmt: skip
    if not waiting:
        return []
    backlogs, _ = pool_backlogs([pool_id], now=now)
    backlog = backlogs.get(pool_id)
    if backlog is None:
        return []  # no running train: the upgrade page says "not scheduled"
    done = play_forward(backlog, now=now)
    alerted = []
    for upgrade_id, deadline in waiting:
        reached = done.get(upgrade_id)
        if deadline is None or (reached is not None and reached[1] <= deadline):
            continue
        if Upgrade.objects.filter(pk=upgrade_id, deadline_alerted_at__isnull=True).update(deadline_alerted_at=now):
            _alert(backlog, upgrade_id, deadline, reached, now)
            alerted.append(upgrade_id)
    return alerted


def _alert(
    backlog: PoolBacklog, upgrade_id: int, deadline: dt.datetime, reached: tuple | None, now: dt.datetime
) -> None:
    upgrade = next(u for u in backlog.upgrades if u.pk == upgrade_id)
    fix, advice = _what_would_meet(backlog, upgrade, deadline, now)
    when = f"by cycle {reached[0]}, around {reached[1]:%Y-%m-%d %H:%M} UTC" if reached else "not within the forecast"
    event_record(
        kind="alert.upgrade_deadline_at_risk",
        subject=upgrade,
        actor=ACTOR,
        reason=f"upgrade #{upgrade.pk} ({upgrade.component_version}) reaches every host {when}, after its deadline "
        f"{deadline:%Y-%m-%d %H:%M} UTC; {advice}",
        pool_id=upgrade.pool_id,
        data={
            "upgrade": upgrade.pk,
            "deadline": deadline.isoformat(),
            "forecast_at": reached[1].isoformat() if reached else None,
            "forecast_cycle": reached[0] if reached else None,
            "fix": fix,
        },
    )


def _what_would_meet(
    backlog: PoolBacklog, upgrade: Upgrade, deadline: dt.datetime, now: dt.datetime
) -> tuple[str, str]:
    """The cheapest change the forecast says would meet the deadline, as (code, advice)."""
    if upgrade.priority < TOP_PRIORITY:
        raised = play_forward(backlog, now=now, priorities={upgrade.pk: TOP_PRIORITY}).get(upgrade.pk)
        if raised is not None and raised[1] <= deadline:
            return DeadlineFix.RAISE_PRIORITY, (
                f"raising its priority to {TOP_PRIORITY} (now {upgrade.priority}) would meet it: every host by "
                f"cycle {raised[0]}, around {raised[1]:%Y-%m-%d %H:%M} UTC"
            )
    sizing = backlog.sizing
    if sizing.waves(sizing.largest_domain) > 1:
        hosts = sizing.largest_domain * backlog.train.visit_concurrency
        return DeadlineFix.LARGER_BUFFER, (
            f"even first in line the train's pace misses it; a planned buffer of {hosts} hosts (whole domains at "
            "once) or an emergency train would shorten the visits"
        )
    return DeadlineFix.EMERGENCY_TRAIN, (
        "even first in line the train's pace misses it; an emergency train for this upgrade (approved by a second "
        "operator, larger domains, down to the hard floor) would meet it"
    )
