"""Emergency trains: one urgent upgrade, requested by one operator and approved by another."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import Host, Pool
from fleet.selectors.capacity import pool_capacity
from opsplanner import clock
from opsplanner.events import Actor, actor_user, event_record
from opsplanner.models import ApprovalKind, ApprovalState
from opsplanner.services.approvals import approval_request, user_is_operator
from trains.models import LIVE_TRAIN_STATES, Cycle, Train, TrainState, TrainStop, Upgrade, UpgradeState
from trains.services.actor import ACTOR
from trains.services.trains import _domains_in_order, train_set_state
from trains.services.upgrade_scopes import upgrade_scope_hosts
from trains.services.upgrades import upgrade_create

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
    """Finish an emergency train with nothing left to do; whether it finished. It finishes when its
    cycle ends (trains/services/cycles.py), but one whose upgrade completed, was offboarded or
    cancelled while no cycle was open (every host ran the target by the approval) never opens one.
    Runs in the train tick's transaction, under the train's row lock."""
    if train.state not in LIVE_TRAIN_STATES or Cycle.objects.filter(train=train, ended_at__isnull=True).exists():
        return False
    upgrade = Upgrade.objects.filter(pk=train.upgrade_id).first() if train.upgrade_id else None
    if upgrade is not None and upgrade.state == UpgradeState.ACTIVE:
        return False
    outcome = f"upgrade #{upgrade.pk} is {upgrade.state}" if upgrade else "it has no upgrade"
    return train_set_state(
        train=train, expected=set(LIVE_TRAIN_STATES), new=TrainState.FINISHED,
        reason=f"nothing left to do: {outcome}", actor=ACTOR, kind="train.finished",
    )  # fmt: skip
