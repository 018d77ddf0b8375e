"""Scope selectors: which hosts an operation covers, written the way operators say it.

    hosts: trn-r0001-h01, trn-r0001-h02     the named hosts
    pool ai-train-east                        every host of the pool
    10% of pool ai-train-east                 a deterministic tenth of the pool (domain order)
    domain ai-train-east/rack-0003            every host of one maintenance domain
    hosts running gpu-driver below 560.35.03 [in pool ai-train-east]

parse_scope turns text into a Scope (or a ValidationError that says what is wrong and how to write
it); resolve_scope turns a Scope into host ids, refusing unknown names and empty results.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.db.models import Q

from fleet.models import Component, ComponentVersion, Host, InstalledVersion, MaintenanceDomain, Pool
from fleet.versions import version_sort_key

MAX_SCOPE_LENGTH = 500
MAX_NAMED_HOSTS = 10_000
SYNTAX_HELP = (
    "write one of: 'hosts: a, b', 'pool P', 'N% of pool P', 'domain P/D', "
    "'hosts running C below V', 'hosts running C below V in pool P'"
)
_NAME = r"[a-z0-9][a-z0-9.-]*"
_PATTERNS = {
    "hosts": re.compile(r"^hosts?\s*:\s*(?P<names>.+)$"),
    "pool": re.compile(rf"^pool\s+(?P<pool>{_NAME})$"),
    "percent": re.compile(rf"^(?P<percent>[0-9]+(?:\.[0-9]+)?)\s*%\s+of\s+pool\s+(?P<pool>{_NAME})$"),
    "domain": re.compile(rf"^domain\s+(?P<pool>{_NAME})\s*/\s*(?P<domain>{_NAME})$"),
    "running": re.compile(
        rf"^hosts\s+running\s+(?P<component>{_NAME})\s+below\s+(?P<version>\S+)(?:\s+in\s+pool\s+(?P<pool>{_NAME}))?$"
    ),
}


@dataclass(frozen=True)
class Scope:
    kind: str
    hostnames: tuple[str, ...] = ()
    pool: str = ""
    percent: Decimal = Decimal(100)
    domain: str = ""
    component: str = ""
    version: str = ""


# The code of the one refusal a scope stored with its upgrade may meet as the fleet moves on without
# anything being wrong: it names no host any more (trains/services/upgrade_scopes.py).
MATCHES_NO_HOST = "matches_no_host"


def _error(message: str) -> ValidationError:
    return ValidationError({"scope": message}, code="scope")


def parse_scope(text: str) -> Scope:
    if not isinstance(text, str) or not text.strip():
        raise _error(f"The scope is empty; {SYNTAX_HELP}.")
    if len(text) > MAX_SCOPE_LENGTH:
        raise _error(f"The scope is longer than {MAX_SCOPE_LENGTH} characters; name a pool or domain instead.")
    normalized = " ".join(text.strip().lower().split())
    for kind, pattern in _PATTERNS.items():
        match = pattern.match(normalized)
        if match is None:
            continue
        groups = match.groupdict()
        if kind == "hosts":
            names = tuple(dict.fromkeys(name.strip() for name in groups["names"].split(",")))
            if any(not re.fullmatch(_NAME, name) for name in names):
                raise _error("Host names are lowercase letters, digits, dots and dashes, separated by commas.")
            if len(names) > MAX_NAMED_HOSTS:
                raise _error(f"Name at most {MAX_NAMED_HOSTS:,} hosts; use a pool or domain selector for more.")
            return Scope(kind="hosts", hostnames=names)
        if kind == "percent":
            try:
                percent = Decimal(groups["percent"])
            except InvalidOperation:  # pragma: no cover - the pattern only admits numbers
                raise _error("The percentage is not a number.") from None
            if not Decimal(0) < percent <= Decimal(100):
                raise _error(f"The percentage must be above 0 and at most 100, not {percent}.")
            return Scope(kind="percent", pool=groups["pool"], percent=percent)
        if kind == "running":
            try:
                version_sort_key(groups["version"])
            except ValidationError:
                raise _error(f"{groups['version']!r} is not a version (e.g. 560.35.03).") from None
            return Scope(
                kind="running", component=groups["component"], version=groups["version"], pool=groups["pool"] or ""
            )
        return Scope(kind=kind, pool=groups.get("pool") or "", domain=groups.get("domain") or "")
    raise _error(f"Cannot read the scope {text.strip()[:80]!r}; {SYNTAX_HELP}.")


def _pool(name: str) -> Pool:
    try:
        return Pool.objects.get(name=name)
    except Pool.DoesNotExist:
        raise _error(f"There is no pool named {name!r}.") from None


def resolve_scope(scope: Scope) -> list[int]:
    """Host ids of the scope, in a stable order. Refuses unknown names and a scope matching nothing."""
    hosts = Host.objects.all()
    if scope.kind == "hosts":
        found = dict(Host.objects.filter(hostname__in=scope.hostnames).values_list("hostname", "id"))
        missing = [name for name in scope.hostnames if name not in found]
        if missing:
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise _error(f"Unknown hosts: {shown}.")
        return [found[name] for name in scope.hostnames]
    if scope.kind == "pool":
        ids = list(hosts.filter(pool=_pool(scope.pool)).order_by("id").values_list("id", flat=True))
    elif scope.kind == "percent":
        pool = _pool(scope.pool)
        ordered = list(
            hosts.filter(pool=pool)
            .order_by("domain__position", "domain__name", "hostname")
            .values_list("id", flat=True)
        )
        ids = ordered[: math.ceil(len(ordered) * scope.percent / 100)]
    elif scope.kind == "domain":
        pool = _pool(scope.pool)
        if not MaintenanceDomain.objects.filter(pool=pool, name=scope.domain).exists():
            raise _error(f"Pool {pool.name} has no domain named {scope.domain!r}.")
        ids = list(
            hosts.filter(domain__pool=pool, domain__name=scope.domain).order_by("id").values_list("id", flat=True)
        )
    elif scope.kind == "running":
        try:
            component = Component.objects.get(name=scope.component)
        except Component.DoesNotExist:
            raise _error(f"There is no component named {scope.component!r}.") from None
        installed = InstalledVersion.objects.filter(
            component=component, version__sort_key__lt=version_sort_key(scope.version)
        )
        if scope.pool:
            installed = installed.filter(host__pool=_pool(scope.pool))
        ids = list(installed.order_by("host_id").values_list("host_id", flat=True))
    else:  # pragma: no cover - parse_scope makes only the kinds above
        raise _error(f"Unknown scope kind {scope.kind!r}.")
    if not ids:
        raise ValidationError({"scope": ValidationError("The scope matches no host.", code=MATCHES_NO_HOST)})
    return ids


def version_of(component_name: str, version: str) -> ComponentVersion:
    return versions_of([(component_name, version)])[(component_name, version)]


def versions_of(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], ComponentVersion]:
    """The catalogue's versions named by (component, version), with their components, in one query;
    refused, naming the first missing one, when one is not in the catalogue."""
    wanted = list(dict.fromkeys(pairs))
    if not wanted:
        return {}
    match = Q()
    for component_name, version in wanted:
        match |= Q(component__name=component_name, version=version)
    rows = ComponentVersion.objects.select_related("component").filter(match)
    found = {(row.component.name, row.version): row for row in rows}
    for component_name, version in wanted:
        if (component_name, version) not in found:
            raise ValidationError(
                {"component_version": f"{component_name} has no version {version!r} in the catalogue."}
            )
    return found
