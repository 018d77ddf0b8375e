"""Emergency trains: one urgent upgrade, requested by one operator and approved by another."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Q, QuerySet

from fleet.models import Host, HostState, Pool
from fleet.selectors.capacity import pool_capacity
from fleet.selectors.compatibility import host_incompatibilities
from opsplanner import clock
from opsplanner.events import Actor, actor_user, event_record
from opsplanner.models import ApprovalKind, ApprovalState
from opsplanner.services.approvals import approval_request, user_is_operator
from trains.models import LIVE_TRAIN_STATES, Cycle, Train, TrainState, TrainStop, Upgrade, UpgradeState
from trains.services.actor import ACTOR
from trains.services.trains import _domains_in_order, train_set_state
from trains.services.upgrade_scopes import upgrade_scope_hosts
from trains.services.upgrades import hosts_below_target, upgrade_create

SUBJECT = "trains.train"


class OutOfReach(models.TextChoices):
    """Why a host of an emergency train's scope is out of its reach (alert.emergency_hosts_left's
    data.why, per host): codes, for integrations; the labels are for people."""

    ESCALATED = "escalated", "escalated to a human"
    NOT_A_STOP = "not_a_stop", "in a domain added since its approval"
    INCOMPATIBLE = "incompatible", "its target would break a compatibility rule there"


@transaction.atomic
def emergency_train_request(
    *,
    pool: Pool,
    component: str,
    version: str,
    reason: str,
    scope: str = "",
    domains_at_once: int = 1,
    visit_estimate_s: int = 1800,
    actor: Actor,
) -> Train:
    """An emergency train waits for a second operator's approval before it moves. It may visit
    several domains at once and ignores opt-outs, but never takes the pool below its hard floor."""
    if not user_is_operator(actor):
        raise ValidationError("Only an operator can request an emergency train.", code="permission")
    if not isinstance(domains_at_once, int) or domains_at_once < 1:
        raise ValidationError({"domains_at_once": "Visit at least one domain at a time."})
    upgrade = upgrade_create(
        pool=pool, component=component, version=version, reason=reason, scope=scope, emergency=True, actor=actor
    )
    scope_hosts = Host.objects.filter(pool=pool, pk__any=upgrade_scope_hosts(upgrade))
    domain_ids = set(scope_hosts.values_list("domain_id", flat=True).distinct())
    domains = [d for d in _domains_in_order(pool, None) if d.pk in domain_ids]
    now = clock.now()
    train = Train(
        name=f"emergency-{upgrade.pk}",
        pool=pool,
        emergency=True,
        upgrade=upgrade,
        state=TrainState.AWAITING_APPROVAL,
        state_reason="waits for a second operator to approve",
        visit_concurrency=domains_at_once,
        visit_estimate_s=visit_estimate_s,
        cycle_slo_s=max(visit_estimate_s, -(-len(domains) // domains_at_once) * visit_estimate_s),
        priority=900,
        created_by=actor_user(actor),
        state_changed_at=now,
        created_at=now,
    )
    train.full_clean()
    train.save()
    TrainStop.objects.bulk_create([TrainStop(train=train, domain=d, position=i) for i, d in enumerate(domains)])
    capacity = pool_capacity(pool)
    hard_floor = pool.hard_floor_hosts if pool.hard_floor_hosts is not None else capacity.buffers.floor
    approval_request(
        kind=ApprovalKind.EMERGENCY_TRAIN,
        subject_type=SUBJECT,
        subject_id=train.pk,
        reason=reason,
        actor=actor,
        summary={
            "train": train.name,
            "pool": pool.name,
            "target": str(upgrade.component_version),
            "scope": upgrade.scope,
            "hosts": scope_hosts.count(),
            "domains": len(domains),
            "domains_at_once": domains_at_once,
            "hard_floor": hard_floor,
            "in_service": capacity.in_service,
        },
    )
    event_record(
        kind="train.emergency_requested",
        subject=train,
        actor=actor,
        reason=reason,
        pool_id=pool.pk,
        data={"upgrade": upgrade.pk, "target": str(upgrade.component_version), "emergency": True},
    )
    return train


def on_emergency_decided(*, approval: Any, outcome: str, actor: Actor) -> None:
    """Approval handler: approved, the train starts; rejected or expired, it is cancelled."""
    train = Train.objects.select_for_update().get(pk=approval.subject_id)
    if outcome == ApprovalState.APPROVED:
        train_set_state(
            train=train,
            expected={TrainState.AWAITING_APPROVAL},
            new=TrainState.RUNNING,
            reason=f"approved by {approval.decider}: {approval.decision_reason}",
            actor=actor,
            kind="train.approved",
        )
        return
    cancelled = train_set_state(
        train=train,
        expected={TrainState.AWAITING_APPROVAL},
        new=TrainState.CANCELLED,
        reason=f"approval #{approval.pk} {outcome}",
        actor=actor,
        kind="train.cancelled",
    )
    if cancelled and train.upgrade_id is not None:  # always set: an emergency train is made with its upgrade
        Upgrade.objects.filter(pk=train.upgrade_id, state=UpgradeState.ACTIVE).update(
            state=UpgradeState.CANCELLED, state_reason=f"emergency train {train.name} was {outcome}"
        )
    if outcome not in (ApprovalState.REJECTED, ApprovalState.EXPIRED):
        raise ValidationError(f"Unexpected outcome {outcome}.")


def emergency_train_finish_if_done(*, train: Train) -> bool:
    """Finish an emergency train with nothing left to do; whether it finished. The one place an
    emergency train finishes: it runs cycle after cycle until every host of its scope runs the fix
    (a host out for other work or in repair when its domain was visited is taken by a later cycle,
    trains/services/cycles.py), until its upgrade is offboarded or cancelled, or until no host left
    is within its reach (emergency_within_reach): then it finishes and says which, and why
    (_finish_with_hosts_left). Runs in the train tick's transaction, under the train's row lock, while
    no cycle is open."""
    if train.state not in LIVE_TRAIN_STATES or Cycle.objects.filter(train=train, ended_at__isnull=True).exists():
        return False
    upgrade = (
        Upgrade.objects.filter(pk=train.upgrade_id).select_related("component_version__component").first()
        if train.upgrade_id
        else None
    )
    if upgrade is not None and upgrade.state == UpgradeState.ACTIVE:
        below = hosts_below_target(upgrade, upgrade_scope_hosts(upgrade))
        if emergency_within_reach(train, upgrade, below):
            return False  # a later cycle takes them once they are back in service
        left = _out_of_reach(train, upgrade, below)
        if not left:
            return False  # every host has the fix: the tick's upgrade step completes the upgrade first
        return _finish_with_hosts_left(train, upgrade, left)
    outcome = f"upgrade #{upgrade.pk} is {upgrade.state}" if upgrade else "it has no upgrade"
    return train_set_state(
        train=train, expected=set(LIVE_TRAIN_STATES), new=TrainState.FINISHED,
        reason=f"nothing left to do: {outcome}", actor=ACTOR, kind="train.finished",
    )  # fmt: skip


def emergency_reachable(train: Train) -> Q:
    """The hosts a later cycle of the emergency train can still take: in a domain it was approved
    for (its stops; a rack added since is not one) and not escalated to a human."""
    stops = TrainStop.objects.filter(train=train).values("domain_id")
    return Q(domain_id__in=stops) & ~Q(state=HostState.ESCALATED)


def emergency_incompatible(upgrade: Upgrade, host_ids: Iterable[int]) -> dict[int, str]:
    """Of `host_ids`, the hosts the upgrade's target would leave breaking a compatibility rule, with
    the first reason: the core refuses the target there (opsplanner/services/compatibility.py), as
    when a rule was made, or another component of the host changed, since the approval. No later
    cycle can give them the fix while that holds (three queries at most; none without hosts)."""
    ids = sorted(host_ids)
    if not ids:
        return {}
    problems = host_incompatibilities(ids, planned=[upgrade.component_version])
    return {host_id: reasons[0] for host_id, reasons in problems.items()}


def emergency_within_reach(train: Train, upgrade: Upgrade, below: QuerySet[Host]) -> bool:
    """Whether a later cycle can still give the fix to one of `below` (hosts under its target): one
    within its reach (emergency_reachable) that the target keeps compatible. A host the target is
    incompatible with is refused at every visit: waited for, it kept the train running a cycle of
    refusals every IDLE_AFTER_EMPTY_CYCLE until an operator acted (trains/services/cycles.py)."""
    reachable = set(below.filter(emergency_reachable(train)).values_list("id", flat=True))
    return bool(reachable) and len(emergency_incompatible(upgrade, reachable)) < len(reachable)


def emergency_hosts_left(upgrade: Upgrade) -> dict[str, str]:
    """The hosts of the upgrade's scope still below its target: {hostname: state}."""
    return _named_states(hosts_below_target(upgrade, upgrade_scope_hosts(upgrade)))


def _named_states(hosts: QuerySet[Host]) -> dict[str, str]:
    return dict(hosts.order_by("hostname").values_list("hostname", "state"))


def emergency_cycle_ended(*, train: Train, cycle: Cycle) -> None:
    """Invariant 5: a cycle that ends with hosts of the scope below the fix does not finish the
    train; say which hosts wait, and why, for the next cycle."""
    if train.upgrade_id is None:  # never: an emergency train is made with its upgrade
        return
    upgrade = Upgrade.objects.filter(pk=train.upgrade_id, state=UpgradeState.ACTIVE).first()
    left = emergency_hosts_left(upgrade) if upgrade is not None else {}
    if upgrade is None or not left:
        return
    event_record(
        kind="train.emergency_hosts_left",
        subject=train,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=f"cycle {cycle.number} ended with {len(left)} hosts below {upgrade.component_version} "
        f"({_named(left)}): a later cycle takes those within its reach once they are back in service"[:500],
        data={"upgrade": upgrade.pk, "cycle": cycle.number, "hosts": dict(list(left.items())[:100])},
    )


def _named(left: dict[str, str]) -> str:
    return ", ".join(f"{hostname} {state}" for hostname, state in left.items())


class _HostLeft(NamedTuple):
    """A host of the scope below the fix that no cycle can reach, and why (an OutOfReach code)."""

    state: str
    why: str
    detail: str = ""

    def said(self, hostname: str) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"{hostname} {self.state} ({OutOfReach(self.why).label}{detail})"


def _out_of_reach(train: Train, upgrade: Upgrade, below: QuerySet[Host]) -> dict[str, _HostLeft]:
    """{hostname: why it is out of reach} of the hosts `below` the fix, by name (called once none is
    within reach: a host in a stop, not escalated, is there only because its target is incompatible)."""
    rows = list(below.order_by("hostname").values_list("id", "hostname", "state", "domain_id"))
    stops = set(TrainStop.objects.filter(train=train).values_list("domain_id", flat=True))
    incompatible = emergency_incompatible(upgrade, [host_id for host_id, _, _, domain_id in rows if domain_id in stops])
    left = {}
    for host_id, hostname, state, domain_id in rows:
        if domain_id not in stops:
            left[hostname] = _HostLeft(state, OutOfReach.NOT_A_STOP)
        elif state == HostState.ESCALATED:
            left[hostname] = _HostLeft(state, OutOfReach.ESCALATED)
        else:
            left[hostname] = _HostLeft(state, OutOfReach.INCOMPATIBLE, incompatible.get(host_id, ""))
    return left


def _finish_with_hosts_left(train: Train, upgrade: Upgrade, left: dict[str, _HostLeft]) -> bool:
    """No host left below the fix can be reached (a host escalated to a human may stay out for days;
    a rack added since the approval is no stop of the train; a host its target would leave
    incompatible is refused at every visit): the train finishes rather than wait, with an alert naming
    the hosts left and why (data.why: {hostname: OutOfReach code}), and its upgrade is cancelled with
    the reason (no train takes an emergency upgrade up again: someone must ask for another emergency
    train)."""
    hostnames = sorted(left)
    named = ", ".join(host.said(hostname) for hostname, host in left.items())
    why = (
        f"{len(left)} hosts of its scope are out of its reach and still run below {upgrade.component_version}: "
        f"{named}; request another emergency train for them"
    )[:450]
    finished = train_set_state(
        train=train,
        expected=set(LIVE_TRAIN_STATES),
        new=TrainState.FINISHED,
        reason=f"finished with hosts left: {why}",
        actor=ACTOR,
        kind="train.finished",
    )
    if not finished:
        return False
    data = {
        "upgrade": upgrade.pk,
        "hosts": hostnames[:100],
        "why": {hostname: left[hostname].why for hostname in hostnames[:100]},
    }
    if Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.ACTIVE).update(
        state=UpgradeState.CANCELLED,
        state_reason=f"emergency train {train.name} finished: {why}",
        finished_at=clock.now(),
    ):
        event_record(
            kind="upgrade.cancelled", subject=upgrade, actor=ACTOR, reason=why, pool_id=train.pool_id, data=data
        )
    event_record(
        kind="alert.emergency_hosts_left", subject=train, actor=ACTOR, reason=why, pool_id=train.pool_id, data=data
    )
    return True
