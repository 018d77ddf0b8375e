"""Re-onboarding an offboarded upgrade (trains/services/offboarding.py::upgrade_offboard): asked by one
operator, approved by another. Approved, the upgrade is back in its current phase, its version no
longer withdrawn, and the rollbacks of it that offboardings queued that have not started are cancelled:
the hosts may keep the version, and rolled back they would only be drained again to get it."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import RELEASED_WHERE, ComponentVersion, Pool, WithdrawnBy
from opsplanner import clock
from opsplanner.events import Actor, event_record
from opsplanner.models import ApprovalKind, Event, HostTask, Operation, OperationState, TaskState
from opsplanner.services.approvals import approval_request
from opsplanner.services.operation_cancel import operation_cancel
from trains.models import Upgrade, UpgradePhase, UpgradeState
from trains.services.upgrades import SUBJECT


@transaction.atomic
def upgrade_reonboard_request(*, upgrade_id: int, reason: str, actor: Actor) -> Any:
    upgrade = Upgrade.objects.select_for_update().select_related("component_version__component").get(pk=upgrade_id)
    if upgrade.state != UpgradeState.OFFBOARDED:
        raise ValidationError(
            f"Upgrade #{upgrade.pk} is {upgrade.state}; only an offboarded upgrade is re-onboarded.",
            code="conflict",
        )
    _withdrawal_made_elsewhere_refuse(upgrade.component_version)
    return approval_request(
        kind=ApprovalKind.REONBOARD_UPGRADE,
        subject_type=SUBJECT,
        subject_id=upgrade.pk,
        reason=reason,
        actor=actor,
        summary={"upgrade": upgrade.pk, "target": str(upgrade.component_version), "offboarded": upgrade.state_reason},
    )


def on_reonboard_decided(*, approval: Any, outcome: str, actor: Actor) -> None:
    """Approval handler: an approved re-onboarding puts the upgrade back in its current phase."""
    if outcome != "approved":
        return
    # The documented lock order (docs/architecture.md): the pool's tick lock, then the version's row,
    # then the upgrade's, as upgrade_offboard and a withdrawal take them (an upgrade's pool and version
    # never change). The upgrade's row, then the version's, then the pool's (cancelling the rollbacks)
    # deadlocked with an operator's withdrawal of the version, which holds the pools as it waits for it.
    pool_id, version_id = Upgrade.objects.values_list("pool_id", "component_version_id").get(pk=approval.subject_id)
    Pool.objects.select_for_update(no_key=True).filter(pk=pool_id).values_list("pk").first()
    version = ComponentVersion.objects.select_for_update().get(pk=version_id)
    upgrade = Upgrade.objects.select_for_update().get(pk=approval.subject_id)
    # Withdrawn by an operator or the file since the request: the approval is refused (the decision rolls back).
    _withdrawal_made_elsewhere_refuse(version)
    if not Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.OFFBOARDED).update(
        state=UpgradeState.ACTIVE, state_reason=f"re-onboarded by approval #{approval.pk}", finished_at=None
    ):
        return
    version.withdrawn_at, version.withdrawn_reason, version.withdrawn_by = None, "", WithdrawnBy.NOT_WITHDRAWN
    version.save(update_fields=["withdrawn_at", "withdrawn_reason", "withdrawn_by"])
    # The phase starts over: failures before the re-onboarding no longer count.
    UpgradePhase.objects.filter(upgrade=upgrade, position=upgrade.current_phase).update(
        started_at=clock.now(), successes_reached_at=None
    )
    Upgrade.objects.filter(pk=upgrade.pk).update(current_phase=upgrade.current_phase)
    cancelled = _rollbacks_cancel(upgrade, actor=actor)
    event_record(
        kind="upgrade.reonboarded",
        subject=upgrade,
        actor=actor,
        reason=approval.reason,
        pool_id=upgrade.pool_id,
        data={"cancelled_rollback_tasks": cancelled},
    )


def _withdrawal_made_elsewhere_refuse(version: ComponentVersion) -> None:
    """Re-onboarding lifts the withdrawal the upgrade's offboarding made, never one an operator made
    (the API, the admin, the fleet file): that would roll out again a version someone stopped on
    purpose, and the fleet file would withdraw it again at its next apply."""
    if version.withdrawn_by not in (WithdrawnBy.OPERATOR, WithdrawnBy.FLEET_FILE):
        return
    raise ValidationError(
        f"{version} is withdrawn ({version.withdrawn_reason}) and re-onboarding does not release it: "
        f"{RELEASED_WHERE[version.withdrawn_by]}, then re-onboard.",
        code="conflict",
    )


def _rollbacks_cancel(upgrade: Upgrade, *, actor: Actor) -> int:
    """Cancel the pending tasks of the rollbacks of its version that offboardings queued (their
    `upgrade.offboarded` events name them), its own and those of the version's upgrades in other
    pools: a withdrawal offboarding it in several pools has the first roll it back everywhere, and the
    others' events name none. Those under way finish; closed ones are left. How many were cancelled."""
    same_version = Upgrade.objects.filter(component_version_id=upgrade.component_version_id).values("pk")
    offboardings = Event.objects.filter(
        kind="upgrade.offboarded", subject_type=SUBJECT, subject_id__in=same_version
    ).values_list("data", flat=True)
    rollbacks = sorted({pk for data in offboardings for pk in (data or {}).get("rollbacks", [])})
    cancelled = 0
    for operation_id in Operation.objects.filter(pk__in=rollbacks, state=OperationState.OPEN).values_list(
        "id", flat=True
    ):
        if HostTask.objects.filter(operation_id=operation_id, state=TaskState.PENDING).exists():
            cancelled += operation_cancel(
                operation_id=operation_id,
                reason=f"upgrade #{upgrade.pk} re-onboarded: {upgrade.component_version} is no longer withdrawn",
                actor=actor,
            )
    return cancelled
