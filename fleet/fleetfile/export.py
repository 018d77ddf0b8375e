"""The live inventory written as a fleet file: export, then apply, changes nothing."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from fleet.fleetfile.schema import FORMAT_VERSION
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


def _buffer(hosts: int | None, fraction: Decimal | None) -> int | float:
    return hosts if hosts is not None else float(fraction or 0)


def fleet_export_document(*, pool: str | None = None) -> dict[str, Any]:
    """Every pool (or one) with its domains and live hosts, every component, version, rule and
    service; placements only on the exported hosts. Retired hosts are not part of the live fleet."""
    pools = Pool.objects.order_by("name")
    if pool is not None:
        pools = pools.filter(name=pool)
        if not pools.exists():
            raise ValidationError(f"There is no pool {pool}.", code="not_found")
    pool_rows = list(pools)
    pool_names = {p.id: p.name for p in pool_rows}
    pool_documents, domain_names = _pools_and_domains(pool_rows)
    hosts, host_ids = _hosts(pool_names, domain_names)
    return {
        "version": FORMAT_VERSION,
        "pools": pool_documents,
        "components": _components(),
        "compatibility": _rules(),
        "hosts": hosts,
        "services": _services(host_ids),
    }


def pools_section(names: set[str]) -> list[dict[str, Any]]:
    """The named live pools with their domains, as a fleet file declares them (two queries): the
    pools a hosts-only source (bulk API, CSV import) refers to, so that applying it changes no pool."""
    return _pools_and_domains(list(Pool.objects.filter(name__in=sorted(names)).order_by("name")))[0]


def _pools_and_domains(pool_rows: list[Pool]) -> tuple[list[dict[str, Any]], dict[int, str]]:
    domains: dict[int, list[dict[str, Any]]] = {}
    domain_names: dict[int, str] = {}
    for pk, pool_id, name, kind, position in (
        MaintenanceDomain.objects.filter(pool_id__in=[p.id for p in pool_rows]).order_by("pool_id", "position", "name")
        .values_list("id", "pool_id", "name", "kind", "position")
    ):  # fmt: skip
        domains.setdefault(pool_id, []).append({"name": name, "kind": kind, "position": position})
        domain_names[pk] = name
    return [_pool(p, domains.get(p.id, [])) for p in pool_rows], domain_names


def _pool(pool: Pool, domains: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": pool.name, "workload_class": pool.workload_class}
    if pool.description:
        out["description"] = pool.description
    out["planned_buffer"] = _buffer(pool.planned_buffer_hosts, pool.planned_buffer_fraction)
    out["failure_buffer"] = _buffer(pool.failure_buffer_hosts, pool.failure_buffer_fraction)
    if pool.hard_floor_hosts is not None:
        out["hard_floor"] = pool.hard_floor_hosts
    out["executor"] = pool.executor
    out["drainer"] = pool.drainer
    out["domains"] = domains
    return out


def _hosts(pool_names: dict[int, str], domain_names: dict[int, str]) -> tuple[list[dict[str, Any]], dict[int, str]]:
    hosts = []
    host_ids = {}
    rows = (
        Host.objects.filter(pool_id__in=pool_names)
        .order_by("hostname")
        .values_list("id", "hostname", "pool_id", "domain_id", "sku", "gpu_count", "labels")
        .iterator(chunk_size=20_000)
    )
    for pk, hostname, pool_id, domain_id, sku, gpu_count, labels in rows:
        host: dict[str, Any] = {
            "hostname": hostname,
            "pool": pool_names[pool_id],
            "domain": domain_names[domain_id],
            "sku": sku,
        }
        host["gpu_count"] = gpu_count
        if labels:
            host["labels"] = labels
        hosts.append(host)
        host_ids[pk] = hostname
    return hosts, host_ids


def _components() -> list[dict[str, Any]]:
    versions: dict[int, list[Any]] = {}
    for component_id, version, withdrawn_at, reason in ComponentVersion.objects.order_by(
        "component_id", "sort_key"
    ).values_list("component_id", "version", "withdrawn_at", "withdrawn_reason"):
        item = version if withdrawn_at is None else {"version": version, "withdrawn": reason}
        versions.setdefault(component_id, []).append(item)
    return [
        {
            "name": c.name,
            "display_name": c.display_name,
            "layer": c.layer,
            "needs_drain": c.needs_drain,
            "needs_reboot": c.needs_reboot,
            "versions": versions.get(c.id, []),
        }
        for c in Component.objects.order_by("name")
    ]


def _rules() -> list[dict[str, Any]]:
    rules = []
    for job, version, lower, low, high, note in CompatibilityRule.objects.order_by(
        "job_facing_version__component__name", "job_facing_version__sort_key", "lower_component__name", "min_key"
    ).values_list(
        "job_facing_version__component__name", "job_facing_version__version", "lower_component__name",
        "min_version", "max_version", "note",
    ):  # fmt: skip
        rule = {"job_facing": job, "version": version, "lower": lower}
        rule.update({k: v for k, v in (("min", low), ("max", high), ("note", note)) if v})
        rules.append(rule)
    return rules


def _services(host_ids: dict[int, str]) -> list[dict[str, Any]]:
    owners: dict[int, list[str]] = {}
    for service_id, username in Service.owners.through.objects.order_by("user__username").values_list(
        "service_id", "user__username"
    ):
        owners.setdefault(service_id, []).append(username)
    placements: dict[int, list[Any]] = {}
    for service_id, host_id, jobs in (
        ServicePlacement.objects.filter(host_id__any=list(host_ids)).order_by().values_list(
            "service_id", "host_id", "running_jobs"
        ).iterator(chunk_size=20_000)
    ):  # fmt: skip
        hostname = host_ids[host_id]
        placements.setdefault(service_id, []).append(
            hostname if jobs == 1 else {"host": hostname, "running_jobs": jobs}
        )
    out = []
    for service in Service.objects.order_by("name"):
        item: dict[str, Any] = {"name": service.name, "display_name": service.display_name}
        if service.description:
            item["description"] = service.description
        item["owners"] = owners.get(service.id, [])
        item["placements"] = sorted(
            placements.get(service.id, []), key=lambda p: p if isinstance(p, str) else p["host"]
        )
        out.append(item)
    return out


def fleet_export_text(document: dict[str, Any], *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(document, indent=1, sort_keys=False) + "\n"
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(document, Dumper=dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)
