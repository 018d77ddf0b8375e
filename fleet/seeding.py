"""Writing the demo fleet plan (fleet.demo) to the database: one transaction, set-based, idempotent."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from django.db import transaction

from fleet import demo
from fleet.models import (
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    HostState,
    InstalledVersion,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
    ServicePlacement,
)
from fleet.versions import version_sort_key
from opsplanner import clock
from opsplanner.bulk import insert_missing
from opsplanner.events import event_record
from opsplanner.progress import Progress

CHUNK = 10_000


@dataclass
class SeedReport:
    created: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, count: int) -> None:
        self.created[what] = self.created.get(what, 0) + count

    @property
    def changed_anything(self) -> bool:
        return any(self.created.values())


@transaction.atomic
def demo_fleet_seed(*, hosts: int, seed: int = 42, progress: Progress | None = None) -> SeedReport:
    """Write the demo fleet for `hosts` hosts. Rows already present are left as they are."""
    per_pool = demo.hosts_per_pool(hosts)
    progress = progress or Progress("seed_demo")
    report = SeedReport()
    now = clock.now()

    versions = _seed_components(report, now)
    pools = _seed_pools(report, now)
    services = _seed_services(report)
    for plan in demo.POOLS:
        _seed_pool_hosts(plan, pools[plan.name], per_pool[plan.name], seed, versions, services, report, now, progress)
    _seed_optout_windows(services, report, now)

    if report.changed_anything:
        event_record(
            kind="fleet.seeded",
            subject=Pool.objects.get(name=demo.POOLS[0].name),
            actor="seed_demo",
            reason=f"demo fleet of {hosts:,} hosts (seed {seed})",
            data={"hosts": hosts, "seed": seed, "created": report.created},
        )
    progress.note("done" if report.changed_anything else "nothing to do, the fleet is already there")
    return report


def _seed_components(report: SeedReport, now: dt.datetime) -> dict[tuple[str, str], int]:
    report.add(
        "components",
        insert_missing(
            Component,
            ["name", "display_name", "layer", "needs_reboot", "needs_drain"],
            [(c.name, c.display_name, c.layer, c.needs_reboot, c.needs_drain) for c in demo.COMPONENTS],
        ),
    )
    component_ids = dict(Component.objects.values_list("name", "id"))
    report.add(
        "component_versions",
        insert_missing(
            ComponentVersion,
            ["component_id", "version", "sort_key", "released_at"],
            [
                (component_ids[c.name], version, version_sort_key(version), now)
                for c in demo.COMPONENTS
                for version in c.versions
            ],
        ),
    )
    versions = {
        (name, version): version_id
        for name, version, version_id in ComponentVersion.objects.values_list("component__name", "version", "id")
    }
    report.add(
        "compatibility_rules",
        insert_missing(
            CompatibilityRule,
            ["job_facing_version_id", "lower_component_id", "min_version", "min_key", "max_version", "max_key", "note"],
            [
                (
                    versions[(job_facing, job_version)],
                    component_ids[lower],
                    low,
                    version_sort_key(low) if low else "",
                    high,
                    version_sort_key(high) if high else "",
                    "demo rule",
                )
                for job_facing, job_version, lower, low, high in demo.COMPATIBILITY
            ],
        ),
    )
    return versions


def _seed_pools(report: SeedReport, now: dt.datetime) -> dict[str, int]:
    report.add(
        "pools",
        insert_missing(
            Pool,
            [
                "name",
                "workload_class",
                "description",
                "planned_buffer_hosts",
                "planned_buffer_fraction",
                "failure_buffer_hosts",
                "failure_buffer_fraction",
                "created_at",
            ],
            [
                (
                    p.name,
                    p.workload_class,
                    p.description,
                    p.planned_buffer_hosts,
                    p.planned_buffer_fraction,
                    p.failure_buffer_hosts,
                    p.failure_buffer_fraction,
                    now,
                )
                for p in demo.POOLS
            ],
        ),
    )
    return dict(Pool.objects.filter(name__in=[p.name for p in demo.POOLS]).values_list("name", "id"))


def _seed_services(report: SeedReport) -> dict[str, int]:
    report.add(
        "services",
        insert_missing(
            Service,
            ["name", "display_name", "description"],
            [(name, display, "") for name, display in demo.SERVICES.items()],
        ),
    )
    return dict(Service.objects.filter(name__in=list(demo.SERVICES)).values_list("name", "id"))


def _seed_pool_hosts(
    plan: demo.PoolPlan,
    pool_id: int,
    host_count: int,
    seed: int,
    versions: dict[tuple[str, str], int],
    services: dict[str, int],
    report: SeedReport,
    now: dt.datetime,
    progress: Progress,
) -> None:
    racks = math.ceil(host_count / plan.hosts_per_rack)
    report.add(
        "domains",
        insert_missing(
            MaintenanceDomain,
            ["pool_id", "name", "kind", "position", "created_at"],
            [(pool_id, demo.rack_name(rack), demo.DOMAIN_KIND, rack, now) for rack in range(1, racks + 1)],
        ),
    )
    domain_ids = dict(MaintenanceDomain.objects.filter(pool_id=pool_id).values_list("name", "id"))

    # (rack, slot) for every host of the pool, racks filled in order.
    layout = [(index // plan.hosts_per_rack + 1, index % plan.hosts_per_rack + 1) for index in range(host_count)]
    for start in range(0, host_count, CHUNK):
        chunk = layout[start : start + CHUNK]
        report.add(
            "hosts",
            insert_missing(
                Host,
                ["hostname", "pool_id", "domain_id", "state", "state_changed_at", "sku", "gpu_count", "created_at"],
                [
                    (
                        demo.hostname(plan, rack, slot),
                        pool_id,
                        domain_ids[demo.rack_name(rack)],
                        HostState.IN_SERVICE,
                        now,
                        plan.sku,
                        plan.gpu_count,
                        now,
                    )
                    for rack, slot in chunk
                ],
            ),
        )
        progress.update(f"{plan.name} hosts", start + len(chunk), host_count)

    host_ids = dict(Host.objects.filter(pool_id=pool_id).values_list("hostname", "id"))
    rack_versions = {rack: demo.rack_versions(plan, rack, seed) for rack in range(1, racks + 1)}
    component_ids = dict(Component.objects.values_list("name", "id"))
    jobs = demo.running_jobs(plan)
    for start in range(0, host_count, CHUNK):
        chunk = layout[start : start + CHUNK]
        installed_rows = []
        placement_rows = []
        for rack, slot in chunk:
            host_id = host_ids[demo.hostname(plan, rack, slot)]
            for component, version in rack_versions[rack].items():
                installed_rows.append((host_id, component_ids[component], versions[(component, version)], now))
            placement_rows.append((services[demo.rack_service(plan, rack)], host_id, jobs))
        report.add(
            "installed_versions",
            insert_missing(InstalledVersion, ["host_id", "component_id", "version_id", "installed_at"], installed_rows),
        )
        report.add(
            "service_placements",
            insert_missing(ServicePlacement, ["service_id", "host_id", "running_jobs"], placement_rows),
        )
        progress.update(f"{plan.name} versions and placements", start + len(chunk), host_count)


def _seed_optout_windows(services: dict[str, int], report: SeedReport, now: dt.datetime) -> None:
    existing = set(OptOutWindow.objects.filter(reason__startswith="[demo]").values_list("service_id", "reason"))
    hour = now.replace(minute=0, second=0, microsecond=0)
    windows = [
        OptOutWindow(
            service_id=services[service],
            starts_at=hour + dt.timedelta(hours=starts_in),
            ends_at=hour + dt.timedelta(hours=starts_in + lasts),
            reason=reason,
            created_at=now,
        )
        for service, starts_in, lasts, reason in demo.OPTOUT_WINDOWS
        if (services[service], reason) not in existing
    ]
    OptOutWindow.objects.bulk_create(windows)
    report.add("optout_windows", len(windows))
