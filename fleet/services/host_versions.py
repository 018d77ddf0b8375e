"""What a host actually runs, as its inventory agent or executor reports it, and drift.

A reported version that differs from what OpsPlanner believes is recorded as the installed version
(trains see it), with the belief kept in `InstalledVersion.drift_from` and an event
`host.version_drift` (believed, reported). The drift clears when a report of that component matches
what OpsPlanner believes again (`host.version_drift_cleared`). Hosts with drift are the hosts list's
`?drift=true` and the metric `opsplanner_hosts_with_version_drift`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.fleetfile.schema import NAME_RE
from fleet.models import ComponentVersion, Host, InstalledVersion
from fleet.services.common import validated_save
from opsplanner import clock
from opsplanner.events import Actor, event_record

RECORDED, MATCHES, DRIFT, DRIFT_CLEARED = "recorded", "matches", "drift", "drift_cleared"


def _catalogue(versions: Mapping[str, str]) -> dict[str, ComponentVersion]:
    """The reported versions from the catalogue by component name; every unknown one is an error."""
    names = [name for name in versions if NAME_RE.match(name)]
    known = {
        (cv.component.name, cv.version): cv
        for cv in ComponentVersion.objects.select_related("component").filter(
            component__name__in=names, version__in=[versions[n] for n in names if versions[n].isprintable()]
        )
    }
    components = set(
        ComponentVersion.objects.filter(component__name__in=names).values_list("component__name", flat=True)
    )
    errors: dict[str, str] = {}
    for component, version in versions.items():
        if component not in components:
            errors[f"versions.{component}"] = f"There is no component {component} with versions."
        elif (component, version) not in known:
            errors[f"versions.{component}"] = (
                f"{component} {version} is not in the catalogue; add the version first "
                "(POST /api/components/<id>/versions/)."
            )
    if errors:
        raise ValidationError(errors)
    return {component: known[(component, version)] for component, version in versions.items()}


def _event(host: Host, kind: str, actor: Actor, reason: str, data: dict[str, Any]) -> None:
    event_record(kind=kind, subject=host, actor=actor, reason=reason, pool_id=host.pool_id, host_id=host.pk, data=data)


@transaction.atomic
def host_versions_report(
    *, host: Host, versions: Mapping[str, str], actor: Actor = None, reason: str = ""
) -> list[dict[str, Any]]:
    """Record what host runs ({component: version}); answer per component what was believed, what
    was reported and the outcome: recorded (nothing was believed), matches, drift, drift_cleared."""
    if not versions:
        raise ValidationError({"versions": "Report at least one component's version."})
    reported = _catalogue(versions)
    reason = reason or "reported by the host"
    now = clock.now()
    installed = {
        row.component_id: row
        for row in InstalledVersion.objects.select_for_update()
        .select_related("version")
        .filter(host=host, component_id__in=[cv.component_id for cv in reported.values()])
    }
    outcomes = []
    for component, version in sorted(reported.items()):
        row = installed.get(version.component_id)
        believed = row.version.version if row is not None else None
        if row is None:
            validated_save(InstalledVersion(host=host, component_id=version.component_id, version=version))
            outcome = RECORDED
            _event(
                host,
                "host.version_installed",
                actor,
                reason,
                {"component": component, "from": None, "to": version.version},
            )
        elif row.version_id == version.pk:
            outcome = MATCHES
            if row.drift_from_id is not None:
                outcome = DRIFT_CLEARED
                row.drift_from, row.drift_at = None, None
                row.save(update_fields=["drift_from", "drift_at"])
                _event(host, "host.version_drift_cleared", actor, reason, {"component": component, "version": believed})
        else:
            outcome = DRIFT
            row.previous_version_id, row.drift_from_id = row.version_id, row.version_id
            row.version, row.installed_at, row.drift_at = version, now, now
            validated_save(row)
            data = {"component": component, "believed": believed, "reported": version.version}
            _event(host, "host.version_drift", actor, reason, data)
        outcomes.append({"component": component, "believed": believed, "reported": version.version, "outcome": outcome})
    return outcomes
