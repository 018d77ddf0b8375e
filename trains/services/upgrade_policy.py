"""The failure policy of a train's upgrades, as the train tick applies it at every tick: what it
reads of its upgrades (one query), the successes that decide something, and when failures breach
the policy (more than `max_failures`, or a failure rate above `max_failure_rate` once
`failure_rate_min_hosts` have finished)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

from django.db.models import Case, F, QuerySet, Value, When

from opsplanner.prepared import PreparedModels
from trains.models import Train, Upgrade, UpgradePhase, UpgradeState
from trains.services.phase_hosts import ByCarrying
from trains.services.upgrades import phase_failures, upgrades_phase_successes, upgrades_rate_successes


class TrainUpgrades(NamedTuple):
    """The train's active upgrades in order (created, id), each with its phases in order and the
    failures counted against it in its current phase (phase_failures)."""

    upgrades: list[Upgrade]
    phases: dict[int, list[UpgradePhase]]
    failures: dict[int, int]


def train_upgrades(train: Train) -> TrainUpgrades:
    """One query for what the tick reads of its upgrades at every tick (three before: the upgrades,
    their phases, the failures of the current ones)."""
    if train.emergency:
        if train.upgrade_id is None:  # an emergency train runs one upgrade; none left, nothing to run
            return TrainUpgrades([], {}, {})
        rows = _EMERGENCY_UPGRADE_PHASES.get().objects(upgrade_id=train.upgrade_id)
    else:
        rows = _POOL_UPGRADE_PHASES.get().objects(pool_id=train.pool_id)
    read = TrainUpgrades([], defaultdict(list), {})
    for phase in rows:
        if phase.upgrade_id not in read.phases:
            read.upgrades.append(phase.upgrade)
        # One instance per upgrade: on PostgreSQL the rows share it (share_related); elsewhere each brings a copy.
        phase.upgrade = read.upgrades[-1]
        read.phases[phase.upgrade_id].append(phase)
        if phase.position == phase.upgrade.current_phase:
            read.failures[phase.upgrade_id] = phase.current_failures
    return read


def _active_upgrade_phases(**where: object) -> QuerySet[UpgradePhase]:
    upgrade = {f"upgrade__{name}": value for name, value in where.items()}
    return (
        UpgradePhase.objects.filter(upgrade__state=UpgradeState.ACTIVE, **upgrade)
        .select_related("upgrade__component_version__component")
        .annotate(
            current_failures=Case(When(position=F("upgrade__current_phase"), then=phase_failures()), default=Value(0))
        )
        .order_by("upgrade__created_at", "upgrade_id", "position")
    )


# An upgrade's phases come in a row each, each row with its upgrade: built once per upgrade (share_related).
_EMERGENCY_UPGRADE_PHASES = ByCarrying(
    lambda: PreparedModels(
        lambda *, upgrade_id: _active_upgrade_phases(pk=upgrade_id), upgrade_id=int, share_related=True
    )
)
_POOL_UPGRADE_PHASES = ByCarrying(
    lambda: PreparedModels(
        lambda *, pool_id: _active_upgrade_phases(pool_id=pool_id, emergency=False), pool_id=int, share_related=True
    )
)


class PhaseSuccesses(NamedTuple):
    """The successes of the current phases that decide something: for the phases before the last,
    all of them (a phase graduates on them, and says how many); for the failure rate, where the
    failures so far could breach it, the hosts that succeeded without a failure counted against
    them in the phase (phase_rate_successes), up to what decides."""

    evidence: dict[int, int]
    rate: dict[int, int]


def successes_that_matter(
    upgrades: list[Upgrade], phases: dict[int, list[UpgradePhase]], failures: dict[int, int]
) -> PhaseSuccesses:
    """{upgrade: successes} that decide something (see PhaseSuccesses), in a query for the phases
    that could graduate and, only when failures could breach a rate, one for the rate. The rate is
    highest with the fewest successes the policy counts from, and is counted only up to the successes
    that keep the failures within it: past that the count decides nothing, and an upgrade late in its
    rollout has a pool's worth to read at every tick."""
    current = {u.pk: phases[u.pk][u.current_phase] for u in upgrades}
    graduating = [current[u.pk] for u in upgrades if u.current_phase < len(phases[u.pk]) - 1]
    judged = {
        u.pk: successes_within_rate(u, failures[u.pk]) for u in upgrades if _rate_could_breach(u, failures.get(u.pk, 0))
    }
    capped = {pk: up_to for pk, up_to in judged.items() if up_to is not None}
    rate = upgrades_rate_successes([current[pk] for pk in judged if pk not in capped], up_to=None)
    if capped:
        rate |= upgrades_rate_successes([current[pk] for pk in capped], up_to=max(capped.values()))
    return PhaseSuccesses(evidence=upgrades_phase_successes(graduating), rate=rate)


def _rate_could_breach(upgrade: Upgrade, failed: int) -> bool:
    if upgrade.max_failure_rate is None or not failed:
        return False
    return _above_rate(upgrade, failed, max(upgrade.failure_rate_min_hosts, failed))


def _above_rate(upgrade: Upgrade, failures: int, finished: int) -> bool:
    return upgrade.max_failure_rate is not None and failures / finished > float(upgrade.max_failure_rate)


def successes_within_rate(upgrade: Upgrade, failures: int) -> int | None:
    """The fewest successes with which `failures` (at least one) are within the failure rate; with
    more, they stay within it, so a count need not go past this. None for a rate of 0, which no
    count of successes meets (the count is then read whole, for the offboarding's reason)."""
    rate = float(upgrade.max_failure_rate or 0)
    if not rate:
        return None
    successes = max(0, math.floor(failures * (1 - rate) / rate) - 1)  # one below, for rounding
    while _above_rate(upgrade, failures, failures + successes):
        successes += 1
    return successes


def policy_breach(upgrade: Upgrade, phase: UpgradePhase, failures: int, successes: int) -> str:
    """Why the failures breach the policy ("" if they do not). `successes` are the hosts that
    succeeded with no failure counted against them (PhaseSuccesses.rate; 0 where the rate cannot
    breach), so that each finished host counts once."""
    if failures > upgrade.max_failures:
        return f"{failures} hosts failed in phase {phase.name}, more than the {upgrade.max_failures} its policy allows"
    finished = failures + successes
    if finished >= upgrade.failure_rate_min_hosts and finished and _above_rate(upgrade, failures, finished):
        return (
            f"{failures} of {finished} hosts failed in phase {phase.name} ({failures / finished:.0%}), above the "
            f"{float(upgrade.max_failure_rate or 0):.0%} its policy allows"
        )
    return ""
