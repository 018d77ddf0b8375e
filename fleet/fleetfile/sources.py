"""Hosts-only sources: rows of hosts from somewhere other than a whole fleet file (the bulk API, a
CSV import; a NetBox or Kubernetes-nodes source would be one more caller) turned into a fleet file
with the live pools they name, so they are checked by the fleet file's own schema and applied by
the same plan and apply. Problems keep the rows' places (`hosts[12].domain: ...`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from fleet.fleetfile.apply import existing_host_problem, fleet_apply, pools_lock
from fleet.fleetfile.export import pools_section
from fleet.fleetfile.plan import FleetPlan
from fleet.fleetfile.schema import HOSTNAME_RE, NAME_RE, FleetFileInvalid, FleetSpec, Problem, fleet_spec_from_document
from fleet.models import Host
from fleet.models.hosts import RETIRED
from opsplanner.events import Actor

MAX_HOSTS_PER_REQUEST = 10_000
ROW = re.compile(r"^hosts\[(\d+)\]")


def hosts_spec(rows: Sequence[Any]) -> FleetSpec:
    """A fleet spec of these host rows (the fleet file's `hosts[]` fields) and the live pools they
    name (read them under `pools_lock`, in the transaction that applies the spec). Raises
    FleetFileInvalid with every problem at its row (`hosts[i].field`)."""
    names = {row["pool"] for row in rows if isinstance(row, dict) and NAME_RE.match(str(row.get("pool")))}
    document = {"pools": pools_section(names), "hosts": list(rows)}
    try:
        return fleet_spec_from_document(document)
    except FleetFileInvalid as invalid:
        # The pools are the live ones: only rows can be wrong, and "in the file" means "in the inventory".
        raise FleetFileInvalid(
            [Problem(p.place, p.message.replace(" in the file", "")) for p in invalid.problems]
        ) from None


@transaction.atomic
def hosts_create(*, rows: Sequence[Any], dry_run: bool = False, actor: Actor = None, reason: str = "") -> FleetPlan:
    """Create every host of rows in one transaction, or none: a row with a problem, or naming a host
    that exists (retired ones too), raises FleetFileInvalid naming each by its index."""
    if len(rows) > MAX_HOSTS_PER_REQUEST:
        raise FleetFileInvalid([Problem("hosts", f"at most {MAX_HOSTS_PER_REQUEST} hosts at once, not {len(rows)}")])
    if not rows:
        raise FleetFileInvalid([Problem("hosts", "name at least one host")])
    pools_lock()  # before hosts_spec reads the pools it declares as they are live
    existing = _existing(rows)
    try:
        spec = hosts_spec(rows)
    except FleetFileInvalid as invalid:
        raise FleetFileInvalid(sorted([*invalid.problems, *existing], key=_row_order)) from None
    if existing:
        raise FleetFileInvalid(existing)
    return fleet_apply(spec=spec, dry_run=dry_run, actor=actor, reason=reason, new_hosts_only=True)


def _existing(rows: Sequence[Any]) -> list[Problem]:
    """Rows naming a host that exists (retired ones too), found with the schema's problems (one query);
    fleet_apply checks again under its locks."""
    index = {
        row["hostname"]: i
        for i, row in enumerate(rows)
        if isinstance(row, dict) and isinstance(row.get("hostname"), str) and HOSTNAME_RE.match(row["hostname"])
    }
    found = Host.all_objects.filter(hostname__in=list(index)).values_list("hostname", "state")
    return sorted(
        (existing_host_problem(index[name], name, retired=state == RETIRED) for name, state in found), key=_row_order
    )


def _row_order(problem: Problem) -> tuple[int, str]:
    match = ROW.match(problem.place)
    return (int(match.group(1)) if match else -1, problem.place)
