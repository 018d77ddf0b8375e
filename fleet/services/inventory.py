"""Pools, domains, components, versions, installed versions and compatibility rules."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import (
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    InstalledVersion,
    MaintenanceDomain,
    Pool,
)
from fleet.services.common import validated_save
from opsplanner import clock
from opsplanner.events import Actor, event_record


@transaction.atomic
def pool_create(
    *,
    name: str,
    workload_class: str,
    planned_buffer_hosts: int | None = None,
    planned_buffer_fraction: Decimal | None = None,
    failure_buffer_hosts: int | None = None,
    failure_buffer_fraction: Decimal | None = None,
    description: str = "",
    hard_floor_hosts: int | None = None,
    executor: str = "simulated",
    drainer: str = "simulated",
    actor: Actor = None,
) -> Pool:
    pool = validated_save(
        Pool(
            name=name,
            workload_class=workload_class,
            description=description,
            planned_buffer_hosts=planned_buffer_hosts,
            planned_buffer_fraction=planned_buffer_fraction,
            failure_buffer_hosts=failure_buffer_hosts,
            failure_buffer_fraction=failure_buffer_fraction,
            hard_floor_hosts=hard_floor_hosts,
            executor=executor,
            drainer=drainer,
        )
    )
    event_record(kind="pool.created", subject=pool, actor=actor, pool_id=pool.pk, data={"name": name})
    return pool


@transaction.atomic
def domain_create(
    *, pool: Pool, name: str, kind: str = "rack", position: int = 0, actor: Actor = None
) -> MaintenanceDomain:
    domain = validated_save(MaintenanceDomain(pool=pool, name=name, kind=kind, position=position))
    event_record(kind="domain.created", subject=domain, actor=actor, pool_id=pool.pk, data={"name": name})
    return domain


@transaction.atomic
def component_create(
    *,
    name: str,
    layer: str,
    display_name: str = "",
    needs_reboot: bool = True,
    needs_drain: bool = True,
    actor: Actor = None,
) -> Component:
    component = validated_save(
        Component(
            name=name,
            display_name=display_name or name,
            layer=layer,
            needs_reboot=needs_reboot,
            needs_drain=needs_drain,
        )
    )
    event_record(kind="component.created", subject=component, actor=actor, data={"name": name, "layer": layer})
    return component


@transaction.atomic
def component_version_create(*, component: Component, version: str, actor: Actor = None) -> ComponentVersion:
    component_version = validated_save(ComponentVersion(component=component, version=version))
    event_record(
        kind="component.version_added",
        subject=component_version,
        actor=actor,
        data={"component": component.name, "version": version},
    )
    return component_version


@transaction.atomic
def installed_version_set(
    *, host: Host, version: ComponentVersion, actor: Actor = None, reason: str = ""
) -> InstalledVersion:
    """Record that host now runs version (replacing what it ran of that component)."""
    current = (
        InstalledVersion.objects.select_for_update()
        .select_related("version")
        .filter(host=host, component_id=version.component_id)
        .first()
    )
    previous = current.version.version if current else None
    if current is None:
        current = InstalledVersion(host=host, component_id=version.component_id, version=version)
    elif current.version_id != version.pk:
        current.previous_version_id = current.version_id
    # When it came to run it: the same version recorded again keeps its date (as the tick's record of
    # versions does), which the supersede rules read (an ad-hoc upgrade asked since is a downgrade).
    if current.pk is None or current.version_id != version.pk:
        current.installed_at = clock.now()
    current.version = version
    validated_save(current)
    event_record(
        kind="host.version_installed",
        subject=host,
        actor=actor,
        reason=reason,
        pool_id=host.pool_id,
        host_id=host.pk,
        data={"component": version.component.name, "from": previous, "to": version.version},
    )
    return current


@transaction.atomic
def compatibility_rule_create(
    *,
    job_facing_version: ComponentVersion,
    lower_component: Component,
    min_version: str = "",
    max_version: str = "",
    note: str = "",
    actor: Actor = None,
) -> CompatibilityRule:
    if not min_version and not max_version:
        raise ValidationError("Give at least one bound (lowest or highest compatible version).")
    rule = validated_save(
        CompatibilityRule(
            job_facing_version=job_facing_version,
            lower_component=lower_component,
            min_version=min_version,
            max_version=max_version,
            note=note,
        )
    )
    event_record(
        kind="compatibility_rule.created",
        subject=rule,
        actor=actor,
        data={
            "job_facing": str(job_facing_version),
            "lower_component": lower_component.name,
            "min": min_version,
            "max": max_version,
        },
    )
    return rule
