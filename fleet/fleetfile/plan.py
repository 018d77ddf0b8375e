"""The plan: what applying a fleet file would change, kind by kind, compared with the live inventory.

fleet_plan is pure Python over a LiveInventory (fleet.fleetfile.live) and a FleetSpec: creations,
updates with the fields that change (before and after), and, with prune, what the file no longer
names. Refusals (fleet.fleetfile.safety) say why the plan must not be applied."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from fleet.fleetfile.live import LiveInventory
from fleet.fleetfile.schema import FleetFileInvalid, FleetSpec, PoolSpec, Problem
from fleet.models.hosts import RETIRED, HostState

KINDS = ("pool", "domain", "component", "version", "rule", "host", "service", "owner", "placement")
SYMBOLS = {"create": "+", "update": "~", "remove": "-"}


@dataclass(slots=True)
class Change:
    kind: str
    action: str  # create, update or remove
    name: str
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # field -> (before, after)
    spec: Any = None  # what the file says (None for a removal)
    live: Any = None  # the live row (None for a creation)
    note: str = ""
    withdrawal: dict[str, Any] | None = None  # a version withdrawn: what that will do (withdrawals.py)

    def line(self) -> str:
        text = f"{SYMBOLS[self.action]} {self.kind} {self.name}"
        if self.fields and self.action == "update":
            text += ": " + ", ".join(f"{name} {_show(a)} -> {_show(b)}" for name, (a, b) in self.fields.items())
        return f"{text} ({self.note})" if self.note else text

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "action": self.action,
            "name": self.name,
            "fields": {name: [_plain(a), _plain(b)] for name, (a, b) in self.fields.items()},
            "note": self.note,
            **({"withdrawal": self.withdrawal} if self.withdrawal is not None else {}),
        }


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


def _show(value: Any) -> str:
    if value is None or value == "":
        return "none"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


@dataclass
class FleetPlan:
    changes: list[Change] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    prune: bool = False
    dry_run: bool = False
    applied: bool = False
    _index: dict[tuple[str, str | None], list[Change]] = field(default_factory=dict, repr=False)
    _index_size: int = field(default=-1, repr=False)

    def of(self, kind: str, action: str | None = None) -> list[Change]:
        """The changes of one kind (and action), in plan order; indexed once the plan is complete."""
        if self._index_size != len(self.changes):
            self._index = {}
            for change in self.changes:
                self._index.setdefault((change.kind, None), []).append(change)
                self._index.setdefault((change.kind, change.action), []).append(change)
            self._index_size = len(self.changes)
        return list(self._index.get((kind, action), []))

    def counts(self) -> dict[str, dict[str, int]]:
        tally = Counter((c.kind, c.action) for c in self.changes)
        return {
            kind: {action: tally[(kind, action)] for action in SYMBOLS}
            for kind in KINDS
            if any(tally[(kind, a)] for a in SYMBOLS)
        }

    def lines(self) -> list[str]:
        order = {kind: index for index, kind in enumerate(KINDS)}
        return [c.line() for c in sorted(self.changes, key=lambda c: order[c.kind])]

    def summary(self) -> str:
        """`31 to create, 2 to change, 1 to remove (host +6 ~2 -1, ...)`, or `no changes`."""
        counts = self.counts()
        if not counts:
            return "no changes"
        totals = {action: sum(n[action] for n in counts.values()) for action in SYMBOLS}
        kinds = ", ".join(
            f"{kind} " + " ".join(f"{SYMBOLS[a]}{n[a]}" for a in SYMBOLS if n[a]) for kind, n in counts.items()
        )
        return f"{totals['create']} to create, {totals['update']} to change, {totals['remove']} to remove ({kinds})"

    def as_json(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "dry_run": self.dry_run,
            "prune": self.prune,
            "changes": [c.as_json() for c in self.changes],
            "counts": self.counts(),
            "refusals": self.refusals,
        }


def fleet_plan(spec: FleetSpec, live: LiveInventory, *, prune: bool) -> FleetPlan:
    """Compare the file with the live inventory. Owners must be existing users (FleetFileInvalid)."""
    _check_owners(spec, live)
    plan = FleetPlan(prune=prune)
    _plan_pools(plan, spec, live)
    _plan_components(plan, spec, live)
    _plan_rules(plan, spec, live)
    _plan_hosts(plan, spec, live)
    _plan_services(plan, spec, live)
    return plan


def _check_owners(spec: FleetSpec, live: LiveInventory) -> None:
    problems = [
        Problem(f"services[{service.index}].owners[{index}]", f"no user {owner!r}")
        for service in spec.services
        for index, owner in enumerate(service.owners)
        if owner not in live.users
    ]
    if problems:
        raise FleetFileInvalid(problems)


def _diff(live: Any, wanted: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {name: (getattr(live, name), value) for name, value in wanted.items() if getattr(live, name) != value}


def buffer_text(hosts: int | None, fraction: Decimal | None) -> str:
    return f"{hosts} hosts" if hosts is not None else f"{fraction.normalize() if fraction else 0} of the pool"


def _pool_wanted(pool: PoolSpec) -> dict[str, Any]:
    return {
        "workload_class": pool.workload_class,
        "description": pool.description,
        "planned_buffer": buffer_text(pool.planned_buffer_hosts, pool.planned_buffer_fraction),
        "failure_buffer": buffer_text(pool.failure_buffer_hosts, pool.failure_buffer_fraction),
        "hard_floor": pool.hard_floor_hosts,
        "executor": pool.executor,
        "drainer": pool.drainer,
    }


def _plan_pools(plan: FleetPlan, spec: FleetSpec, live: LiveInventory) -> None:
    for pool in spec.pools:
        current = live.pools.get(pool.name)
        if current is None:
            plan.changes.append(Change("pool", "create", pool.name, spec=pool))
        else:
            before = {
                "workload_class": current.workload_class,
                "description": current.description,
                "planned_buffer": buffer_text(current.planned_buffer_hosts, current.planned_buffer_fraction),
                "failure_buffer": buffer_text(current.failure_buffer_hosts, current.failure_buffer_fraction),
                "hard_floor": current.hard_floor_hosts,
                "executor": current.executor,
                "drainer": current.drainer,
            }
            changed = {k: (before[k], v) for k, v in _pool_wanted(pool).items() if before[k] != v}
            if changed:
                plan.changes.append(Change("pool", "update", pool.name, changed, spec=pool, live=current))
        for domain in pool.domains:
            name = f"{pool.name}/{domain.name}"
            found = live.domains.get((current.id, domain.name)) if current else None
            if found is None:
                plan.changes.append(Change("domain", "create", name, spec=(pool, domain)))
            elif changed := _diff(found, {"kind": domain.kind, "position": domain.position}):
                plan.changes.append(Change("domain", "update", name, changed, spec=(pool, domain), live=found))


def _plan_components(plan: FleetPlan, spec: FleetSpec, live: LiveInventory) -> None:
    for component in spec.components:
        current = live.components.get(component.name)
        wanted = {
            "display_name": component.display_name,
            "layer": component.layer,
            "needs_drain": component.needs_drain,
            "needs_reboot": component.needs_reboot,
        }
        if current is None:
            plan.changes.append(Change("component", "create", component.name, spec=component))
        elif changed := _diff(current, wanted):
            plan.changes.append(Change("component", "update", component.name, changed, spec=component, live=current))
        for version in component.versions:
            name = f"{component.name} {version.version}"
            found = live.versions.get((component.name, version.version))
            if found is None:
                note = "withdrawn" if version.withdrawn_reason is not None else ""
                plan.changes.append(Change("version", "create", name, spec=(component, version), note=note))
                continue
            wanted_v = {"withdrawn": version.withdrawn_reason is not None, "withdrawn_reason": version.withdrawn_reason}
            if version.withdrawn_reason is None:
                wanted_v["withdrawn_reason"] = found.withdrawn_reason if not found.withdrawn else ""
            if changed := _diff(found, wanted_v):
                plan.changes.append(Change("version", "update", name, changed, spec=(component, version), live=found))


def _rule_name(key: tuple[str, str, str, str, str]) -> str:
    job_facing, version, lower, low, high = key
    return f"{job_facing} {version} needs {lower} in [{low or 'any'}, {high or 'any'}]"


def _plan_rules(plan: FleetPlan, spec: FleetSpec, live: LiveInventory) -> None:
    named = set()
    for rule in spec.rules:
        named.add(rule.key)
        found = live.rules.get(rule.key)
        if found is None:
            plan.changes.append(Change("rule", "create", _rule_name(rule.key), spec=rule))
        elif found.note != rule.note:
            changed = {"note": (found.note, rule.note)}
            plan.changes.append(Change("rule", "update", _rule_name(rule.key), changed, spec=rule, live=found))
    if plan.prune:
        job_facing = {c.name for c in spec.components}
        for key, found in live.rules.items():
            if key not in named and found.job_facing in job_facing:
                plan.changes.append(Change("rule", "remove", _rule_name(key), live=found))


def _plan_hosts(plan: FleetPlan, spec: FleetSpec, live: LiveInventory) -> None:
    domains = live.domain_by_id()
    pool_names = {p.id: p.name for p in live.pools.values()}
    for host in spec.hosts:
        found = live.hosts.get(host.hostname)
        if found is None:
            plan.changes.append(Change("host", "create", host.hostname, spec=host))
            continue
        before = {
            "pool": pool_names[found.pool_id],
            "domain": domains[found.domain_id].name,
            "sku": found.sku,
            "gpu_count": found.gpu_count,
            "labels": found.labels,
        }
        wanted = {"pool": host.pool, "domain": host.domain, "sku": host.sku, "gpu_count": host.gpu_count}
        wanted["labels"] = host.labels
        changed = {k: (before[k], v) for k, v in wanted.items() if before[k] != v}
        if found.state == RETIRED:
            changed["state"] = (RETIRED, HostState.IN_SERVICE)
        if changed:
            note = "restored" if found.state == RETIRED else ""
            plan.changes.append(Change("host", "update", host.hostname, changed, spec=host, live=found, note=note))
    if plan.prune:
        pools = {live.pools[p.name].id for p in spec.pools if p.name in live.pools}
        named = {host.hostname for host in spec.hosts}
        for hostname, found in live.hosts.items():
            if found.pool_id in pools and found.state != RETIRED and hostname not in named:
                changed = {"state": (found.state, RETIRED)}
                plan.changes.append(Change("host", "remove", hostname, changed, live=found, note="retired"))


def _plan_services(plan: FleetPlan, spec: FleetSpec, live: LiveInventory) -> None:
    hostnames = {h.id: h.hostname for h in live.hosts.values()}
    by_service: dict[int, dict[str, Any]] = {}
    for (service_id, host_id), live_placement in live.placements.items():
        by_service.setdefault(service_id, {})[hostnames[host_id]] = live_placement
    # Pruning placements stays inside the pools the file declares (a one-pool export keeps the rest).
    declared = {live.pools[p.name].id for p in spec.pools if p.name in live.pools}
    for service in spec.services:
        found = live.services.get(service.name)
        if found is None:
            plan.changes.append(Change("service", "create", service.name, spec=service))
        elif changed := _diff(found, {"display_name": service.display_name, "description": service.description}):
            plan.changes.append(Change("service", "update", service.name, changed, spec=service, live=found))
        owners = live.owners.get(found.id, set()) if found else set()
        for owner in service.owners:
            if owner not in owners:
                plan.changes.append(Change("owner", "create", f"{service.name}: {owner}", spec=(service, owner)))
        placed = by_service.get(found.id, {}) if found else {}
        for placement in service.placements:
            name = f"{service.name} on {placement.hostname}"
            current = placed.get(placement.hostname)
            if current is None:
                plan.changes.append(Change("placement", "create", name, spec=(service, placement)))
            elif current.running_jobs != placement.running_jobs:
                changed = {"running_jobs": (current.running_jobs, placement.running_jobs)}
                plan.changes.append(
                    Change("placement", "update", name, changed, spec=(service, placement), live=current)
                )
        if plan.prune and found is not None:
            in_scope = {h: p for h, p in placed.items() if live.hosts[h].pool_id in declared}
            _prune_service(plan, found.id, service, owners, in_scope)


def _prune_service(plan: FleetPlan, service_id: int, service: Any, owners: set[str], placed: dict[str, Any]) -> None:
    for owner in sorted(owners - set(service.owners)):
        plan.changes.append(Change("owner", "remove", f"{service.name}: {owner}", live=(service_id, owner)))
    named = {p.hostname for p in service.placements}
    for hostname, current in sorted(placed.items()):
        if hostname not in named:
            plan.changes.append(Change("placement", "remove", f"{service.name} on {hostname}", live=current))
