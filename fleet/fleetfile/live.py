"""The live inventory as the fleet file sees it: one set-based read per kind, whatever the fleet size."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.db.models import Count

from fleet.models import (
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    MaintenanceDomain,
    Pool,
    Service,
    ServicePlacement,
)


class LivePool(NamedTuple):
    id: int
    name: str
    workload_class: str
    description: str
    planned_buffer_hosts: int | None
    planned_buffer_fraction: Decimal | None
    failure_buffer_hosts: int | None
    failure_buffer_fraction: Decimal | None
    hard_floor_hosts: int | None
    executor: str
    drainer: str


class LiveDomain(NamedTuple):
    id: int
    pool_id: int
    name: str
    kind: str
    position: int


class LiveHost(NamedTuple):
    id: int
    hostname: str
    pool_id: int
    domain_id: int
    state: str
    sku: str
    gpu_count: int
    labels: dict[str, Any]


class LiveComponent(NamedTuple):
    id: int
    name: str
    display_name: str
    layer: str
    needs_drain: bool
    needs_reboot: bool


class LiveVersion(NamedTuple):
    id: int
    component_id: int
    version: str
    withdrawn: bool
    withdrawn_reason: str
    withdrawn_by: str  # fleet.models.WithdrawnBy


class LiveRule(NamedTuple):
    id: int
    job_facing: str
    version: str
    lower: str
    min_version: str
    max_version: str
    note: str

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.job_facing, self.version, self.lower, self.min_version, self.max_version)


class LiveService(NamedTuple):
    id: int
    name: str
    display_name: str
    description: str


class LivePlacement(NamedTuple):
    id: int
    service_id: int
    host_id: int
    running_jobs: int


POOL_FIELDS = LivePool._fields
DOMAIN_FIELDS = LiveDomain._fields
HOST_FIELDS = LiveHost._fields
COMPONENT_FIELDS = LiveComponent._fields


@dataclass
class LiveInventory:
    pools: dict[str, LivePool] = field(default_factory=dict)
    domains: dict[tuple[int, str], LiveDomain] = field(default_factory=dict)
    hosts: dict[str, LiveHost] = field(default_factory=dict)
    components: dict[str, LiveComponent] = field(default_factory=dict)
    versions: dict[tuple[str, str], LiveVersion] = field(default_factory=dict)
    rules: dict[tuple[str, str, str, str, str], LiveRule] = field(default_factory=dict)
    services: dict[str, LiveService] = field(default_factory=dict)
    owners: dict[int, set[str]] = field(default_factory=dict)  # service id -> usernames
    placements: dict[tuple[int, int], LivePlacement] = field(default_factory=dict)  # (service, host)
    users: dict[str, int] = field(default_factory=dict)  # username -> id, for the owners the file names
    # pool id -> {state: hosts}, retired hosts left out (they count nowhere)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)

    def pool_name(self, pool_id: int) -> str:
        return next(p.name for p in self.pools.values() if p.id == pool_id)

    def domain_by_id(self) -> dict[int, LiveDomain]:
        return {d.id: d for d in self.domains.values()}


def live_inventory_read(*, usernames: set[str], service_names: set[str]) -> LiveInventory:
    """Everything the plan compares against, in a fixed number of queries."""
    live = LiveInventory()
    live.pools = {row[1]: LivePool(*row) for row in Pool.objects.order_by().values_list(*POOL_FIELDS)}
    live.domains = {
        (row[1], row[2]): LiveDomain(*row) for row in MaintenanceDomain.objects.order_by().values_list(*DOMAIN_FIELDS)
    }
    live.hosts = {row[1]: LiveHost(*row) for row in Host.all_objects.order_by().values_list(*HOST_FIELDS)}
    live.components = {
        row[1]: LiveComponent(*row) for row in Component.objects.order_by().values_list(*COMPONENT_FIELDS)
    }
    live.versions = {
        (component, version): LiveVersion(pk, component_id, version, withdrawn_at is not None, reason, by)
        for pk, component_id, component, version, withdrawn_at, reason, by in ComponentVersion.objects.order_by()
        .values_list(
            "id", "component_id", "component__name", "version", "withdrawn_at", "withdrawn_reason", "withdrawn_by"
        )
        .iterator(chunk_size=10_000)
    }
    rules = CompatibilityRule.objects.order_by().values_list(
        "id",
        "job_facing_version__component__name",
        "job_facing_version__version",
        "lower_component__name",
        "min_version",
        "max_version",
        "note",
    )
    live.rules = {rule.key: rule for rule in (LiveRule(*row) for row in rules)}
    live.services = {
        row[1]: LiveService(*row)
        for row in Service.objects.order_by().values_list("id", "name", "display_name", "description")
    }
    named_ids = [s.id for name, s in live.services.items() if name in service_names]
    for service_id, username in Service.owners.through.objects.filter(service_id__in=named_ids).values_list(
        "service_id", "user__username"
    ):
        live.owners.setdefault(service_id, set()).add(username)
    live.placements = {
        (row[1], row[2]): LivePlacement(*row)
        for row in ServicePlacement.objects.filter(service_id__in=named_ids)
        .order_by()
        .values_list("id", "service_id", "host_id", "running_jobs")
        .iterator(chunk_size=20_000)
    }
    user_model = get_user_model()
    live.users = dict(
        user_model.objects.filter(**{f"{user_model.USERNAME_FIELD}__in": sorted(usernames)}).values_list(
            user_model.USERNAME_FIELD, "id"
        )
    )
    for pool_id, state, count in (
        Host.objects.order_by().values("pool_id", "state").annotate(n=Count("id")).values_list("pool_id", "state", "n")
    ):
        live.counts.setdefault(pool_id, {})[state] = count
    return live
