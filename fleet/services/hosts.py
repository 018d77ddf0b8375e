"""Creating hosts and moving them through their lifecycle with guarded transitions."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import Host, MaintenanceDomain
from fleet.models.hosts import HOST_TRANSITIONS, HostState
from fleet.services.common import validated_save
from opsplanner import clock
from opsplanner.events import Actor, event_record


class HostTransitionError(ValidationError):
    """A transition the host lifecycle does not allow (a programming or input error, not a race)."""


@transaction.atomic
def host_create(*, hostname: str, domain: MaintenanceDomain, sku: str, gpu_count: int = 0, actor: Actor = None) -> Host:
    host = validated_save(Host(hostname=hostname, pool_id=domain.pool_id, domain=domain, sku=sku, gpu_count=gpu_count))
    event_record(
        kind="host.created",
        subject=host,
        actor=actor,
        pool_id=host.pool_id,
        host_id=host.pk,
        data={"hostname": hostname, "domain": domain.name},
    )
    return host


@transaction.atomic
def host_transition(*, host_id: int, expected: str, new: str, reason: str, actor: Actor = None) -> bool:
    """Move a host from expected to new. False when the host was not in expected (someone else won).

    The conditional update is the guard: of two racing callers exactly one sees a count of 1.
    """
    if new not in HOST_TRANSITIONS.get(expected, frozenset()):
        raise HostTransitionError(f"A host cannot go from {expected} to {new}.", code="transition")
    if not reason:
        raise ValidationError("Every host state change needs a reason.", code="reason")
    changed = Host.objects.filter(pk=host_id, state=expected).update(state=new, state_changed_at=clock.now())
    if changed != 1:
        return False
    host = Host.objects.only("id", "pool_id").get(pk=host_id)
    event_record(
        kind="host.state_changed",
        subject=host,
        actor=actor,
        reason=reason,
        pool_id=host.pool_id,
        host_id=host_id,
        data={"from": expected, "to": new},
    )
    return True


__all__ = ["HostState", "HostTransitionError", "host_create", "host_transition"]
