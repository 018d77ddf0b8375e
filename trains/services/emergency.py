"""Emergency trains: one urgent upgrade, requested by one operator and approved by another."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet

from fleet.models import Host, HostState, Pool
from fleet.selectors.capacity import pool_capacity
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
    is within its reach (emergency_reachable): then it finishes and says which (_finish_with_hosts_left).
    Runs in the train tick's transaction, under the train's row lock, while no cycle is open."""
    if train.state not in LIVE_TRAIN_STATES or Cycle.objects.filter(train=train, ended_at__isnull=True).exists():
        return False
    upgrade = Upgrade.objects.filter(pk=train.upgrade_id).first() if train.upgrade_id else None
    if upgrade is not None and upgrade.state == UpgradeState.ACTIVE:
        below = hosts_below_target(upgrade, upgrade_scope_hosts(upgrade))
        if below.filter(emergency_reachable(train)).exists():
            return False  # a later cycle takes them once they are back in service
        left = _named_states(below)
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


def _finish_with_hosts_left(train: Train, upgrade: Upgrade, left: dict[str, str]) -> bool:
    """No host left below the fix can be reached (a host escalated to a human may stay out for days;
    a rack added since the approval is no stop of the train): the train finishes rather than wait,
    with an alert naming the hosts left, and its upgrade is cancelled with the reason (no train takes
    an emergency upgrade up again: someone must ask for another emergency train)."""
    hostnames = sorted(left)
    why = (
        f"{len(left)} hosts of its scope are out of its reach (escalated to a human, or in a domain added "
        f"since its approval) and still run below {upgrade.component_version}: {_named(left)}; request another "
        "emergency train for them"
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
    data = {"upgrade": upgrade.pk, "hosts": hostnames[:100]}
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
