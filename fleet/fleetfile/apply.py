"""Applying a fleet file: plan, refuse or write, in ONE transaction, with an event per change.

Set-based at every size: one read per kind (fleet.fleetfile.live), creations with COPY
(opsplanner.bulk.insert_missing), changes as guarded UPDATE … FROM a copied table
(fleet.fleetfile.rows), events with COPY. A re-apply of the same file writes nothing."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.fleetfile.live import LiveInventory, live_inventory_read
from fleet.fleetfile.plan import FleetPlan, fleet_plan
from fleet.fleetfile.safety import plan_refusals
from fleet.fleetfile.schema import FleetFileInvalid, FleetSpec, Problem
from fleet.fleetfile.withdrawals import withdrawals_foresee
from fleet.fleetfile.writers import FleetWriter
from fleet.models import Pool
from fleet.models.hosts import RETIRED
from opsplanner.events import Actor


class FleetApplyRefused(ValidationError):
    """The plan touches live work (or lowers a buffer below what is out): `plan.refusals` says why."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        super().__init__(plan.refusals, code="conflict")


def pools_lock() -> None:
    """Lock every pool row (FOR NO KEY UPDATE, in id order, so two appliers never deadlock) until the
    caller's transaction ends: the tick skips a locked pool and a pool change waits. A hosts-only
    source takes it before it reads the pools it declares as they are live, or a pool changed between
    that read and the apply would be written back to what it was."""
    list(Pool.objects.select_for_update(no_key=True).order_by("pk").values_list("pk", flat=True))


@transaction.atomic
def fleet_apply(
    *,
    spec: FleetSpec,
    prune: bool = False,
    dry_run: bool = False,
    actor: Actor = None,
    reason: str = "",
    new_hosts_only: bool = False,
) -> FleetPlan:
    """Plan the file against the live inventory and, unless dry_run, write the plan.

    Every pool row is locked first (FOR NO KEY UPDATE, in id order): the tick skips a locked pool,
    so no lease is granted between the checks and the writes. Raises FleetFileInvalid (owners that
    are not users; with new_hosts_only, hosts that exist already, retired ones too) or
    FleetApplyRefused; either way nothing is written."""
    pools_lock()
    live = live_inventory_read(
        usernames={owner for service in spec.services for owner in service.owners},
        service_names={service.name for service in spec.services},
    )
    if new_hosts_only:
        _only_new_hosts(spec, live)
    plan = fleet_plan(spec, live, prune=prune)
    plan.dry_run = dry_run
    withdrawals_foresee(plan)
    plan.refusals = plan_refusals(plan, live)
    if plan.refusals:
        raise FleetApplyRefused(plan)
    if dry_run or not plan.changes:
        return plan
    FleetWriter(plan, live, actor=actor, reason=reason).write()
    plan.applied = True
    return plan


def _only_new_hosts(spec: FleetSpec, live: LiveInventory) -> None:
    """Creating hosts (bulk API, CSV import): a host that exists is an error at its place, not a change."""
    problems = [
        existing_host_problem(host.index, host.hostname, retired=live.hosts[host.hostname].state == RETIRED)
        for host in spec.hosts
        if host.hostname in live.hosts
    ]
    if problems:
        raise FleetFileInvalid(problems)


def retired_host_said(hostname: str) -> str:
    """What a file or a sync that names a retired host is told: it is restored by hand."""
    return f"host {hostname} is retired: restore it (POST /api/hosts/{hostname}/restore/)"


def existing_host_problem(index: int, hostname: str, *, retired: bool) -> Problem:
    if retired:
        return Problem(f"hosts[{index}].hostname", retired_host_said(hostname))
    return Problem(f"hosts[{index}].hostname", f"host {hostname} exists already")


def plan_text(plan: FleetPlan) -> str:
    """The plan as the command prints it: one line per change, then the counts."""
    lines = plan.lines()
    lines.append(("Plan (dry run): " if plan.dry_run else "Plan: ") + plan.summary())
    lines.extend(f"refused: {refusal}" for refusal in plan.refusals)
    return "\n".join(lines)


def plan_json(plan: FleetPlan) -> dict[str, Any]:
    return json.loads(json.dumps(plan.as_json(), default=str))
