"""What the per-upgrade forecast (trains/selectors_forecast.py) says of one upgrade, from its pool's
backlog and what play_forward made of it, with no query: its code (`ForecastCode`), the cycle and
date it reaches every host by, whether that meets its deadline, and the text the upgrades page, the
API and the promise's event show.

An upgrade whose phase in force is held short of evidence (trains/services/phases.py) is
`phase_held`: no visit takes the hosts outside the phase until an operator skips it, so it has no
cycle or date for every host (no promise) and a deadline is not met. The held phase is read with the
upgrades (`held_phase_annotations`, no query more); its hosts are still played, so the forecasts of
the other upgrades of the pool hold once the hold lifts.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from django.db import models
from django.db.models import OuterRef, Subquery

from trains.models import Upgrade, UpgradePhase, UpgradeState
from trains.selectors_incompatible import incompatible_text
from trains.selectors_missed import hosts_missed

if TYPE_CHECKING:
    from trains.selectors_forecast import PoolBacklog

MAX_CYCLES = 20  # played forward at most; beyond that the forecast says so


class ForecastCode(models.TextChoices):
    SCHEDULED = "scheduled", "Reaches every host by a forecast cycle"
    WAITS_FOR_HUMAN = "waits_for_human", "On every host a visit can take; the rest are escalated to a human"
    BEYOND_HORIZON = "beyond_horizon", f"Not within {MAX_CYCLES} cycles"
    NO_TRAIN = "no_train", "No running train in the pool"
    TRAIN_STOPPED = "train_stopped", "The pool's train is paused or autostopped: not scheduled until it runs"
    EMERGENCY = "emergency", "Applied by its emergency train"
    INCOMPATIBLE = "incompatible", "Its target breaks a compatibility rule on some hosts: every visit there refuses it"
    PHASE_HELD = "phase_held", "Its rollout holds at a phase short of evidence: the hosts outside wait for an operator"
    NOT_ACTIVE = "not_active", "Not active"


@dataclass(frozen=True)
class UpgradeForecast:
    upgrade_id: int
    code: str
    cycle: int | None = None
    at: dt.datetime | None = None
    deadline_met: bool | None = None  # None: no deadline
    text: str = ""
    # Hosts below its target escalated to a human: not in the forecast (no visit takes them until a
    # human returns them; each is then reached at its domain's next visit).
    hosts_escalated: int = 0
    # Hosts below its target that every visit refuses it on: their domain has hosts its target would
    # make incompatible (selectors_incompatible.py). Not in the forecast, nor in `cycle` and `at`.
    hosts_incompatible: int = 0


class HeldPhase(NamedTuple):
    """An upgrade's phase in force, held short of evidence: its name and why it holds."""

    name: str
    reason: str


HELD_PHASE_NAME, HELD_PHASE_REASON = "held_phase_name", "held_phase_reason"  # held_phase_annotations()'s


def held_phase_annotations() -> dict[str, Subquery]:
    """The name and hold reason of the upgrade's phase in force when it is held (else None), for an
    Upgrade query (no query more)."""
    held = UpgradePhase.objects.filter(upgrade_id=OuterRef("pk"), position=OuterRef("current_phase")).exclude(
        held_code=""
    )
    return {
        HELD_PHASE_NAME: Subquery(held.values("name")[:1]),
        HELD_PHASE_REASON: Subquery(held.values("held_reason")[:1]),
    }


def held_phase(upgrade: Upgrade) -> HeldPhase | None:
    """The upgrade's held phase in force, from held_phase_annotations(); None when not held."""
    name = getattr(upgrade, HELD_PHASE_NAME, None)
    return HeldPhase(name, getattr(upgrade, HELD_PHASE_REASON, None) or "") if name else None


def upgrade_forecast_of(upgrade: Upgrade, backlog: PoolBacklog | None, done: dict) -> UpgradeForecast:
    """An upgrade's forecast from its pool's backlog and what play_forward made of it (no query)."""
    if upgrade.state != UpgradeState.ACTIVE:
        return UpgradeForecast(upgrade.pk, ForecastCode.NOT_ACTIVE, text=f"{upgrade.get_state_display().lower()}")
    if upgrade.emergency:
        return UpgradeForecast(upgrade.pk, ForecastCode.EMERGENCY, text="applied by its emergency train")
    if backlog is None:
        return UpgradeForecast(upgrade.pk, ForecastCode.NO_TRAIN, text="no running train in the pool: not scheduled")
    escalated = backlog.escalated.get(upgrade.pk, 0)
    if upgrade.pk in backlog.held:  # first: resuming a train or a compatible target does not lift a hold
        return _phase_held(upgrade, backlog)
    if backlog.stopped:
        return UpgradeForecast(
            upgrade.pk,
            ForecastCode.TRAIN_STOPPED,
            deadline_met=None if upgrade.deadline is None else False,  # no visit until it runs again
            text=f"its train is {backlog.train.get_state_display().lower()}: not scheduled until it runs",
            hosts_escalated=escalated,
        )
    if upgrade.pk in backlog.incompatible:
        return _incompatible(upgrade, backlog, done.get(upgrade.pk))
    if upgrade.pk not in done:
        return UpgradeForecast(
            upgrade.pk,
            ForecastCode.BEYOND_HORIZON,
            deadline_met=None if upgrade.deadline is None else False,
            text=f"not every host within the next {MAX_CYCLES} cycles",
            hosts_escalated=escalated,
        )
    pending = sum(backlog.pending_and_broken(upgrade.pk).values())
    if escalated and not pending:
        return UpgradeForecast(
            upgrade.pk,
            ForecastCode.WAITS_FOR_HUMAN,
            deadline_met=None if upgrade.deadline is None else False,  # no visit can meet it: a human can
            text=f"on every host a visit can take; {_escalated_text(escalated)}",
            hosts_escalated=escalated,
        )
    cycle, at = done[upgrade.pk]
    met = None if upgrade.deadline is None else at <= upgrade.deadline
    every = f"every host but the {escalated} escalated to a human" if escalated else "every host"
    text = f"reaches {every} by cycle {cycle}, around {at:%Y-%m-%d %H:%M} UTC"
    missed = hosts_missed(backlog.missed_share, pending)
    if missed:
        text += (
            f", with the {missed} hosts its visits are expected to miss taken again "
            f"(recent visits missed {backlog.missed_share:.1%} of their hosts)"
        )
    if met is not None:
        text += f"; {'meets' if met else 'misses'} its deadline {upgrade.deadline:%Y-%m-%d %H:%M} UTC"
    if escalated:
        text += f"; {_escalated_text(escalated)}"
    return UpgradeForecast(
        upgrade.pk,
        ForecastCode.SCHEDULED,
        cycle=cycle,
        at=at,
        deadline_met=met,
        text=text,
        hosts_escalated=escalated,
    )


def _incompatible(upgrade: Upgrade, backlog: PoolBacklog, done: tuple[int, dt.datetime] | None) -> UpgradeForecast:
    """The forecast of an upgrade every visit refuses on some hosts (selectors_incompatible.py): no
    cycle or date for every host, and a deadline not met; when the visits reach its other hosts."""
    left_out, escalated = backlog.incompatible[upgrade.pk], backlog.escalated.get(upgrade.pk, 0)
    when = f"by cycle {done[0]}, around {done[1]:%Y-%m-%d %H:%M} UTC" if done else f"beyond {MAX_CYCLES} cycles"
    others = sum(backlog.pending_and_broken(upgrade.pk).values())
    text = incompatible_text(left_out, others=others, others_when=when)
    if upgrade.deadline is not None:
        text += f"; misses its deadline {upgrade.deadline:%Y-%m-%d %H:%M} UTC"
    if escalated:
        text += f"; {_escalated_text(escalated)}"
    return UpgradeForecast(
        upgrade.pk,
        ForecastCode.INCOMPATIBLE,
        deadline_met=None if upgrade.deadline is None else False,  # no visit reaches those hosts
        text=text,
        hosts_escalated=escalated,
        hosts_incompatible=left_out.hosts,
    )


def _phase_held(upgrade: Upgrade, backlog: PoolBacklog) -> UpgradeForecast:
    """The forecast of an upgrade whose phase in force is held: no visit takes the hosts outside the
    phase until an operator skips it, so no cycle or date for every host, a deadline not met, and why
    it holds (the hold's reason names the hosts escalated or refused in the phase)."""
    held, left_out = backlog.held[upgrade.pk], backlog.incompatible.get(upgrade.pk)
    text = f"its rollout holds at phase {held.name}, short of evidence: the hosts outside it wait for an operator"
    if backlog.stopped:
        text += f"; its train is {backlog.train.get_state_display().lower()} too"
    if upgrade.deadline is not None:
        text += f"; misses its deadline {upgrade.deadline:%Y-%m-%d %H:%M} UTC"
    return UpgradeForecast(
        upgrade.pk,
        ForecastCode.PHASE_HELD,
        deadline_met=None if upgrade.deadline is None else False,  # no visit widens the rollout: an operator can
        text=f"{text}; held as {held.reason}",
        hosts_escalated=backlog.escalated.get(upgrade.pk, 0),
        hosts_incompatible=left_out.hosts if left_out else 0,
    )


def _escalated_text(hosts: int) -> str:
    those = "the host" if hosts == 1 else f"the {hosts} hosts"
    return f"{those} escalated to a human get it at their domain's first visit after they return"
