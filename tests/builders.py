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
