"""The simulated world: a generated fleet written with COPY, and the work that will arrive.

Everything is drawn from one seeded random generator per purpose, so the same seed gives the
same fleet, the same upgrade stream and the same failures whichever policy runs.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

from fleet.models import (
    Component,
    ComponentLayer,
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
from simulation.config import Arrival, Failure, SimulationConfig, Workload

COMPONENT_NAMES = ["bios", "nic-firmware", "gpu-driver", "bmc-firmware", "kernel", "ssd-firmware", "os-image"]
BASE_VERSION = "1.0.0"


@dataclass
class SimPool:
    id: int
    name: str
    number: int  # its position in the whole simulated fleet (arrivals and failures name pools by it)
    host_ids: list[int]  # in rack order
    domain_ids: list[int]


@dataclass
class World:
    pools: list[SimPool] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    jobs: dict[int, list[int]] = field(default_factory=dict)  # service id -> its hosts
    optout_hours: float = 0.0
    # pool id -> the live trains to recreate (a what-if on the live fleet); empty: one train from the config
    trains: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def pool_ids(self) -> list[int]:
        return [pool.id for pool in self.pools]

    def pool(self, number: int) -> SimPool:
        return next(pool for pool in self.pools if pool.number == number)


def component_names(count: int) -> list[str]:
    names = COMPONENT_NAMES[:count]
    return names + [f"component-{n}" for n in range(len(names), count)]


def workload_draw(config: SimulationConfig) -> Workload:
    """The upgrades that arrive (a Poisson stream per pool, components in turn, versions rising) and
    the hosts that break (a Poisson stream over the fleet). A what-if on the live fleet: its pending
    upgrades and the failures of its hosts."""
    if config.live_snapshot:
        from simulation.from_live import live_workload

        return live_workload(config)
    arrivals: list[Arrival] = []
    names = component_names(config.components)
    seconds = config.days * 86_400
    next_version = dict.fromkeys(names, 1)
    for pool in range(config.pools):
        rng = random.Random(f"{config.seed}:arrivals:{pool}")
        for n in range(config.upgrades_at_start):
            arrivals.append(Arrival(at=config.start, pool=pool, component=names[n % len(names)], version=""))
        rate = config.upgrades_per_week / (7 * 86_400)
        at = rng.expovariate(rate) if rate else seconds
        while at < seconds:
            component = rng.choice(names)
            arrivals.append(
                Arrival(at=config.start + dt.timedelta(seconds=at), pool=pool, component=component, version="")
            )
            at += rng.expovariate(rate)
    arrivals.sort(key=lambda a: (a.at, a.pool))
    for arrival in arrivals:  # versions rise in arrival order, fleet-wide, as a vendor releases them
        arrival.version = f"1.{next_version[arrival.component]}.0"
        next_version[arrival.component] += 1
    failures: list[Failure] = []
    rng = random.Random(f"{config.seed}:failures")
    rate = config.host_failures_per_day * config.pools * config.hosts_per_pool / 86_400
    at = rng.expovariate(rate) if rate else seconds
    while at < seconds:
        failures.append(
            Failure(
                at=config.start + dt.timedelta(seconds=at),
                pool=rng.randrange(config.pools),
                host_index=rng.randrange(config.hosts_per_pool),
            )
        )
        at += rng.expovariate(rate)
    return Workload(arrivals=arrivals, failures=failures)


def world_create(
    config: SimulationConfig, workload: Workload, *, lockstep: bool = False, pools: list[int] | None = None
) -> World:
    """Write the fleet (or only the pools numbered in `pools`: a shard). A lock-step fleet lets its
    planned buffer hold the whole pool (that is what lock-step means); every other policy gets the
    buffers of the configuration. A what-if on the live fleet writes its snapshot instead."""
    if config.live_snapshot:
        from simulation.from_live_lane import live_world_create

        return live_world_create(config, lockstep=lockstep)
    now = config.start
    world = World(components=component_names(config.components))
    _components(world, workload, now)
    versions = dict(ComponentVersion.objects.filter(version=BASE_VERSION).values_list("component__name", "id"))
    component_ids = dict(Component.objects.values_list("name", "id"))
    per_pool = config.hosts_per_pool
    numbers = list(range(config.pools)) if pools is None else sorted(pools)
    planned = per_pool if lockstep else config.planned_buffer_hosts
    failure = 0 if lockstep else config.failure_buffer_hosts
    insert_missing(
        Pool,
        ["name", "workload_class", "description", "planned_buffer_hosts", "failure_buffer_hosts", "created_at"],
        [(f"sim-{p:02d}", "ai_training", "simulated", planned, failure, now) for p in numbers],
    )
    pool_ids = dict(Pool.objects.filter(name__startswith="sim-").values_list("name", "id"))
    for p in numbers:
        name = f"sim-{p:02d}"
        pool_id = pool_ids[name]
        domains = config.domains_per_pool
        insert_missing(
            MaintenanceDomain,
            ["pool_id", "name", "kind", "position", "created_at"],
            [(pool_id, f"rack-{d:04d}", "rack", d, now) for d in range(1, domains + 1)],
        )
        domain_ids = dict(MaintenanceDomain.objects.filter(pool_id=pool_id).values_list("position", "id"))
        insert_missing(
            Host,
            ["hostname", "pool_id", "domain_id", "state", "state_changed_at", "sku", "gpu_count", "created_at"],
            [
                (
                    f"{name}-h{h:06d}",
                    pool_id,
                    domain_ids[h // config.hosts_per_domain + 1],
                    HostState.IN_SERVICE,
                    now,
                    "gpu-h100-8x",
                    8,
                    now,
                )
                for h in range(per_pool)
            ],
        )
        host_ids = list(Host.objects.filter(pool_id=pool_id).order_by("hostname").values_list("id", flat=True))
        world.pools.append(
            SimPool(id=pool_id, name=name, number=p, host_ids=host_ids, domain_ids=list(domain_ids.values()))
        )
        insert_missing(
            InstalledVersion,
            ["host_id", "component_id", "version_id", "installed_at"],
            [(h, component_ids[c], versions[c], now) for h in host_ids for c in world.components],
        )
    _jobs(config, world)
    _optout_windows(config, world)
    return world


def _components(world: World, workload: Workload, now: dt.datetime) -> None:
    insert_missing(
        Component,
        ["name", "display_name", "layer", "needs_reboot", "needs_drain"],
        [(name, name, ComponentLayer.LOWER_LEVEL, True, True) for name in world.components],
    )
    component_ids = dict(Component.objects.values_list("name", "id"))
    wanted = {(name, BASE_VERSION) for name in world.components} | {(a.component, a.version) for a in workload.arrivals}
    insert_missing(
        ComponentVersion,
        ["component_id", "version", "sort_key", "released_at"],
        [(component_ids[name], version, version_sort_key(version), now) for name, version in sorted(wanted)],
    )


def _jobs(config: SimulationConfig, world: World) -> None:
    """Each pool is covered by jobs of random sizes on consecutive hosts (as a scheduler packs
    them); a job is a service with one running job, interrupted when any of its hosts goes out."""
    spans: list[tuple[str, list[int]]] = []
    for pool in world.pools:
        rng = random.Random(f"{config.seed}:jobs:{pool.number}")
        start = 0
        while start < len(pool.host_ids):
            size = rng.randint(config.job_hosts_min, config.job_hosts_max)
            spans.append((f"{pool.name}-job-{start:06d}", pool.host_ids[start : start + size]))
            start += size
    insert_missing(
        Service, ["name", "display_name", "description"], [(name, name, "simulated job") for name, _ in spans]
    )
    service_ids = dict(Service.objects.filter(name__contains="-job-").values_list("name", "id"))
    insert_missing(
        ServicePlacement,
        ["service_id", "host_id", "running_jobs"],
        [(service_ids[name], host, 1) for name, hosts in spans for host in hosts],
    )
    world.jobs = {service_ids[name]: hosts for name, hosts in spans}


def _optout_windows(config: SimulationConfig, world: World) -> None:
    """Opt-out windows of 2-8 hours on random jobs, spread over the simulated time."""
    jobs_by_pool: dict[int, list[int]] = {pool.id: [] for pool in world.pools}
    pool_of_host = {h: pool.id for pool in world.pools for h in pool.host_ids}
    for service_id, hosts in sorted(world.jobs.items()):
        jobs_by_pool[pool_of_host[hosts[0]]].append(service_id)
    rows = []
    count = round(config.optout_windows_per_week * config.days / 7)
    for pool in world.pools:
        rng = random.Random(f"{config.seed}:optouts:{pool.number}")
        for _ in range(count):
            starts = config.start + dt.timedelta(seconds=rng.uniform(0, config.days * 86_400))
            hours = rng.uniform(2, 8)
            rows.append(
                (
                    rng.choice(jobs_by_pool[pool.id]),
                    starts,
                    starts + dt.timedelta(hours=hours),
                    "simulated: a job that must not be interrupted",
                    config.start,
                )
            )
            world.optout_hours += hours
    insert_missing(OptOutWindow, ["service_id", "starts_at", "ends_at", "reason", "created_at"], rows)
