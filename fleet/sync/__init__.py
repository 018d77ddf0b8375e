"""Sync the inventory from systems that already know the hosts (Slurm today; NetBox or Kubernetes
nodes would be one more module): a source reads its nodes and turns them into the fleet file's host
rows (hostname, pool, domain, sku, gpu_count, labels); `sync_hosts` proposes them as a fleet-file
diff against the live inventory and applies it through the fleet file's own plan and apply.

A sync adds and updates, never removes: a host the source no longer lists is left alone (retire it
with `fleet_apply --prune` from a file). Nor does it bring back a host retired here that the source
still lists (a node left in slurm.conf, down): its row is left out and named, to be restored by hand.
The pools must exist (a source knows partitions, not buffers); a domain the source names that the
pool lacks is created with the hosts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from fleet.fleetfile.apply import fleet_apply, pools_lock
from fleet.fleetfile.export import pools_section
from fleet.fleetfile.plan import FleetPlan
from fleet.fleetfile.schema import FleetFileInvalid, Problem, fleet_spec_from_document
from fleet.models import DomainKind, Host
from fleet.models.hosts import RETIRED
from opsplanner.events import Actor


class SourceError(Exception):
    """The source could not be read (a tool missing or failing); one line that says which and why."""


def sync_document(rows: Sequence[dict[str, Any]], *, domain_kind: str = DomainKind.RACK) -> dict[str, Any]:
    """A fleet file of these host rows and the live pools they name, with the domains the rows name
    that a pool lacks appended after its own (so applying it changes no existing pool or domain).
    FleetFileInvalid names every row whose pool does not exist."""
    names = {str(row["pool"]) for row in rows}
    pools = pools_section(names)
    known = {pool["name"] for pool in pools}
    problems = [
        Problem(f"hosts[{i}].pool", f"no pool {row['pool']!r}: create it first, or map the source's group to a pool")
        for i, row in enumerate(rows)
        if row["pool"] not in known
    ]
    if problems:
        raise FleetFileInvalid(problems)
    for pool in pools:
        domains = pool.setdefault("domains", [])
        have = {domain["name"] for domain in domains}
        position = max((domain["position"] for domain in domains), default=0)
        for name in sorted({row["domain"] for row in rows if row["pool"] == pool["name"]} - have):
            position += 1
            domains.append({"name": name, "kind": domain_kind, "position": position})
    return {"pools": pools, "hosts": list(rows)}


@dataclass
class Synced:
    """What a sync planned (and applied, unless a dry run), and the hosts it left retired."""

    plan: FleetPlan
    kept_retired: list[str] = field(default_factory=list)  # hostnames the source lists, retired here


@transaction.atomic
def sync_hosts(
    *, rows: Sequence[dict[str, Any]], dry_run: bool = False, actor: Actor = None, reason: str = ""
) -> Synced:
    """Plan the rows against the live inventory and, unless dry_run, apply them in one transaction;
    rows naming a retired host are left out (the source's listing does not restore it).
    Raises FleetFileInvalid (every problem with its row) or FleetApplyRefused (live work in the way)."""
    if not rows:
        raise FleetFileInvalid([Problem("hosts", "the source lists no hosts")])
    pools_lock()  # before sync_document reads the pools it declares as they are live, and before a restore
    names = [str(row["hostname"]) for row in rows]
    retired = set(Host.all_objects.filter(hostname__in=names, state=RETIRED).values_list("hostname", flat=True))
    kept = [row for row in rows if row["hostname"] not in retired]
    if not kept:
        return Synced(plan=FleetPlan(dry_run=dry_run), kept_retired=sorted(retired))
    spec = fleet_spec_from_document(sync_document(kept))
    return Synced(
        plan=fleet_apply(spec=spec, dry_run=dry_run, actor=actor, reason=reason), kept_retired=sorted(retired)
    )
