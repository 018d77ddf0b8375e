"""A host that breaks while in service: a monitor (or the simulator) reports it, and the repair flow
takes it from there (failure buffer, repair, verification, return)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import Host, HostState, Pool
from fleet.services.hosts import host_transition
from opsplanner.events import Actor
from opsplanner.models import REPAIR_PRIORITY, Lease, Operation, OperationKind, OperationSource
from opsplanner.services.operations import operation_submit


@transaction.atomic
def host_failure_report(*, host_id: int, reason: str, actor: Actor = None) -> Operation:
    """Mark an in-service host failed and submit its repair; the next tick admits the repair at
    once (no drain: the host is already out). A host under maintenance is refused: its own
    verification catches what is wrong with it."""
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say what is wrong with the host."})
    host = Host.objects.filter(pk=host_id).only("id", "pool_id", "hostname", "state").first()
    if host is None:
        raise ValidationError(f"There is no host #{host_id}.", code="not_found")
    # The pool's tick lock first, as ticks take it: an admission cannot race the failure.
    Pool.objects.select_for_update(no_key=True).filter(pk=host.pool_id).values_list("pk").first()
    holder = Lease.objects.filter(host_id=host_id, active=True).values_list("operation_id", flat=True).first()
    if holder is not None:
        raise ValidationError(
            f"Host {host.hostname} is held by operation #{holder}; its verification decides whether it is broken.",
            code="conflict",
        )
    if not host_transition(
        host_id=host_id, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason=reason.strip(), actor=actor
    ):
        current = Host.objects.values_list("state", flat=True).get(pk=host_id)
        raise ValidationError(f"Host {host.hostname} is {current}, not in service.", code="conflict")
    return operation_submit(
        kind=OperationKind.REPAIR,
        scope=f"hosts: {host.hostname}",
        host_ids=[host_id],
        reason=f"repair after: {reason.strip()}"[:500],
        priority=REPAIR_PRIORITY,
        source=OperationSource.REPAIR,
        needs_drain=True,
        executor=settings.REPAIR_EXECUTOR,
        actor=actor,
    )
