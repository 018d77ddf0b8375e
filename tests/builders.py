"""Small builders for tests: each makes one thing through the services, with sensible defaults."""

from __future__ import annotations

import itertools
from decimal import Decimal

from fleet import services
from fleet.models import Component, ComponentLayer, ComponentVersion, Host, MaintenanceDomain, Pool, Service

_counter = itertools.count(1)


def _n() -> int:
    return next(_counter)


def make_pool(**overrides: object) -> Pool:
    fields: dict[str, object] = {
        "name": f"pool-{_n()}",
        "workload_class": "ai_training",
        "planned_buffer_fraction": Decimal("0.1"),
        "failure_buffer_fraction": Decimal("0.05"),
    }
    fields.update(overrides)
    return services.pool_create(**fields)  # type: ignore[arg-type]


def make_domain(pool: Pool | None = None, **overrides: object) -> MaintenanceDomain:
    return services.domain_create(pool=pool or make_pool(), name=str(overrides.pop("name", f"rack-{_n()}")))


def make_host(domain: MaintenanceDomain | None = None, **overrides: object) -> Host:
    fields: dict[str, object] = {"hostname": f"host-{_n()}", "sku": "gpu-h100-8x", "gpu_count": 8}
    fields.update(overrides)
    return services.host_create(domain=domain or make_domain(), **fields)  # type: ignore[arg-type]


def make_component(layer: str = ComponentLayer.LOWER_LEVEL, **overrides: object) -> Component:
    fields: dict[str, object] = {"name": f"component-{_n()}", "layer": layer}
    fields.update(overrides)
    return services.component_create(**fields)  # type: ignore[arg-type]


def make_version(component: Component, version: str) -> ComponentVersion:
    return services.component_version_create(component=component, version=version)


def make_service(**overrides: object) -> Service:
    fields: dict[str, object] = {"name": f"service-{_n()}"}
    fields.update(overrides)
    return services.service_create(**fields)  # type: ignore[arg-type]


def make_fleet(
    *,
    domains: int = 2,
    hosts_per_domain: int = 5,
    planned_buffer_hosts: int | None = None,
    failure_buffer_hosts: int = 2,
    pool_name: str | None = None,
) -> tuple[Pool, list[Host]]:
    """A pool with racks of hosts running cuda 12.4.1 and driver 550.127.05 (compatible), plus the
    catalogue: driver 560.35.03 (compatible) and 535.183.01 (not), bios 2.14.0 and 2.16.0."""
    planned = planned_buffer_hosts if planned_buffer_hosts is not None else hosts_per_domain
    pool = make_pool(
        name=pool_name or f"pool-{_n()}",
        planned_buffer_hosts=planned,
        planned_buffer_fraction=None,
        failure_buffer_hosts=failure_buffer_hosts,
        failure_buffer_fraction=None,
    )
    catalogue = _catalogue()
    hosts = []
    for d in range(domains):
        domain = services.domain_create(pool=pool, name=f"rack-{d + 1:04d}", position=d + 1)
        for _ in range(hosts_per_domain):
            host = make_host(domain)
            for version in (
                catalogue["cuda-runtime"]["12.4.1"],
                catalogue["gpu-driver"]["550.127.05"],
                catalogue["bios"]["2.14.0"],
            ):
                services.installed_version_set(host=host, version=version)
            hosts.append(host)
    return pool, hosts


def _catalogue() -> dict[str, dict[str, ComponentVersion]]:
    """The components and versions make_fleet uses, created once per test database."""
    wanted = {
        ("cuda-runtime", ComponentLayer.JOB_FACING): ["12.4.1"],
        ("gpu-driver", ComponentLayer.LOWER_LEVEL): ["535.183.01", "550.127.05", "560.35.03"],
        ("bios", ComponentLayer.LOWER_LEVEL): ["2.14.0", "2.16.0"],
    }
    catalogue: dict[str, dict[str, ComponentVersion]] = {}
    for (name, layer), versions in wanted.items():
        component = Component.objects.filter(name=name).first() or make_component(layer, name=name)
        catalogue[name] = {
            v: ComponentVersion.objects.filter(component=component, version=v).first() or make_version(component, v)
            for v in versions
        }
    cuda = catalogue["cuda-runtime"]["12.4.1"]
    if not cuda.compatibility_rules.exists():
        services.compatibility_rule_create(
            job_facing_version=cuda,
            lower_component=catalogue["gpu-driver"]["550.127.05"].component,
            min_version="550.54.14",
        )
    return catalogue
