"""Reads of the inventory for the API: counts leave retired hosts out (they are in no pool's total,
no domain's size), the hosts with version drift, and rows named in a request (unknown names are a
ValidationError on the request's field)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from fleet.models import (
    FAILURE_OUT_STATES,
    PLANNED_OUT_STATES,
    Component,
    ComponentVersion,
    Host,
    HostState,
    InstalledVersion,
    MaintenanceDomain,
    Pool,
)
from fleet.models.hosts import RETIRED

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

LIVE = ~Q(hosts__state=RETIRED)


class PoolUsageCounts(TypedDict):
    """The annotations pools_with_usage adds to each pool."""

    n_total: int
    n_in_service: int
    n_planned_out: int
    n_failure_out: int


def pools_with_usage(queryset: QuerySet[Pool]) -> QuerySet[WithAnnotations[Pool, PoolUsageCounts]]:
    """Host counts by state as annotations: the buffer usage of every listed pool in one query."""
    return queryset.annotate(
        n_total=Count("hosts", filter=LIVE),
        n_in_service=Count("hosts", filter=Q(hosts__state=HostState.IN_SERVICE)),
        n_planned_out=Count("hosts", filter=Q(hosts__state__in=PLANNED_OUT_STATES)),
        n_failure_out=Count("hosts", filter=Q(hosts__state__in=FAILURE_OUT_STATES)),
    )


def domains_with_sizes(queryset: QuerySet[MaintenanceDomain]) -> QuerySet[MaintenanceDomain]:
    return queryset.annotate(n_hosts=Count("hosts", filter=LIVE))


def drift_exists() -> Exists:
    """True for a host with at least one installed version that drifted (a partial-index probe)."""
    return Exists(InstalledVersion.objects.filter(host_id=OuterRef("pk"), drift_from__isnull=False))


def users_named(usernames: list[str], *, field: str = "owners") -> list[Any]:
    """The users of these names, in order; a ValidationError on field names the unknown ones."""
    model = get_user_model()
    found = {u.get_username(): u for u in model.objects.filter(**{f"{model.USERNAME_FIELD}__in": usernames})}
    missing = [name for name in usernames if name not in found]
    if missing:
        raise ValidationError({field: f"No user {', '.join(missing)}."})
    return [found[name] for name in usernames]


def hosts_named(hostnames: list[str], *, field: str = "hosts") -> list[Host]:
    """The live hosts of these names; a ValidationError on field names (up to ten of) the unknown ones."""
    hosts = list(Host.objects.filter(hostname__in=hostnames))
    missing = sorted(set(hostnames) - {h.hostname for h in hosts})
    if missing:
        more = " ..." if len(missing) > 10 else ""
        raise ValidationError({field: f"No host {', '.join(missing[:10])}{more}."})
    return hosts


def version_named(component: str, version: str, *, field: str) -> ComponentVersion:
    found = ComponentVersion.objects.select_related("component").filter(component__name=component, version=version)
    if not found:
        raise ValidationError({field: f"There is no {component} {version}."})
    return found[0]


def component_named(name: str, *, field: str) -> Component:
    found = Component.objects.filter(name=name).first()
    if found is None:
        raise ValidationError({field: f"There is no component {name}."})
    return found
