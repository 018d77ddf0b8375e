"""Audited writes of inventory rows that have no dedicated service: the Django admin's add, change
and delete go through here, so they validate like any service, run in one transaction and leave an
event naming every changed field with its value before and after."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models.deletion import ProtectedError, RestrictedError

from opsplanner.events import Actor, event_record
from opsplanner.models import Event

# Event kinds per model; creations keep the kinds the dedicated services already write.
SUBJECT_NAMES = {
    "fleet.pool": "pool",
    "fleet.maintenancedomain": "domain",
    "fleet.host": "host",
    "fleet.component": "component",
    "fleet.componentversion": "component_version",
    "fleet.installedversion": "installed_version",
    "fleet.compatibilityrule": "compatibility_rule",
    "fleet.service": "service",
    "fleet.serviceplacement": "service_placement",
    "opsplanner.simulatorprofile": "simulator_profile",
}
CREATED_KINDS = {"fleet.componentversion": "component.version_added"}
ADMIN_REASON = "changed in the admin"


def audit_kind(model: type[models.Model], action: str) -> str:
    label = model._meta.label_lower
    if label not in SUBJECT_NAMES:
        raise ValueError(f"{label} has no audited writes; give it a service or make its admin read-only.")
    if action == "created" and label in CREATED_KINDS:
        return CREATED_KINDS[label]
    return f"{SUBJECT_NAMES[label]}.{action}"


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return str(value)  # Decimal, UUID ...


def _values(obj: models.Model, m2m_names: Iterable[str] = ()) -> dict[str, Any]:
    """Concrete fields by name (foreign keys as ids), and the given many-to-many fields as sorted ids."""
    values = {field.name: _jsonable(getattr(obj, field.attname)) for field in obj._meta.concrete_fields}
    for name in m2m_names:
        values[name] = sorted(getattr(obj, name).values_list("pk", flat=True)) if obj.pk else []
    return values


def _scope(obj: models.Model) -> dict[str, int | None]:
    """pool_id and host_id of the event, so the pool's and the host's history show it."""
    label = obj._meta.label_lower
    record: Any = obj  # any model: its pool and host foreign keys, if any, are found by name
    if label == "fleet.pool":
        return {"pool_id": record.pk, "host_id": None}
    if label == "fleet.host":
        return {"pool_id": record.pool_id, "host_id": record.pk}
    host_id = getattr(record, "host_id", None)
    if host_id is not None:
        return {"pool_id": record.host.pool_id, "host_id": host_id}
    return {"pool_id": getattr(record, "pool_id", None), "host_id": None}


@transaction.atomic
def inventory_record_save(
    *,
    obj: models.Model,
    actor: Actor,
    fields: Iterable[str] | None = None,
    m2m: Mapping[str, Iterable[models.Model]] | None = None,
    reason: str = ADMIN_REASON,
) -> Event | None:
    """Validate and save obj (new or changed) and its many-to-many values, with an event whose data
    lists the changed fields and their values before and after. None when nothing changed.

    fields: what this write may change (a form's fields); on a change, every other field keeps its
    value in the locked row, so a host state moved by the tick since the form was read is not undone.
    Values derived in clean() (sort keys) are derived again."""
    m2m = dict(m2m or {})
    model = type(obj)
    kind_name = audit_kind(model, "updated")
    stored = None if obj._state.adding else model._default_manager.select_for_update().filter(pk=obj.pk).first()
    before = _values(stored, m2m) if stored is not None else {}
    if stored is not None and fields is not None:
        writable = set(fields)
        for field in model._meta.concrete_fields:
            if field.name not in writable and not field.primary_key:
                setattr(obj, field.attname, getattr(stored, field.attname))
    obj.full_clean()
    obj.save()
    for name, values in m2m.items():
        getattr(obj, name).set(list(values))
    after = _values(model._default_manager.get(pk=obj.pk), m2m)  # as stored: Decimal places, defaults
    changed = sorted(name for name in after if stored is None or before.get(name) != after[name])
    if stored is not None and not changed:
        return None
    return event_record(
        kind=audit_kind(model, "created") if stored is None else kind_name,
        subject=obj,
        actor=actor,
        reason=reason,
        data={
            "changed_fields": changed,
            "before": {name: before.get(name) for name in changed} if stored is not None else {},
            "after": {name: after[name] for name in changed},
        },
        **_scope(obj),
    )


@transaction.atomic
def inventory_record_delete(*, obj: models.Model, actor: Actor, reason: str = ADMIN_REASON) -> Event:
    """Delete obj with an event keeping its last values and what went with it (cascaded rows).

    A row that others still refer to (PROTECT) is refused with a ValidationError coded "protected"
    that names them: hosts with tasks, leases or work items are history and stay."""
    kind = audit_kind(type(obj), "deleted")
    pk, scope, before = obj.pk, _scope(obj), _values(obj)
    try:
        with transaction.atomic():
            _, deleted = obj.delete()
    except (ProtectedError, RestrictedError) as error:
        blockers = error.protected_objects if isinstance(error, ProtectedError) else error.restricted_objects
        names = sorted({str(blocker._meta.verbose_name_plural) for blocker in blockers})
        raise ValidationError(
            f"{str(obj._meta.verbose_name).capitalize()} {obj} cannot be deleted: {len(blockers)} "
            f"{', '.join(names)} still refer to it, and they are history that stays.",
            code="protected",
        ) from None
    obj.pk = pk
    label = obj._meta.label
    cascaded = {name: count for name, count in deleted.items() if name != label and count}
    return event_record(
        kind=kind, subject=obj, actor=actor, reason=reason, data={"before": before, "cascaded": cascaded}, **scope
    )
