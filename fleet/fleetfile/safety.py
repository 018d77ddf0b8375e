"""Refusals: changes a fleet file may not make to live work, each with its reason and numbers.

- A host holding an active lease, out of service, or named by an open operation is never retired
  or moved to another pool or domain (the operation is named).
- A buffer is not lowered below what is out for it now, nor a hard floor raised above what is in
  service now; that holds too for a buffer given as a fraction that shrinks because the pool loses
  hosts (retired or moved out).
- A file releases only a version it withdrew; one withdrawn by an upgrade's offboarding is released
  by re-onboarding that upgrade (an approval), one an operator withdrew through the API by the API.
- A component's layer does not change while compatibility rules name it.
One refusal refuses the whole apply: nothing is written.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count

from fleet.fleetfile.live import LiveInventory
from fleet.fleetfile.plan import Change, FleetPlan
from fleet.models import FAILURE_OUT_STATES, PLANNED_OUT_STATES, RELEASED_WHERE, Host, HostState, Pool, WithdrawnBy
from fleet.models.hosts import RETIRED
from opsplanner.models import OPEN_TASK_STATES, HostTask, Lease, Operation


def plan_refusals(plan: FleetPlan, live: LiveInventory) -> list[str]:
    refusals = _busy_hosts(plan)
    refusals += _buffers(plan, live)
    for change in plan.of("version", "update"):
        if change.fields.get("withdrawn") == (True, False) and change.live.withdrawn_by != WithdrawnBy.FLEET_FILE:
            refusals.append(
                f"version {change.name}: withdrawn ({change.live.withdrawn_reason}); a file releases only what it "
                f"withdrew: {RELEASED_WHERE[change.live.withdrawn_by]}, "
                "or keep it withdrawn in the file"
            )
    named: defaultdict[str, int] = defaultdict(int)  # component name -> rules naming it
    for rule in live.rules.values():
        named[rule.job_facing] += 1
        named[rule.lower] += 1
    removed: defaultdict[str, int] = defaultdict(int)
    for change in plan.of("rule", "remove"):
        removed[change.live.job_facing] += 1
        removed[change.live.lower] += 1
    for change in plan.of("component", "update"):
        left = named[change.name] - removed[change.name]
        if "layer" in change.fields and left:
            refusals.append(
                f"component {change.name}: the layer does not change while {left} compatibility rules name it"
            )
    return refusals


def _moves(plan: FleetPlan) -> list[tuple[Change, str]]:
    """(change, what it would do) for every host retired or moved to another pool or domain."""
    moves = []
    for change in plan.of("host"):
        if change.live is None or change.live.state == RETIRED:
            continue
        if change.action == "remove":
            moves.append((change, "not retired"))
        elif "pool" in change.fields or "domain" in change.fields:
            where = change.spec.domain if "domain" in change.fields else change.spec.pool
            target = f"pool {change.spec.pool}" if "pool" in change.fields else f"domain {where}"
            moves.append((change, f"not moved to {target}"))
    return moves


def _busy_hosts(plan: FleetPlan) -> list[str]:
    return busy_host_refusals(
        [(change.live.id, change.live.hostname, change.live.state, verb) for change, verb in _moves(plan)]
    )


def busy_host_refusals(moves: list[tuple[int, str, str, str]]) -> list[str]:
    """One refusal per (host id, hostname, state, what would be done) whose host holds a lease, is
    out of service or is named by an open operation: the one rule for the fleet file and the API."""
    if not moves:
        return []
    ids = [host_id for host_id, _, _, _ in moves]
    leases = dict(Lease.objects.filter(active=True, host_id__any=ids).values_list("host_id", "operation_id"))
    tasks: dict[int, int] = {}
    for host_id, operation_id in (
        HostTask.objects.filter(host_id__any=ids, state__in=OPEN_TASK_STATES)
        .order_by("operation_id")
        .values_list("host_id", "operation_id")
    ):
        tasks.setdefault(host_id, operation_id)
    operations = {
        pk: f"operation #{pk} ({kind}: {reason})"
        for pk, kind, reason in Operation.objects.filter(pk__in={*leases.values(), *tasks.values()}).values_list(
            "id", "kind", "reason"
        )
    }
    refusals = []
    for host_id, hostname, state, verb in moves:
        if host_id in leases:
            why = f"it is held by {operations[leases[host_id]]}"
        elif state != HostState.IN_SERVICE:
            why = f"it is {state}, out of service"
        elif host_id in tasks:
            why = f"it is named by open {operations[tasks[host_id]]}"
        else:
            continue
        refusals.append(f"host {hostname}: {verb}: {why}")
    return refusals


def _buffer_pool(pool: Any) -> Pool:
    """An unsaved Pool with the buffer fields of a PoolSpec or a LivePool (for `buffers_for`)."""
    return Pool(
        name=pool.name,
        planned_buffer_hosts=pool.planned_buffer_hosts,
        planned_buffer_fraction=pool.planned_buffer_fraction,
        failure_buffer_hosts=pool.failure_buffer_hosts,
        failure_buffer_fraction=pool.failure_buffer_fraction,
        hard_floor_hosts=pool.hard_floor_hosts,
    )


def _buffers(plan: FleetPlan, live: LiveInventory) -> list[str]:
    """Pools whose buffers or hard floor change, or that lose hosts: the new sizes against what is out now."""
    refusals = []
    totals = _new_totals(plan, live)
    updated = {change.live.id: change for change in plan.of("pool", "update")}
    for change in updated.values():
        current = change.live
        counts = live.counts.get(current.id, {})
        wanted, total = _buffer_pool(change.spec), totals.get(current.id, 0)
        changed = set(change.fields) | shrunk_buffers(_buffer_pool(current), wanted, sum(counts.values()), total)
        refusals += buffer_refusals(wanted, counts, total, changed)
    for current in sorted(live.pools.values(), key=lambda p: p.name):
        counts = live.counts.get(current.id, {})
        before, after = sum(counts.values()), totals.get(current.id, 0)
        if current.id in updated or after >= before:
            continue
        pool = _buffer_pool(current)
        refusals += [
            f"{refusal} (with {before - after} of its hosts retired or moved out)"
            for refusal in buffer_refusals(pool, counts, after, shrunk_buffers(pool, pool, before, after))
        ]
    return refusals


def shrunk_buffers(before: Pool, after: Pool, total_before: int, total_after: int) -> set[str]:
    """The buffer rules (`planned_buffer`, `failure_buffer`) whose size in hosts goes down, the pool's
    total changing with them: a fraction of fewer hosts is fewer hosts."""
    old, new = before.buffers_for(total_before), after.buffers_for(total_after)
    sizes = {"planned_buffer": (old.planned, new.planned), "failure_buffer": (old.failure, new.failure)}
    return {rule for rule, (was, will) in sizes.items() if will < was}


def pool_host_counts(pool_id: int) -> dict[str, int]:
    """The pool's hosts by state (retired ones count nowhere)."""
    return dict(Host.objects.filter(pool_id=pool_id).values("state").annotate(n=Count("id")).values_list("state", "n"))


def host_leaving_refusals(*, pool: Pool, hostname: str, verb: str) -> list[str]:
    """Why one host may not leave its pool (retired or moved out), the pool's total shrinking a
    buffer given as a fraction below what is out for it now; [] when it may. The caller holds the
    pool's row lock, so the counts stay true until it commits."""
    counts = pool_host_counts(pool.pk)
    total = sum(counts.values())
    shrunk = shrunk_buffers(pool, pool, total, total - 1)
    return [f"host {hostname}: {verb}: {refusal}" for refusal in buffer_refusals(pool, counts, total - 1, shrunk)]


def buffer_refusals(wanted: Pool, counts: dict[str, int], total: int, changed: set[str]) -> list[str]:
    """Refusals of a pool's new buffers (`planned_buffer`, `failure_buffer`, `hard_floor` in
    changed) against its hosts by state now: no buffer below what is out for it, no hard floor above
    what is in service. The one rule for the fleet file and the API."""
    refusals = []
    in_service = counts.get(HostState.IN_SERVICE, 0)
    planned_out = sum(counts.get(s, 0) for s in PLANNED_OUT_STATES)
    failure_out = sum(counts.get(s, 0) for s in FAILURE_OUT_STATES)
    sizes = wanted.buffers_for(total)
    if "planned_buffer" in changed and sizes.planned < planned_out:
        refusals.append(
            f"pool {wanted.name}: the planned buffer would be {sizes.planned} hosts, "
            f"below the {planned_out} hosts out for planned work now"
        )
    if "failure_buffer" in changed and sizes.failure < failure_out:
        refusals.append(
            f"pool {wanted.name}: the failure buffer would be {sizes.failure} hosts, "
            f"below the {failure_out} hosts out broken now"
        )
    floor = sizes.floor if wanted.hard_floor_hosts is None else wanted.hard_floor_hosts
    if "hard_floor" in changed and floor > in_service:
        refusals.append(
            f"pool {wanted.name}: the hard floor would be {floor} hosts, above the {in_service} hosts in service now"
        )
    return refusals


def _new_totals(plan: FleetPlan, live: LiveInventory) -> dict[int, int]:
    """Hosts per existing pool once the plan is applied (retired hosts count nowhere)."""
    totals = {pool_id: sum(counts.values()) for pool_id, counts in live.counts.items()}
    ids = {p.name: p.id for p in live.pools.values()}
    for change in plan.of("host"):
        before = change.live.pool_id if change.live is not None and change.live.state != RETIRED else None
        after = ids.get(change.spec.pool) if change.spec is not None else None
        if before != after:
            if before is not None:
                totals[before] = totals.get(before, 0) - 1
            if after is not None:
                totals[after] = totals.get(after, 0) + 1
    return totals
