"""What-if on the live fleet, in a lane: the snapshot `simulation.from_live.live_snapshot` took,
written back as the scratch lane's world (`live_world_create`, in a `simulate --shard` process):
the pool, its domains and hosts (every one in service: the work in flight is assumed finished),
their installed versions, the catalogue and its rules, the services with their opt-out windows and
reservations still ahead, and the trains with their live state (TrainsPolicy recreates them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from fleet.models import (
    CapacityReservation,
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
from opsplanner.bulk import insert_missing
from simulation.config import SimulationConfig
from simulation.from_live import live_train_spec, snapshot_read
from simulation.world import SimPool, World


def live_world_create(config: SimulationConfig, *, lockstep: bool = False) -> World:
    """Write the snapshot's pool into the (emptied) scratch lane; the world the engine runs."""
    snapshot = snapshot_read(config)
    now = config.start
    _catalogue(snapshot, now)
    pool = snapshot["pool"]
    hosts = len(snapshot["hosts"])
    insert_missing(
        Pool,
        ["name", "workload_class", "description", "planned_buffer_hosts", "planned_buffer_fraction",
         "failure_buffer_hosts", "failure_buffer_fraction", "hard_floor_hosts", "created_at"],
        [(pool["name"], pool["workload_class"], "copied from the live fleet",
          hosts if lockstep else pool["planned_buffer_hosts"], None if lockstep else pool["planned_buffer_fraction"],
          0 if lockstep else pool["failure_buffer_hosts"], None if lockstep else pool["failure_buffer_fraction"],
          None if lockstep else pool["hard_floor_hosts"], now)],
    )  # fmt: skip
    pool_id = Pool.objects.values_list("id", flat=True).get(name=pool["name"])
    insert_missing(
        MaintenanceDomain,
        ["pool_id", "name", "kind", "position", "created_at"],
        [(pool_id, name, kind, position, now) for name, kind, position in snapshot["domains"]],
    )
    domain_ids = dict(MaintenanceDomain.objects.filter(pool_id=pool_id).values_list("name", "id"))
    insert_missing(
        Host,
        ["hostname", "pool_id", "domain_id", "state", "state_changed_at", "sku", "gpu_count", "created_at"],
        [(name, pool_id, domain_ids[domain], HostState.IN_SERVICE, now, sku, gpus, now)
         for name, domain, sku, gpus in snapshot["hosts"]],
    )  # fmt: skip
    host_ids = dict(Host.objects.filter(pool_id=pool_id).values_list("hostname", "id"))
    _installed(snapshot, host_ids, now)
    jobs = _jobs(snapshot, host_ids, pool_id, now)
    world = World(
        pools=[
            SimPool(
                id=pool_id, name=pool["name"], number=0,
                host_ids=[host_ids[name] for name, *_ in snapshot["hosts"]], domain_ids=list(domain_ids.values()),
            )
        ],
        components=[name for name, *_ in snapshot["components"]],
        jobs=jobs,
    )  # fmt: skip
    world.trains = {pool_id: [live_train_spec(train) for train in snapshot["trains"]]}
    world.optout_hours = sum(
        (dt.datetime.fromisoformat(ends) - max(now, dt.datetime.fromisoformat(starts))).total_seconds() / 3600
        for _, starts, ends, _ in snapshot["optouts"]
    )
    return world


def _catalogue(snapshot: dict[str, Any], now: dt.datetime) -> None:
    insert_missing(
        Component,
        ["name", "display_name", "layer", "needs_reboot", "needs_drain"],
        [tuple(row) for row in snapshot["components"]],
    )
    component_ids = dict(Component.objects.values_list("name", "id"))
    insert_missing(
        ComponentVersion,
        ["component_id", "version", "sort_key", "released_at", "withdrawn_at", "withdrawn_reason", "withdrawn_by"],
        [
            (component_ids[name], version, version_sort_key(version), released or now, withdrawn, reason, by)
            for name, version, released, withdrawn, reason, by in snapshot["versions"]
            if name in component_ids
        ],
    )
    _rules(snapshot)


def _catalogue_ids() -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """The lane's versions by (component, version) and its components by name: their ids."""
    versions = {
        (name, version): pk
        for pk, name, version in ComponentVersion.objects.values_list("id", "component__name", "version")
    }
    return versions, dict(Component.objects.values_list("name", "id"))


def _rules(snapshot: dict[str, Any]) -> None:
    """The compatibility rules, so a forecast refuses what the live planner would refuse."""
    versions, component_ids = _catalogue_ids()
    insert_missing(
        CompatibilityRule,
        ["job_facing_version_id", "lower_component_id", "min_version", "min_key", "max_version", "max_key", "note"],
        [
            (versions[(name, version)], component_ids[lower], *rest)
            for name, version, lower, *rest in snapshot.get("rules", [])
            if (name, version) in versions and lower in component_ids
        ],
    )


def _installed(snapshot: dict[str, Any], host_ids: dict[str, int], now: dt.datetime) -> None:
    versions, component_ids = _catalogue_ids()
    insert_missing(
        InstalledVersion,
        ["host_id", "component_id", "version_id", "installed_at"],
        [
            (host_ids[host], component_ids[component], versions[(component, version)], now)
            for host, component, version in snapshot["installed"]
            if (component, version) in versions
        ],
    )


def _jobs(snapshot: dict[str, Any], host_ids: dict[str, int], pool_id: int, now: dt.datetime) -> dict[int, list[int]]:
    """The pool's services as jobs, with their opt-out windows and reservations still ahead."""
    names = sorted({service for service, *_ in snapshot["placements"]} | {r[0] for r in snapshot["reservations"]})
    insert_missing(
        Service, ["name", "display_name", "description"], [(n, n, "copied from the live fleet") for n in names]
    )
    service_ids = dict(Service.objects.values_list("name", "id"))
    insert_missing(
        ServicePlacement,
        ["service_id", "host_id", "running_jobs"],
        [(service_ids[s], host_ids[h], jobs) for s, h, jobs in snapshot["placements"]],
    )
    insert_missing(
        OptOutWindow,
        ["service_id", "starts_at", "ends_at", "reason", "created_at"],
        [(service_ids[s], starts, ends, reason, now) for s, starts, ends, reason in snapshot["optouts"]],
    )
    insert_missing(
        CapacityReservation,
        ["service_id", "pool_id", "starts_at", "ends_at", "reason", "min_hosts_in_service", "created_at"],
        [(service_ids[s], pool_id, st, en, reason, kept, now) for s, st, en, reason, kept in snapshot["reservations"]],
    )
    jobs: dict[int, list[int]] = {}
    for service, host, _ in snapshot["placements"]:
        jobs.setdefault(service_ids[service], []).append(host_ids[host])
    return jobs
