"""Builders for trains tests: users with roles, a third drained component, trains over a fleet."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import NamedTuple

from django.contrib.auth.models import Group, User
from django.db.models import F

from fleet.models import ComponentLayer, ComponentVersion, Host, Pool
from opsplanner.models import HostTask
from opsplanner.roles import Role
from tests.builders import make_component, make_version
from trains.models import Cycle, Train, Upgrade
from trains.services.trains import train_create

_counter = itertools.count(1)


def make_user(role: str = Role.OPERATOR) -> User:
    user = User.objects.create_user(username=f"user-{next(_counter)}", password="x-pass-123")
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def nic_firmware() -> dict[str, ComponentVersion]:
    """A third lower-level component that needs a drain: nic-firmware 22.1 and 22.4."""
    from fleet.models import Component

    component = Component.objects.filter(name="nic-firmware").first() or make_component(
        ComponentLayer.LOWER_LEVEL, name="nic-firmware"
    )
    return {
        v: ComponentVersion.objects.filter(component=component, version=v).first() or make_version(component, v)
        for v in ("22.1", "22.4")
    }


def make_train(pool: Pool, **overrides: object) -> Train:
    fields: dict[str, object] = {
        "name": f"train-{next(_counter)}",
        "cycle_slo_s": 7 * 24 * 3600,
        "visit_estimate_s": 60,
    }
    fields.update(overrides)
    return train_create(pool=pool, **fields)  # type: ignore[arg-type]


# make_fleet's driver release, failing on every host (simulator profile `execute_by_kind`).
FAILING_DRIVER = {"upgrade:gpu-driver:560.35.03": {"failure_rate": 1.0}}


def drains_per_host(pool: Pool) -> Counter[int]:
    """A task whose drain key is its own id opened a drain (a repair inherits its drain's key)."""
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def cycle_ended(train: Train, number: int) -> bool:
    return Cycle.objects.filter(train=train, number=number, ended_at__isnull=False).exists()


class BusyBeside(NamedTuple):
    """bounded_bios_beside_a_busy_host's world: the pool, its train, the busy host, the others, bios."""

    pool: Pool
    train: Train
    busy: Host
    free: list[Host]
    bios: Upgrade


def bounded_bios_beside_a_busy_host(pace: str) -> BusyBeside:
    """One domain of 3 hosts (all 3 may be out), a train at `pace` (1 h SLO, 600 s overhead): a long
    driver upgrade first in line on the first host by id, which leaves no room there for bios this
    visit (600 + 2400 + 900 s against 3600 s), where the other two have room (600 + 900 s); and bios
    multi-cycle, one host per visit."""
    from tests.builders import make_fleet
    from trains.services.upgrades import upgrade_create

    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=3)
    busy, *free = sorted(hosts, key=lambda h: h.pk)
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600, pace=pace)
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver",
        scope=f"hosts: {busy.hostname}", priority=300, duration_s=2400,
    )  # fmt: skip
    bios = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=900,
        multi_cycle=True, hosts_per_visit=1,
    )  # fmt: skip
    return BusyBeside(pool, train, busy, free, bios)
