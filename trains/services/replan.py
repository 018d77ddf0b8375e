"""Replanning an upgrade: its priority, deadline and pace (multi-cycle, hosts per visit) changed in
place, the acts a deadline alert advises (trains/services/upgrade_forecast.py), without offboarding
it (which withdraws its version and rolls hosts back)."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from opsplanner import clock
from opsplanner.events import Actor, event_record
from trains.limits import check_deadline, check_visit_bound
from trains.models import LIVE_TRAIN_STATES, Train, Upgrade, UpgradeState
from trains.services.upgrades import train_says_at_once

REPLAN_FIELDS = ("priority", "deadline", "multi_cycle", "hosts_per_visit")
# Only an active upgrade still has work for a train to plan; a completed, offboarded or cancelled
# one has none (re-onboarding an offboarded one is an approval: trains/services/reonboarding.py).
REPLANNABLE_STATES = frozenset({UpgradeState.ACTIVE})


class NotGiven(enum.Enum):
    """A field not given keeps its value (None is a value: no deadline, no bound)."""

    NOT_GIVEN = "not given"


NOT_GIVEN = NotGiven.NOT_GIVEN


@transaction.atomic
def upgrade_replan(
    *,
    upgrade_id: int,
    actor: Actor,
    priority: int | NotGiven = NOT_GIVEN,
    deadline: dt.datetime | NotGiven | None = NOT_GIVEN,
    multi_cycle: bool | NotGiven = NOT_GIVEN,
    hosts_per_visit: int | NotGiven | None = NOT_GIVEN,
) -> Upgrade:
    """Change an active upgrade's priority, deadline (None clears it), multi_cycle or hosts_per_visit;
    only the fields given change, under the rules upgrade_create applies (trains/limits.py, the
    model's bounds). Turned off multi-cycle without a number, it drops its hosts per visit (a bound
    only a multi-cycle upgrade has). Nothing changed is no change: no write, no event.

    A visit already running keeps its plan and operations; the new values apply from the next visit
    (visit_start reads the upgrades afresh each tick). Any change clears the deadline alert mark
    (`deadline_alerted_at`, `deadline_alert_fixes`): the alert judged the old plan, so the forecast
    judges the new one at once (train_says_at_once, as upgrade_create and train_update do) and
    alerts again, with the advice that still applies, if the deadline is still missed. The promise
    (`promise_made_at`, `promised_cycle`, `promised_at`) is kept: it records what the train promised
    when the upgrade was created, and is held against that.

    An emergency upgrade is refused: its own train, approved by a second operator, takes it alone and
    whole (priority, deadline and hosts per visit mean nothing there); changing it would change what
    was approved. The pool's train and then the row are locked (the train tick's order), so an
    offboarding or completion committed first is seen here and refused, and one trying meanwhile
    waits for this change to commit."""
    _pool_locked(upgrade_id)
    upgrade = Upgrade.objects.select_for_update(of=("self",)).select_related("pool").filter(pk=upgrade_id).first()
    if upgrade is None:
        raise ValidationError(f"There is no upgrade #{upgrade_id}.", code="not_found")
    _check_replannable(upgrade)
    given: dict[str, Any] = {
        name: value
        for name, value in zip(REPLAN_FIELDS, (priority, deadline, multi_cycle, hosts_per_visit), strict=True)
        if value is not NOT_GIVEN
    }
    if given.get("multi_cycle") is False and "hosts_per_visit" not in given:
        given["hosts_per_visit"] = None
    before = {name: getattr(upgrade, name) for name in REPLAN_FIELDS}
    _apply_checked(upgrade, given)
    changed = [name for name in REPLAN_FIELDS if getattr(upgrade, name) != before[name]]
    if not changed:
        return upgrade
    if "deadline" in changed:  # an unchanged deadline may have passed; only a new one must be ahead
        check_deadline(upgrade.deadline, now=clock.now())
    values = {name: getattr(upgrade, name) for name in changed}
    # Guarded as well as locked (SQLite, the embedded default, takes no row lock): a state changed
    # since the read, an offboarding or a completion, is never written over.
    still = Upgrade.objects.filter(pk=upgrade.pk, state__in=REPLANNABLE_STATES)
    if still.update(**values, deadline_alerted_at=None, deadline_alert_fixes=[]) != 1:
        raise ValidationError(f"Upgrade #{upgrade.pk} changed meanwhile; read it again.", code="conflict")
    upgrade.deadline_alerted_at, upgrade.deadline_alert_fixes = None, []
    event_record(
        kind="upgrade.replanned",
        subject=upgrade,
        actor=actor,
        reason=_reason(upgrade, before, changed),
        pool_id=upgrade.pool_id,
        data={name: [_json(before[name]), _json(values[name])] for name in changed},
    )
    train_says_at_once(upgrade.pool)  # the budget, the other upgrades' deadlines and this one's
    return upgrade


def _pool_locked(upgrade_id: int) -> None:
    """Lock the upgrade's pool's live regular trains, then its active upgrades in id order, before
    the upgrade itself: train_says_at_once below writes the train and any of those upgrades (a
    promise, a deadline mark). The train tick holds its train and writes the upgrades, and a
    version's withdrawal offboards its upgrades in id order: taken in another order, each deadlocked
    with the replan. Held, a tick skips the train until the replan commits, then judges the new plan."""
    pool = Upgrade.objects.filter(pk=upgrade_id).values("pool_id")
    trains = Train.objects.filter(pool_id__in=pool, emergency=False, state__in=LIVE_TRAIN_STATES).order_by("id")
    list(trains.select_for_update(of=("self",)).values_list("id", flat=True))
    upgrades = Upgrade.objects.filter(pool_id__in=pool, emergency=False, state=UpgradeState.ACTIVE).order_by("id")
    list(upgrades.select_for_update(of=("self",)).values_list("id", flat=True))


def _check_replannable(upgrade: Upgrade) -> None:
    if upgrade.emergency:
        raise ValidationError(
            f"Upgrade #{upgrade.pk} is an emergency upgrade: its emergency train runs it as a second operator "
            "approved; request a new emergency train instead.",
            code="conflict",
        )
    if upgrade.state not in REPLANNABLE_STATES:
        raise ValidationError(
            f"Upgrade #{upgrade.pk} is {upgrade.get_state_display().lower()}; only an active upgrade, which still "
            "has work to do, is replanned.",
            code="conflict",
        )


def _apply_checked(upgrade: Upgrade, given: dict[str, Any]) -> None:
    """Set the given values on the upgrade once each is valid: the model's own bounds (priority 0 to
    1000, at least one host per visit), then the rule on multi-cycle and hosts per visit."""
    for name, value in given.items():
        setattr(upgrade, name, value)
    others = [field.name for field in Upgrade._meta.fields if field.name not in REPLAN_FIELDS]
    upgrade.full_clean(exclude=others, validate_constraints=False)  # check_visit_bound keys it by field
    check_visit_bound(multi_cycle=upgrade.multi_cycle, hosts_per_visit=upgrade.hosts_per_visit)


def _json(value: object) -> object:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def _shown(name: str, value: object) -> str:
    if name == "deadline":
        return f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC" if isinstance(value, dt.datetime) else "none"
    if name == "multi_cycle":
        return "yes" if value else "no"
    return "none" if value is None else str(value)


def _reason(upgrade: Upgrade, before: dict[str, Any], changed: list[str]) -> str:
    what = ", ".join(
        f"{name.replace('_', ' ')} {_shown(name, before[name])} → {_shown(name, getattr(upgrade, name))}"
        for name in changed
    )
    return f"upgrade #{upgrade.pk} replanned: {what}; from its next visit (a running visit keeps its plan)"
