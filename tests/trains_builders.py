"""Builders for trains tests: users with roles, a third drained component, trains over a fleet."""

from __future__ import annotations

import itertools

from django.contrib.auth.models import Group, User

from fleet.models import ComponentLayer, ComponentVersion, Pool
from opsplanner.roles import Role
from tests.builders import make_component, make_version
from trains.models import Train
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
