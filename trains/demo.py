"""A demo that comes alive: on a freshly seeded demo fleet, everything the console shows is in motion
within the first minute, made through the same services an operator's actions use.

- the simulated hardware runs at demo speed (a host's drain, upgrade, checks and return take about
  half a minute, so a visit takes about a minute, not an hour);
- every pool has a train, and every train has an upgrade to apply; the training pool's goes through
  phases (a canary rack, then a quarter, then the rest);
- one upgrade is doomed: its version fails on most hosts and the planner offboards it;
- a service opts out of one rack of web-central for two hours, so that train skips the rack;
- a capacity reservation holds part of the inference pool;
- an emergency train waits for the second operator's approval;
- a storage host breaks and goes through repair.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction

from fleet.models import Component, Host, HostState, MaintenanceDomain, Pool, Service
from fleet.services.inventory import component_version_create
from fleet.services.owners import optout_window_create, reservation_create, service_create, service_place
from opsplanner import clock
from opsplanner.events import Actor
from opsplanner.models import SimulatorProfile
from opsplanner.services.failures import host_failure_report
from trains.models import Train
from trains.services.emergency import emergency_train_request
from trains.services.trains import train_create
from trains.services.upgrades import upgrade_create

VISIT_ESTIMATE_S = 60
# A release candidate no host runs yet; it fails on most hosts of ai-infer-west, so the planner
# offboards it after a few failures (and withdraws it, which touches no other host).
DOOMED = ("bmc", "1.11.0-rc1")
DEMO_SPEED = {"drain_seconds": 5.0, "execute_seconds": 10.0, "verify_seconds": 3.0, "undrain_seconds": 2.0}
OPTED_OUT_SERVICE = "nightly-batch"

# pool -> (component, version, phases)
UPGRADES: dict[str, tuple[str, str, list[dict] | None]] = {
    "ai-train-east": (
        "bios",
        "2.16.0",
        [
            {"name": "canary", "domain": "rack-0001", "min_successes": 2, "soak_s": 30},
            {"name": "quarter", "percent": 25, "min_successes": 4, "soak_s": 30},
            {"name": "rest", "percent": 100},
        ],
    ),
    "ai-infer-west": (*DOOMED, None),
    "web-central": ("kernel", "6.6.58", None),
    "storage-north": ("nic-fw", "28.41.1000", None),
}


@dataclass(frozen=True)
class DemoAlive:
    trains: int
    upgrades: int
    approval_waiting: bool
    broken_host: str


def demo_is_alive() -> bool:
    return Train.objects.exists()


@transaction.atomic
def demo_bring_alive(*, operator: Actor) -> DemoAlive:
    """Put the demo fleet in motion (see the module's docstring). The caller checks demo_is_alive()."""
    _demo_speed()
    bmc = Component.objects.get(name=DOOMED[0])
    if not bmc.versions.filter(version=DOOMED[1]).exists():
        component_version_create(component=bmc, version=DOOMED[1], actor=operator)
    pools = {pool.name: pool for pool in Pool.objects.order_by("name")}
    trains = upgrades = 0
    for name, pool in pools.items():
        domains = MaintenanceDomain.objects.filter(pool=pool).count()
        train_create(
            pool=pool,
            name=f"{name}-train",
            # Room for every rack at demo speed, with margin: the SLO is kept, not missed by design.
            cycle_slo_s=max(domains * VISIT_ESTIMATE_S * 3, 3600),
            visit_estimate_s=VISIT_ESTIMATE_S,
            actor=operator,
        )
        trains += 1
        if name in UPGRADES:
            component, version, phases = UPGRADES[name]
            upgrade_create(
                pool=pool,
                component=component,
                version=version,
                reason=f"demo: {component} {version} across {name}",
                phases=phases,
                max_failures=2,
                actor=operator,
            )
            upgrades += 1
    now = clock.now()
    if "web-central" in pools:
        _opt_out_one_rack(pools["web-central"], now=now, actor=operator)
    if "ai-infer-west" in pools:
        _reserve(pools["ai-infer-west"], now=now, actor=operator)
    approval = False
    if "storage-north" in pools:
        emergency_train_request(
            pool=pools["storage-north"],
            component="kernel",
            version="6.6.58",
            reason="demo: a kernel CVE; needs a second operator's approval",
            actor=operator,
        )
        approval = True
    broken = _break_a_host(pools.get("storage-north"), actor=operator)
    return DemoAlive(trains=trains, upgrades=upgrades, approval_waiting=approval, broken_host=broken)


def _demo_speed() -> None:
    profile = SimulatorProfile.current()
    for name, value in DEMO_SPEED.items():
        setattr(profile, name, value)
    profile.execute_by_kind = {**profile.execute_by_kind, f"upgrade:{DOOMED[0]}:{DOOMED[1]}": {"failure_rate": 0.8}}
    profile.full_clean()
    profile.save()


def _opt_out_one_rack(pool: Pool, *, now: dt.datetime, actor: Actor) -> None:
    """A batch service on the pool's second rack opts out for two hours: the train skips that rack."""
    racks = list(MaintenanceDomain.objects.filter(pool=pool).order_by("position", "id")[:2])
    if len(racks) < 2:
        return
    service = Service.objects.filter(name=OPTED_OUT_SERVICE).first() or service_create(
        name=OPTED_OUT_SERVICE, display_name="Nightly batch", description="demo: a job that must not be drained"
    )
    service_place(service=service, hosts=Host.objects.filter(domain=racks[1]), actor=actor)
    optout_window_create(
        service=service,
        starts_at=now,
        ends_at=now + dt.timedelta(hours=2),
        reason=f"demo: quarter-end batch on {racks[1].name}",
        actor=actor,
    )


def _reserve(pool: Pool, *, now: dt.datetime, actor: Actor) -> None:
    service = Service.objects.filter(placements__host__pool=pool).distinct().order_by("name").first()
    if service is None:
        return
    hosts = Host.objects.filter(pool=pool).count()
    reservation_create(
        service=service,
        pool=pool,
        # Well below what the buffers leave in service: the reservation shows, trains still move.
        min_hosts_in_service=max(1, int(hosts * 0.7)),
        starts_at=now,
        ends_at=now + dt.timedelta(hours=4),
        reason="demo: launch-day traffic",
        actor=actor,
    )


def _break_a_host(pool: Pool | None, *, actor: Actor) -> str:
    if pool is None:
        return ""
    host = Host.objects.filter(pool=pool, state=HostState.IN_SERVICE).order_by("-hostname").first()
    if host is None:
        return ""
    host_failure_report(host_id=host.pk, reason="demo: ECC errors on DIMM B2", actor=actor)
    return host.hostname
