"""An upgrade's promise: the first forecast its train gave it (trains/services/upgrade_forecast.py),
held against when every host ran it, or against now while it has not.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import models

from trains.models import Upgrade, UpgradeState
from trains.selectors_forecast import MAX_CYCLES


class PromiseState(models.TextChoices):
    NONE = "none", "No promise yet (no running train when it was created, or its emergency train applies it)"
    BEYOND_HORIZON = "beyond_horizon", f"Promised nothing within {MAX_CYCLES} cycles"
    PENDING = "pending", "Within its promise so far"
    OVERDUE = "overdue", "Past its promise, not on every host yet"
    KEPT = "kept", "On every host by its promise"
    MISSED = "missed", "On every host, after its promise"
    ENDED = "ended", "Ended before reaching every host"


@dataclass(frozen=True)
class UpgradePromise:
    state: str
    cycle: int | None = None
    at: dt.datetime | None = None
    made_at: dt.datetime | None = None
    late_s: float | None = None  # past the promised time: when every host ran it, or now if not yet; < 0 early
    text: str = ""


def upgrade_promise(upgrade: Upgrade, *, now: dt.datetime) -> UpgradePromise:
    """The upgrade's promise (the forecast its train first gave it, trains/services/upgrade_forecast.py)
    against when every host ran it, or against now while it has not (no query)."""
    made, at, cycle = upgrade.promise_made_at, upgrade.promised_at, upgrade.promised_cycle
    if made is None:
        return UpgradePromise(PromiseState.NONE, text="no promise yet")
    if at is None or cycle is None:
        return UpgradePromise(
            PromiseState.BEYOND_HORIZON, made_at=made, text=f"promised nothing within {MAX_CYCLES} cycles"
        )
    promised = f"promised every host by cycle {cycle}, around {at:%Y-%m-%d %H:%M} UTC"
    if upgrade.state == UpgradeState.COMPLETED and upgrade.finished_at is not None:
        late = (upgrade.finished_at - at).total_seconds()
        state = PromiseState.KEPT if late <= 0 else PromiseState.MISSED
        how = f"kept, {_hours(-late)} early" if late <= 0 else f"missed by {_hours(late)}"
        return UpgradePromise(state, cycle, at, made, late, f"{promised}: {how}")
    if upgrade.state != UpgradeState.ACTIVE:
        return UpgradePromise(PromiseState.ENDED, cycle, at, made, text=f"{promised}; {upgrade.state} before that")
    late = (now - at).total_seconds()
    if late > 0:
        return UpgradePromise(PromiseState.OVERDUE, cycle, at, made, late, f"{promised}: {_hours(late)} overdue")
    return UpgradePromise(PromiseState.PENDING, cycle, at, made, late, promised)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"
