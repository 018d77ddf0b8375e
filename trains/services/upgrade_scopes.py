"""The hosts an upgrade covers now: its scope resolved the one way the train tick and the forecast
read it.

A scope is checked when its upgrade is created (trains/services/upgrades.py); the fleet moves on
after that. A named host retired since is no longer in scope (the hosts that still resolve count),
and a selector that no longer matches any host ('hosts running bios below 2.16.0' once every host
runs it, a domain emptied) leaves nothing to do, so the upgrade completes. Both used to raise at
every train tick, which rolled the tick back and kept the train from ever moving on.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError

from fleet.models import Host
from opsplanner.scopes import parse_scope, resolve_scope
from trains.models import Upgrade

# The field opsplanner.scopes refuses a scope on: a refusal of the stored scope, which parsed when
# the upgrade was created, means it names no live host any more (matches nothing, or its pool,
# domain or component is gone). Its refusals carry no code of their own; the field is what we read.
_SCOPE_FIELD = "scope"


def scope_host_ids(upgrade: Upgrade) -> list[int]:
    """The live hosts the upgrade's scope names now, in no particular order (one or two queries);
    empty when it names none (see the module's docstring). A stored scope that does not parse at all
    (a row written before the scope rules) is refused as parse_scope refuses it."""
    scope = parse_scope(upgrade.scope)
    if scope.kind == "hosts":  # Host.objects leaves out the retired ones: those that still resolve
        return list(Host.objects.filter(hostname__in=scope.hostnames).values_list("id", flat=True))
    try:
        return resolve_scope(scope)
    except ValidationError as refusal:
        if set(refusal.message_dict) != {_SCOPE_FIELD}:
            raise
        return []


def upgrade_scope_hosts(upgrade: Upgrade) -> list[int]:
    """The upgrade's live hosts in its pool, by id (the order percentage phases take them in)."""
    ids = scope_host_ids(upgrade)
    if not ids:
        return []
    return sorted(Host.objects.filter(pk__any=ids, pool_id=upgrade.pool_id).values_list("id", flat=True))
