"""Builders for trains tests: users with roles, a third drained component, trains over a fleet."""

from __future__ import annotations

import itertools
from collections import Counter

from django.contrib.auth.models import Group, User
from django.db.models import F

from fleet.models import ComponentLayer, ComponentVersion, Pool
from opsplanner.models import HostTask
from opsplanner.roles import Role
from tests.builders import make_component, make_version
from trains.models import Cycle, Train
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
