"""Rollout phases demand evidence: a phase before the last graduates only after `min_successes`
hosts succeeded in it and its soak time passed. No evidence never widens a rollout.

When the hosts a phase may touch cannot give that evidence (a canary domain already at the target,
a percentage whose hosts already run it), an `any` phase picks hosts of the pool that still need the
upgrade, in the train's domain order; a `fixed` one holds with a reason, and only an approved skip
(two operators) moves it on. The last phase has nothing wider to open: the upgrade completes when
every host of its scope runs the target.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import Host, HostState
from fleet.selectors.compatibility import host_incompatibilities
from opsplanner import clock
from opsplanner.events import Actor, event_record
from opsplanner.models import Approval, ApprovalKind, ApprovalState
from opsplanner.services.approvals import approval_request, user_is_operator
from trains.models import Train, Upgrade, UpgradePhase, UpgradeState
from trains.models.upgrades import PhaseHoldCode, PhaseSelection
from trains.services.actor import ACTOR
from trains.services.upgrades import SUBJECT, hosts_below_target


def phase_evidence_needed(phase: UpgradePhase) -> int:
    """Successes a phase before the last needs: at least one, whatever it was created with."""
    return max(1, phase.min_successes)


def phase_allowed_hosts(phases: list[UpgradePhase], position: int, sets: list[set[int]]) -> set[int]:
    """The hosts the phase at `position` may touch: its scope (which covers the earlier phases')
    and the hosts it and the earlier phases picked from the pool."""
    allowed = set(sets[position])
    for phase in phases[: position + 1]:
        allowed.update(phase.picked_hosts)
    return allowed


def phase_evidence_step(
    *,
    train: Train,
    upgrade: Upgrade,
    phases: list[UpgradePhase],
    sets: list[set[int]],
    scope: list[int],
    successes: int,
    now: dt.datetime,
) -> set[int]:
    """For the current phase of an upgrade (not its last): pick hosts of the pool when it allows it
    and its own hosts cannot give the evidence, else hold it with why; the hosts it may touch."""
    phase = phases[upgrade.current_phase]
    allowed = phase_allowed_hosts(phases, phase.position, sets)
    needed = phase_evidence_needed(phase)
    hold = ""
    if successes < needed:
        # A host escalated to a human gives no evidence until a person returns it, often days later:
        # counted as pending, a phase short of successes neither held (no alert, no skip to ask
        # for) nor picked another host, and waited for it in silence.
        below = dict(
            hosts_below_target(upgrade, allowed).exclude(state=HostState.ESCALATED).values_list("id", "domain_id")
        )
        # Nor does a host whose visits refuse the upgrade: a domain where its target would break a
        # compatibility rule on a host (the visit's step over the domain is refused whole); counted
        # as pending, a canary rack made incompatible stopped the rollout for good, in silence.
        refused = _refused_at_visits(upgrade, below)
        pending = len(below) - refused.hosts
        short = needed - successes - pending
        if short > 0 and phase.selection == PhaseSelection.ANY:
            picked = _pick(train, upgrade, scope, allowed, short)
            if picked:
                _record_picks(upgrade, phase, picked, successes, pending)
                allowed.update(picked)
                pending += len(picked)
                short -= len(picked)
        if short > 0:
            # Work waits outside the phase only if some host of the scope still needs it there;
            # otherwise the phase's hosts are the last ones and the upgrade completes with them.
            outside = hosts_below_target(upgrade, set(scope) - allowed).count()
            if outside:
                escalated = hosts_below_target(upgrade, allowed).filter(state=HostState.ESCALATED).count()
                hold = _hold_reason(upgrade, phase, needed, successes, _Unable(pending, escalated, *refused), outside)
    _set_hold(upgrade, phase, hold, now)
    return allowed


def _pick(train: Train, upgrade: Upgrade, scope: list[int], allowed: set[int], count: int) -> list[int]:
    """Up to `count` hosts of the scope outside the phase that still need the upgrade and are in
    service, in the train's domain order (domains the train does not visit are never picked)."""
    order = dict(train.stops.values_list("domain_id", "position"))
    candidates = (
        hosts_below_target(upgrade, set(scope) - allowed)
        .filter(state=HostState.IN_SERVICE, domain_id__in=list(order))
        .values_list("id", "domain_id")
    )
    return [host_id for host_id, _ in sorted(candidates, key=lambda row: (order[row[1]], row[0]))[:count]]


def _record_picks(upgrade: Upgrade, phase: UpgradePhase, picked: list[int], successes: int, pending: int) -> None:
    phase.picked_hosts = [*phase.picked_hosts, *picked]
    UpgradePhase.objects.filter(pk=phase.pk).update(picked_hosts=phase.picked_hosts)
    names = list(Host.objects.filter(pk__any=picked).order_by("id").values_list("hostname", flat=True))
    event_record(
        kind="upgrade.phase_hosts_picked",
        subject=upgrade,
        actor=ACTOR,
        reason=f"phase {phase.name} has {successes} successes and {pending} hosts that still need "
        f"{upgrade.component_version}, short of the {phase_evidence_needed(phase)} it needs; it takes "
        f"{len(picked)} hosts of the pool: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}",
        pool_id=upgrade.pool_id,
        data={"phase": phase.position, "hosts": picked},
    )


def _covers(phase: UpgradePhase) -> str:
    return f"domain {phase.domain.name}" if phase.domain is not None else f"{phase.percent}% of the scope"


class _Refused(NamedTuple):
    """The hosts below the target in domains whose visits refuse it as incompatible, and why."""

    hosts: int = 0
    why: str = ""


def _refused_at_visits(upgrade: Upgrade, below: dict[int, int]) -> _Refused:
    """Of `below` ({host: domain}), those in a domain where the target would break a compatibility
    rule on one of them: a visit submits the upgrade as one step over the domain's hosts, and the core
    refuses the whole step (trains/services/visits.py: visit_steps_submit_compatible). Three queries
    at most, asked only of a phase short of evidence."""
    problems = host_incompatibilities(below, planned=[upgrade.component_version]) if below else {}
    if not problems:
        return _Refused()
    domains = {below[host_id] for host_id in problems}
    return _Refused(sum(1 for domain in below.values() if domain in domains), problems[min(problems)][0])


class _Unable(NamedTuple):
    """A held phase's hosts that still need the upgrade; how many more do but wait for a human
    (escalated); how many more every visit refuses it on, and why."""

    pending: int
    escalated: int
    refused: int
    refused_why: str


def _hold_reason(
    upgrade: Upgrade, phase: UpgradePhase, needed: int, successes: int, hosts: _Unable, outside: int
) -> str:
    """Why the phase holds."""
    pending, escalated = hosts.pending, hosts.escalated
    where = _covers(phase)
    if phase.selection == PhaseSelection.ANY:
        where += " and the hosts in service it could pick from the pool"
    unblock = "ask for a skip of the phase (a second operator approves)"
    if phase.selection == PhaseSelection.FIXED:
        unblock += ", or create the upgrade with selection 'any' for this phase"
    return (
        f"phase {phase.name} cannot show the {needed} successes it needs before the rollout widens: "
        f"{successes} succeeded and {where} has {pending} more hosts that still need {upgrade.component_version}"
        + (f" ({escalated} more escalated to a human give none until one returns them)" if escalated else "")
        + (
            f" ({hosts.refused} more are in domains whose visits refuse it as incompatible: {hosts.refused_why})"
            if hosts.refused
            else ""
        )
        + f"; {outside} hosts outside the phase wait. To unblock: {unblock}."
    )[:500]


def _set_hold(upgrade: Upgrade, phase: UpgradePhase, reason: str, now: dt.datetime) -> None:
    """Written only when it changes; an alert when a hold starts, an event when it lifts."""
    code = PhaseHoldCode.TOO_FEW_HOSTS if reason else ""
    if phase.held_code == code and phase.held_reason == reason:
        return
    started = bool(code) and not phase.held_code
    lifted = not code and bool(phase.held_code)
    held_at = (now if started else phase.held_at) if code else None
    UpgradePhase.objects.filter(pk=phase.pk).update(held_code=code, held_reason=reason, held_at=held_at)
    phase.held_code, phase.held_reason, phase.held_at = code, reason, held_at
    if started:
        event_record(
            kind="alert.upgrade_phase_held",
            subject=upgrade,
            actor=ACTOR,
            reason=reason,
            pool_id=upgrade.pool_id,
            data={"phase": phase.position, "code": code},
        )
    elif lifted:
        event_record(
            kind="upgrade.phase_hold_lifted",
            subject=upgrade,
            actor=ACTOR,
            reason=f"phase {phase.name} has hosts enough to show its evidence again",
            pool_id=upgrade.pool_id,
            data={"phase": phase.position},
        )


def phase_graduate(
    *,
    upgrade: Upgrade,
    phase: UpgradePhase,
    nxt: UpgradePhase,
    now: dt.datetime,
    reason: str,
    actor: Actor = ACTOR,
    data: dict[str, Any] | None = None,
) -> bool:
    """Move the upgrade from `phase` to `nxt` (guarded: False when it already left `phase`); runs in
    the caller's transaction."""
    if not Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.ACTIVE, current_phase=phase.position).update(
        current_phase=nxt.position
    ):
        return False
    UpgradePhase.objects.filter(pk=phase.pk).update(graduated_at=now, held_code="", held_reason="", held_at=None)
    UpgradePhase.objects.filter(pk=nxt.pk).update(started_at=now)
    phase.graduated_at, phase.held_code, phase.held_reason, phase.held_at = now, "", "", None
    nxt.started_at = now
    upgrade.current_phase = nxt.position
    event_record(
        kind="upgrade.phase_graduated",
        subject=upgrade,
        actor=actor,
        reason=reason,
        pool_id=upgrade.pool_id,
        data={"from": phase.position, "to": nxt.position, **(data or {})},
    )
    return True


# --- skipping a held phase: two operators ---------------------------------------------------------
@transaction.atomic
def upgrade_phase_skip_request(*, upgrade_id: int, reason: str, actor: Actor) -> Approval:
    """Ask a second operator to graduate the upgrade's held phase without its evidence."""
    if not user_is_operator(actor):
        raise ValidationError("Only an operator can ask to skip a phase.", code="permission")
    upgrade = (
        Upgrade.objects.select_for_update(of=("self",))
        .select_related("component_version__component")
        .filter(pk=upgrade_id)
        .first()
    )
    if upgrade is None:
        raise ValidationError({"upgrade": f"There is no upgrade #{upgrade_id}."}, code="not_found")
    if upgrade.state != UpgradeState.ACTIVE:
        raise ValidationError(
            f"Upgrade #{upgrade.pk} is {upgrade.state}; only an active upgrade has a phase to skip.", code="conflict"
        )
    phases = list(upgrade.phases.order_by("position"))
    phase = phases[upgrade.current_phase]
    if phase is phases[-1]:
        raise ValidationError(
            f"Phase {phase.name} is the upgrade's last: there is no wider phase to skip to.", code="conflict"
        )
    if not phase.held_code:
        raise ValidationError(
            f"Phase {phase.name} is not held: it graduates by itself once {phase_evidence_needed(phase)} hosts "
            "succeeded and it soaked; only a held phase is skipped.",
            code="conflict",
        )
    nxt = phases[phase.position + 1]
    approval = approval_request(
        kind=ApprovalKind.SKIP_PHASE,
        subject_type=SUBJECT,
        subject_id=upgrade.pk,
        reason=reason,
        actor=actor,
        summary={
            "upgrade": upgrade.pk,
            "target": str(upgrade.component_version),
            "scope": upgrade.scope,
            "phase": phase.position,
            "phase_name": phase.name,
            "next_phase": nxt.name,
            "held_code": phase.held_code,
            "held_reason": phase.held_reason,
        },
    )
    event_record(
        kind="upgrade.phase_skip_requested",
        subject=upgrade,
        actor=actor,
        reason=approval.reason,
        pool_id=upgrade.pool_id,
        data={"approval": approval.pk, "phase": phase.position},
    )
    return approval


def on_phase_skip_decided(*, approval: Any, outcome: str, actor: Actor) -> None:
    """Approval handler: approved, the held phase graduates at once (the event names both operators
    and their reasons); rejected or expired, the phase stays held."""
    if outcome != ApprovalState.APPROVED:
        return
    upgrade = Upgrade.objects.select_for_update().get(pk=approval.subject_id)
    position = approval.summary.get("phase")
    if upgrade.state != UpgradeState.ACTIVE or upgrade.current_phase != position:
        raise ValidationError(
            f"Upgrade #{upgrade.pk} is no longer in the phase this request skips (it is {upgrade.state}, in phase "
            f"{upgrade.current_phase}); reject the request.",
            code="conflict",
        )
    phases = list(upgrade.phases.order_by("position"))
    phase, nxt = phases[position], phases[position + 1]
    why = (
        f"phase {phase.name} skipped by approval #{approval.pk}: requested by {approval.requester} "
        f"({approval.reason}), approved by {approval.decider} ({approval.decision_reason}); now {nxt.name}"
    )
    data = {
        "skipped": True,
        "approval": approval.pk,
        "requested_by": approval.requester,
        "request_reason": approval.reason,
        "approved_by": approval.decider,
        "decision_reason": approval.decision_reason,
        "held_reason": phase.held_reason,
    }
    if not phase_graduate(upgrade=upgrade, phase=phase, nxt=nxt, now=clock.now(), reason=why, actor=actor, data=data):
        raise ValidationError(f"Upgrade #{upgrade.pk} left phase {phase.name} meanwhile.", code="conflict")
