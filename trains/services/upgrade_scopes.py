"""The hosts an upgrade covers now: its scope resolved the one way the train tick and the forecast
read it.

A scope is checked when its upgrade is created (trains/services/upgrades.py); the fleet moves on
after that. A named host retired since is no longer in scope (the hosts that still resolve count),
and a selector that no longer matches any host ('hosts running bios below 2.16.0' once every host
runs it, a domain emptied) leaves nothing to do, so the upgrade completes. Both used to raise at
every train tick, which rolled the tick back and kept the train from ever moving on. A name the
scope uses that is gone (renamed or deleted) still raises: the train tick is rolled back and says
why (`train.tick_rolled_back`) rather than complete work nobody did.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from fleet.models import Host
from fleet.models.hosts import RETIRED
from opsplanner.refusals import refusal_codes
from opsplanner.scopes import MATCHES_NO_HOST, parse_scope, resolve_scope
from trains.models import Upgrade


def scope_host_ids(upgrade: Upgrade) -> list[int]:
    """The live hosts the upgrade's scope names now, in no particular order (one or two queries);
    empty when it names none (see the module's docstring). Any other refusal stands: a name that
    is gone (a pool, domain, component or host renamed or deleted) is not taken as nothing to do,
    nor is a stored scope that does not parse."""
    scope = parse_scope(upgrade.scope)
    if scope.kind == "hosts":
        return _named_hosts(scope.hostnames)
    try:
        return resolve_scope(scope)
    except ValidationError as refusal:
        if refusal_codes(refusal) != {MATCHES_NO_HOST}:
            raise
        return []


def _named_hosts(hostnames: tuple[str, ...]) -> list[int]:
    """The named hosts still in the fleet; a retired one is dropped, a name no host has is refused."""
    live = dict(Host.objects.filter(hostname__in=hostnames).values_list("hostname", "id"))
    gone = set(hostnames) - set(live)
    if gone:
        retired = set(Host.all_objects.filter(hostname__in=gone, state=RETIRED).values_list("hostname", flat=True))
        unknown = sorted(gone - retired)
        if unknown:
            raise ValidationError({"scope": f"Unknown hosts: {', '.join(unknown[:10])}."})
    return list(live.values())


def scope_is_pool(upgrade: Upgrade) -> bool:
    """Whether the upgrade's scope is its whole pool (the scope upgrade_create gives by default)."""
    return upgrade.scope.strip() == f"pool {upgrade.pool.name}"


def upgrade_scope_hosts(upgrade: Upgrade) -> list[int]:
    """The upgrade's live hosts in its pool, by id (the order percentage phases take them in)."""
    ids = scope_host_ids(upgrade)
    if not ids:
        return []
    return sorted(Host.objects.filter(pk__any=ids, pool_id=upgrade.pool_id).values_list("id", flat=True))
