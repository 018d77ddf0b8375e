"""Building benchmark fleets fast: pools of racks of hosts, written with COPY (no events, no checks)."""

from __future__ import annotations

from decimal import Decimal

from fleet.models import Host, HostState, MaintenanceDomain, Pool
from opsplanner import clock
from opsplanner.bulk import insert_missing


def bench_fleet(*, pools: int, hosts_per_pool: int, hosts_per_domain: int, planned_fraction: str) -> list[Pool]:
    now = clock.now()
    insert_missing(
        Pool,
        ["name", "workload_class", "description", "planned_buffer_fraction", "failure_buffer_fraction", "created_at"],
        [(f"bench-{p:02d}", "ai_training", "", Decimal(planned_fraction), Decimal("0.05"), now) for p in range(pools)],
    )
    created = list(Pool.objects.filter(name__startswith="bench-").order_by("name"))
    for pool in created:
        domains = -(-hosts_per_pool // hosts_per_domain)
        insert_missing(
            MaintenanceDomain,
            ["pool_id", "name", "kind", "position", "created_at"],
            [(pool.pk, f"rack-{d:04d}", "rack", d, now) for d in range(1, domains + 1)],
        )
        domain_ids = dict(MaintenanceDomain.objects.filter(pool=pool).values_list("name", "id"))
        insert_missing(
            Host,
            ["hostname", "pool_id", "domain_id", "state", "state_changed_at", "sku", "gpu_count", "created_at"],
            [
                (
                    f"{pool.name}-h{h:06d}",
                    pool.pk,
                    domain_ids[f"rack-{h // hosts_per_domain + 1:04d}"],
                    HostState.IN_SERVICE,
                    now,
                    "gpu-h100-8x",
                    8,
                    now,
                )
                for h in range(hosts_per_pool)
            ],
        )
    return created
