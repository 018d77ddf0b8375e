"""Single changes to a host: move it to another pool or domain, relabel it, change its SKU or GPU
count, retire it and restore it. Each in one transaction with the host's pools locked (the tick
skips a locked pool, so no lease is granted between the check and the write), refused under live
work by the fleet file's own rule (`fleet.fleetfile.safety.busy_host_refusals`), or when leaving the pool
would shrink a buffer below what is out for it (`host_leaving_refusals`), with an event."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.fleetfile.reader import Reader
from fleet.fleetfile.safety import busy_host_refusals, host_leaving_refusals
from fleet.models import Host, HostState, MaintenanceDomain, Pool
from fleet.models.hosts import RETIRED
from fleet.services.audit import inventory_record_save
from opsplanner import clock
from opsplanner.events import Actor, event_record


def _lock_pools(*pool_ids: int) -> None:
    list(Pool.objects.select_for_update(no_key=True).filter(pk__in=set(pool_ids)).order_by("pk").values_list("pk"))


def host_by_name(hostname: str, *, retired: bool = False) -> Host:
    """The host of that name (with retired ones when asked), or a not_found error."""
    manager = Host.all_objects if retired else Host.objects
    host = manager.select_related("pool", "domain").filter(hostname=hostname).first()
    if host is None:
        raise ValidationError(f"There is no host {hostname}.", code="not_found")
    return host


def _refuse_if_busy(host: Host, verb: str) -> None:
    refusals = busy_host_refusals([(host.pk, host.hostname, host.state, verb)])
    if refusals:
        raise ValidationError([ValidationError(refusal, code="conflict") for refusal in refusals])


def host_move_refusals(*, host_id: int, pool: Pool, domain: MaintenanceDomain) -> list[str]:
    """Why the host may not move to that pool and domain now (it is under live work); [] when it may,
    or when it stays where it is. Locks both pools (the tick skips a locked pool) and the host until
    the caller's transaction ends, so no lease is granted between the check and the write: for the
    API and the admin."""
    current = Host.objects.values_list("pool_id", flat=True).get(pk=host_id)
    _lock_pools(current, pool.pk)
    host = Host.objects.select_for_update(no_key=True).get(pk=host_id)
    if (pool.pk, domain.pk) == (host.pool_id, host.domain_id):
        return []
    where = f"pool {pool.name}" if pool.pk != host.pool_id else f"domain {domain.name}"
    refusals = busy_host_refusals([(host.pk, host.hostname, host.state, f"not moved to {where}")])
    if pool.pk != host.pool_id and not refusals:
        refusals = host_leaving_refusals(pool=host.pool, hostname=host.hostname, verb=f"not moved to {where}")
    return refusals


def _labels(labels: Any) -> dict[str, Any]:
    reader = Reader()
    checked = reader.labels(labels, "labels")
    if reader.problems:
        raise ValidationError({"labels": [f"{p.place}: {p.message}" for p in reader.problems]})
    return checked or {}


@transaction.atomic
def host_update(
    *,
    host_id: int,
    pool: str | None = None,
    domain: str | None = None,
    sku: str | None = None,
    gpu_count: int | None = None,
    labels: dict[str, Any] | None = None,
    actor: Actor = None,
    reason: str = "",
) -> Host:
    """Change what is given. A move (another pool or domain; a domain is looked up in the new pool)
    of a host under live work is refused naming the operation. Event `host.updated` with the changed
    fields before and after; nothing changed, no event."""
    host = Host.objects.select_related("pool", "domain").get(pk=host_id)
    target_pool = host.pool if pool is None else Pool.objects.filter(name=pool).first()
    if target_pool is None:
        raise ValidationError({"pool": f"There is no pool {pool}."})
    domain_name = domain if domain is not None else (host.domain.name if target_pool.pk == host.pool_id else None)
    if domain_name is None:
        raise ValidationError({"domain": f"Name the domain of pool {target_pool.name} to move the host to."})
    target_domain = MaintenanceDomain.objects.filter(pool=target_pool, name=domain_name).first()
    if target_domain is None:
        raise ValidationError({"domain": f"There is no domain {domain_name} in pool {target_pool.name}."})
    refusals = host_move_refusals(host_id=host_id, pool=target_pool, domain=target_domain)
    if refusals:
        raise ValidationError([ValidationError(refusal, code="conflict") for refusal in refusals])
    host = Host.objects.select_related("pool", "domain").get(pk=host_id)
    host.pool, host.domain = target_pool, target_domain
    if sku is not None:
        host.sku = sku
    if gpu_count is not None:
        host.gpu_count = gpu_count
    if labels is not None:
        host.labels = _labels(labels)
    inventory_record_save(
        obj=host, actor=actor, fields=["pool", "domain", "sku", "gpu_count", "labels"], reason=reason or "host changed"
    )
    return host


def _turn(host: Host, new: str, actor: Actor, reason: str) -> Host:
    before = host.state
    manager = Host.all_objects
    if manager.filter(pk=host.pk, state=before).update(state=new, state_changed_at=clock.now()) != 1:
        raise ValidationError(f"Host {host.hostname} changed meanwhile; read it again.", code="conflict")
    event_record(
        kind="host.state_changed",
        subject=host,
        actor=actor,
        reason=reason,
        pool_id=host.pool_id,
        host_id=host.pk,
        data={"from": before, "to": new},
    )
    return manager.select_related("pool", "domain").get(pk=host.pk)


@transaction.atomic
def host_retire(*, hostname: str, reason: str, actor: Actor = None) -> Host:
    """Retire a host leaving the fleet: it counts nowhere and gets no work, and keeps its history.
    Refused (conflict) for a host holding a lease, out of service, or named by an open operation."""
    host = host_by_name(hostname, retired=True)
    if host.state == RETIRED:
        raise ValidationError(f"Host {hostname} is retired already.", code="conflict")
    _lock_pools(host.pool_id)
    _refuse_if_busy(host, "not retired")
    pool = Pool.objects.get(pk=host.pool_id)  # its buffers as they are under the lock
    refusals = host_leaving_refusals(pool=pool, hostname=hostname, verb="not retired")
    if refusals:
        raise ValidationError([ValidationError(refusal, code="conflict") for refusal in refusals])
    return _turn(host, RETIRED, actor, reason)


@transaction.atomic
def host_restore(*, hostname: str, reason: str, actor: Actor = None) -> Host:
    """Bring a retired host back in service, in the pool and domain it had."""
    host = host_by_name(hostname, retired=True)
    if host.state != RETIRED:
        raise ValidationError(f"Host {hostname} is not retired (it is {host.state}).", code="conflict")
    _lock_pools(host.pool_id)
    return _turn(host, HostState.IN_SERVICE, actor, reason)
