"""Writing a fleet plan, kind by kind, set-based; one event row per change, all written with COPY."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db.models import Model

from fleet.fleetfile.live import LiveInventory
from fleet.fleetfile.plan import Change, FleetPlan
from fleet.fleetfile.rows import json_value, rows_update
from fleet.models import (
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    HostState,
    MaintenanceDomain,
    Pool,
    Service,
    ServicePlacement,
    WithdrawnBy,
)
from fleet.versions import version_sort_key
from opsplanner import clock
from opsplanner.bulk import insert_missing
from opsplanner.events import Actor, EventRow, actor_fields, events_copy_rows

if TYPE_CHECKING:
    from fleet.services.catalogue import Withdrawal

CHUNK = 20_000
REASON = "applied from the fleet file"


class ConcurrentFleetChange(ValidationError):
    """A row changed between the plan and the write (a guarded write matched fewer rows): the
    transaction rolls back, and applying the file again plans from the new state."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="conflict")


def _expect(what: str, wanted: int, got: int) -> None:
    if wanted != got:
        raise ConcurrentFleetChange(f"{what}: {got} rows written, {wanted} planned; someone changed them meanwhile")


def _data(change: Change) -> dict[str, Any]:
    if change.action == "update" or change.fields:
        return {
            "changed_fields": sorted(change.fields),
            "before": {k: a for k, (a, _) in change.fields.items()},
            "after": {k: b for k, (_, b) in change.fields.items()},
        }
    return {"name": change.name}


class FleetWriter:
    def __init__(self, plan: FleetPlan, live: LiveInventory, *, actor: Actor, reason: str) -> None:
        self.plan, self.live = plan, live
        self.now = clock.now()
        self.actor_id, self.actor = actor_fields(actor)
        self.actor_obj = actor
        self.reason = reason or REASON
        self.events: list[EventRow] = []
        self.pool_ids = {name: p.id for name, p in live.pools.items()}
        self.domain_ids = {key: d.id for key, d in live.domains.items()}

    def event(
        self,
        kind: str,
        subject_type: str,
        subject_id: int | None,
        change: Change,
        *,
        pool_id: int | None = None,
        host_id: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        payload = json.dumps(data if data is not None else _data(change), default=str, sort_keys=True)
        self.events.append(
            EventRow(
                self.now,
                kind,
                self.actor_id,
                self.actor,
                subject_type,
                subject_id,
                pool_id,
                host_id,
                self.reason,
                payload,
            )
        )

    def write(self) -> None:
        self._components()
        self._versions()
        self._pools()
        self._domains()
        self._rules()
        self._hosts()
        self._services()
        self._placements()
        for start in range(0, len(self.events), CHUNK * 5):
            events_copy_rows(self.events[start : start + CHUNK * 5])
        counts = self.plan.counts()
        events_copy_rows(
            [EventRow(self.now, "fleet.applied", self.actor_id, self.actor, "fleet.fleetfile", None, None, None,
                      self.reason, json.dumps({"counts": counts, "prune": self.plan.prune}))]
        )  # fmt: skip

    def _insert(self, model: type[Model], columns: Sequence[str], rows: list[tuple[Any, ...]], what: str) -> None:
        inserted = sum(
            insert_missing(model, columns, rows[start : start + CHUNK]) for start in range(0, len(rows), CHUNK)
        )
        _expect(f"new {what}", len(rows), inserted)

    # Components and versions ---------------------------------------------------------------------

    def _components(self) -> None:
        created = self.plan.of("component", "create")
        fields = ["display_name", "layer", "needs_reboot", "needs_drain"]
        rows = [(c.spec.name, *(getattr(c.spec, f) for f in fields)) for c in created]
        self._insert(Component, ["name", *fields], rows, "components")
        updated = self.plan.of("component", "update")
        Component.objects.bulk_update(
            [Component(id=c.live.id, **{f: getattr(c.spec, f) for f in fields}) for c in updated], fields
        )
        self.component_ids = dict(Component.objects.values_list("name", "id"))
        for change in created + updated:
            kind = "component.created" if change.action == "create" else "component.updated"
            self.event(kind, "fleet.component", self.component_ids[change.name], change)

    def _versions(self) -> None:
        created = self.plan.of("version", "create")
        rows = [
            (
                self.component_ids[component.name],
                version.version,
                version_sort_key(version.version),
                self.now,
                self.now if version.withdrawn_reason is not None else None,
                version.withdrawn_reason or "",
                WithdrawnBy.FLEET_FILE if version.withdrawn_reason is not None else WithdrawnBy.NOT_WITHDRAWN,
            )
            for component, version in (c.spec for c in created)
        ]
        columns = [
            "component_id", "version", "sort_key", "released_at", "withdrawn_at", "withdrawn_reason", "withdrawn_by",
        ]  # fmt: skip
        self._insert(ComponentVersion, columns, rows, "versions")
        updated = self.plan.of("version", "update")
        # Every version as the file has it before any withdrawal's work, so that work sees the others
        # this apply withdraws or releases (a rollback to one, a resubmission of one: resubmission.py);
        # an offboarding keeps the file's reason (upgrade_offboard leaves a FLEET_FILE withdrawal be).
        for change in updated:
            _, version = change.spec
            withdrawn = version.withdrawn_reason is not None
            # A version the file names withdrawn is the file's to release (safety.py lets it release only those).
            who = WithdrawnBy.FLEET_FILE if withdrawn else WithdrawnBy.NOT_WITHDRAWN
            ComponentVersion.objects.filter(pk=change.live.id).update(
                withdrawn_reason=version.withdrawn_reason or "",
                **({"withdrawn_at": self.now if withdrawn else None} if "withdrawn" in change.fields else {}),
                **({"withdrawn_by": who} if "withdrawn" in change.fields or withdrawn else {}),
            )
        withdrawals = self._offboard(updated)
        ids = {
            (name, version): pk
            for pk, name, version in ComponentVersion.objects.values_list("id", "component__name", "version")
        }
        self.version_ids = ids
        for change in created:
            component, version = change.spec
            data = {"component": component.name, "version": version.version, "withdrawn": version.withdrawn_reason}
            self.event("component.version_added", "fleet.componentversion", ids[(component.name, version.version)],
                       change, data=data)  # fmt: skip
        for change in updated:
            # A withdrawal says what it did, as the API's withdrawal event does.
            withdrawal = withdrawals.get(change.live.id)
            done = withdrawal.event_data() if withdrawal is not None else {}
            self.event(
                "component_version.updated", "fleet.componentversion", change.live.id, change, data=_data(change) | done
            )

    def _offboard(self, updated: list[Change]) -> dict[int, Withdrawal]:
        """Upgrades to a version the file withdraws are offboarded by their own service (pending work
        cancelled, hosts running it rolled back), the file's withdrawal written already. What each
        withdrawal did, by version."""
        from fleet.services.catalogue import versions_withdrawal_apply

        withdrawals: dict[int, Withdrawal] = {}
        for change in updated:
            if change.fields.get("withdrawn") == (False, True):
                why = change.spec[1].withdrawn_reason
                withdrawals[change.live.id] = versions_withdrawal_apply(
                    version_ids=[change.live.id],
                    reason=f"version withdrawn by the fleet file: {why}",
                    actor=self.actor_obj,
                )
        return withdrawals

    # Pools and domains ---------------------------------------------------------------------------

    POOL_COLUMNS = (
        "workload_class",
        "description",
        "planned_buffer_hosts",
        "planned_buffer_fraction",
        "failure_buffer_hosts",
        "failure_buffer_fraction",
        "hard_floor_hosts",
        "executor",
        "drainer",
    )

    def _pools(self) -> None:
        created = self.plan.of("pool", "create")
        rows = [(c.spec.name, *(getattr(c.spec, f) for f in self.POOL_COLUMNS), self.now) for c in created]
        self._insert(Pool, ["name", *self.POOL_COLUMNS, "created_at"], rows, "pools")
        updated = self.plan.of("pool", "update")
        Pool.objects.bulk_update(
            [Pool(id=c.live.id, **{f: getattr(c.spec, f) for f in self.POOL_COLUMNS}) for c in updated],
            list(self.POOL_COLUMNS),
        )
        if created:
            self.pool_ids = dict(Pool.objects.values_list("name", "id"))
        for change in created + updated:
            pool_id = self.pool_ids[change.name]
            kind = "pool.created" if change.action == "create" else "pool.updated"
            self.event(kind, "fleet.pool", pool_id, change, pool_id=pool_id)

    def _domains(self) -> None:
        created = self.plan.of("domain", "create")
        rows = [
            (self.pool_ids[pool.name], domain.name, domain.kind, domain.position, self.now)
            for pool, domain in (c.spec for c in created)
        ]
        self._insert(MaintenanceDomain, ["pool_id", "name", "kind", "position", "created_at"], rows, "domains")
        updated = self.plan.of("domain", "update")
        MaintenanceDomain.objects.bulk_update(
            [MaintenanceDomain(id=c.live.id, kind=c.spec[1].kind, position=c.spec[1].position) for c in updated],
            ["kind", "position"],
        )
        if created:
            self.domain_ids = {
                (pool_id, name): pk
                for pk, pool_id, name in MaintenanceDomain.objects.values_list("id", "pool_id", "name")
            }
        for change in created + updated:
            pool, domain = change.spec
            pool_id = self.pool_ids[pool.name]
            kind = "domain.created" if change.action == "create" else "domain.updated"
            self.event(
                kind, "fleet.maintenancedomain", self.domain_ids[(pool_id, domain.name)], change, pool_id=pool_id
            )

    # Compatibility rules -------------------------------------------------------------------------

    def _rules(self) -> None:
        created = self.plan.of("rule", "create")
        rows = [
            (
                self.version_ids[(r.job_facing, r.version)],
                self.component_ids[r.lower],
                r.min_version,
                version_sort_key(r.min_version) if r.min_version else "",
                r.max_version,
                version_sort_key(r.max_version) if r.max_version else "",
                r.note,
            )
            for r in (c.spec for c in created)
        ]
        columns = ["job_facing_version_id", "lower_component_id", "min_version", "min_key", "max_version", "max_key"]
        self._insert(CompatibilityRule, [*columns, "note"], rows, "compatibility rules")
        updated = self.plan.of("rule", "update")
        CompatibilityRule.objects.bulk_update(
            [CompatibilityRule(id=c.live.id, note=c.spec.note) for c in updated], ["note"]
        )
        removed = self.plan.of("rule", "remove")
        CompatibilityRule.objects.filter(pk__in=[c.live.id for c in removed]).delete()
        ids = {}
        if created:
            ids = {
                (job, version, lower, low, high): pk
                for pk, job, version, lower, low, high in CompatibilityRule.objects.values_list(
                    "id", "job_facing_version__component__name", "job_facing_version__version",
                    "lower_component__name", "min_version", "max_version",
                )
            }  # fmt: skip
        for change in created:
            self.event("compatibility_rule.created", "fleet.compatibilityrule", ids[change.spec.key], change)
        for change in updated:
            self.event("compatibility_rule.updated", "fleet.compatibilityrule", change.live.id, change)
        for change in removed:
            self.event("compatibility_rule.deleted", "fleet.compatibilityrule", change.live.id, change)

    # Hosts ---------------------------------------------------------------------------------------

    def _hosts(self) -> None:
        created = self.plan.of("host", "create")
        rows = []
        for change in created:
            host = change.spec
            pool_id = self.pool_ids[host.pool]
            rows.append((host.hostname, pool_id, self.domain_ids[(pool_id, host.domain)], HostState.IN_SERVICE,
                         self.now, host.sku, host.gpu_count, json_value(host.labels), self.now))  # fmt: skip
        columns = ["hostname", "pool_id", "domain_id", "state", "state_changed_at", "sku", "gpu_count", "labels"]
        self._insert(Host, [*columns, "created_at"], rows, "hosts")
        changed = self.plan.of("host", "update") + self.plan.of("host", "remove")
        columns = ["pool_id", "domain_id", "sku", "gpu_count", "labels"]
        moved = [self._host_row(c) for c in changed if "state" not in c.fields]
        _expect("hosts changed", len(moved), rows_update(Host, columns, moved, guard="state"))
        turned = [(*self._host_row(c), c.fields["state"][1], self.now) for c in changed if "state" in c.fields]
        _expect("hosts retired or restored", len(turned),
                rows_update(Host, [*columns, "state", "state_changed_at"], turned, guard="state"))  # fmt: skip
        if created:
            self.host_ids = dict(Host.all_objects.values_list("hostname", "id"))
        else:
            self.host_ids = {h.hostname: h.id for h in self.live.hosts.values()}
        for change in created:
            host = change.spec
            host_id, pool_id = self.host_ids[host.hostname], self.pool_ids[host.pool]
            data = {"hostname": host.hostname, "pool": host.pool, "domain": host.domain}
            self.event("host.created", "fleet.host", host_id, change, pool_id=pool_id, host_id=host_id, data=data)
        for change in changed:
            self._host_event(change)

    def _host_row(self, change: Change) -> tuple[Any, ...]:
        """(id, state expected, pool, domain, sku, gpus, labels): a retired host keeps its fields."""
        live = change.live
        if change.action == "remove":
            return (
                live.id,
                live.state,
                live.pool_id,
                live.domain_id,
                live.sku,
                live.gpu_count,
                json_value(live.labels),
            )
        host = change.spec
        pool_id = self.pool_ids[host.pool]
        domain_id = self.domain_ids[(pool_id, host.domain)]
        return (live.id, live.state, pool_id, domain_id, host.sku, host.gpu_count, json_value(host.labels))

    def _host_event(self, change: Change) -> None:
        live = change.live
        pool_id = self.pool_ids[change.spec.pool] if change.spec is not None else live.pool_id
        if "state" not in change.fields:
            self.event("host.updated", "fleet.host", live.id, change, pool_id=pool_id, host_id=live.id)
            return
        before, after = change.fields["state"]
        data = {"from": before, "to": after, **_data(change)}
        self.event("host.state_changed", "fleet.host", live.id, change, pool_id=pool_id, host_id=live.id, data=data)

    # Services, owners, placements ----------------------------------------------------------------

    def _services(self) -> None:
        created = self.plan.of("service", "create")
        rows = [(c.spec.name, c.spec.display_name, c.spec.description) for c in created]
        self._insert(Service, ["name", "display_name", "description"], rows, "services")
        updated = self.plan.of("service", "update")
        Service.objects.bulk_update(
            [Service(id=c.live.id, display_name=c.spec.display_name, description=c.spec.description) for c in updated],
            ["display_name", "description"],
        )
        self.service_ids = {name: s.id for name, s in self.live.services.items()}
        if created:
            self.service_ids = dict(Service.objects.values_list("name", "id"))
        for change in created + updated:
            kind = "service.created" if change.action == "create" else "service.updated"
            self.event(kind, "fleet.service", self.service_ids[change.name], change)
        through = Service.owners.through
        added = self.plan.of("owner", "create")
        through.objects.bulk_create(
            [through(service_id=self.service_ids[s.name], user_id=self.live.users[owner]) for s, owner in
             (c.spec for c in added)]
        )  # fmt: skip
        for change in added:
            service, owner = change.spec
            data = {"service": service.name, "owner": owner}
            self.event("service.owner_added", "fleet.service", self.service_ids[service.name], change, data=data)
        for change in self.plan.of("owner", "remove"):
            service_id, owner = change.live
            through.objects.filter(service_id=service_id, user__username=owner).delete()
            data = {"owner": owner}
            self.event("service.owner_removed", "fleet.service", service_id, change, data=data)

    def _placements(self) -> None:
        created = self.plan.of("placement", "create")
        rows = [
            (self.service_ids[service.name], self.host_ids[placement.hostname], placement.running_jobs)
            for service, placement in (c.spec for c in created)
        ]
        self._insert(ServicePlacement, ["service_id", "host_id", "running_jobs"], rows, "placements")
        updated = self.plan.of("placement", "update")
        changes = [(c.live.id, c.spec[1].running_jobs) for c in updated]
        _expect("placements changed", len(changes), rows_update(ServicePlacement, ["running_jobs"], changes))
        removed = self.plan.of("placement", "remove")
        ServicePlacement.objects.filter(pk__any=[c.live.id for c in removed]).delete()
        ids = {}
        if created:
            services = {self.service_ids[c.spec[0].name] for c in created}
            ids = {
                (service_id, host_id): pk
                for pk, service_id, host_id in ServicePlacement.objects.filter(service_id__in=services)
                .values_list("id", "service_id", "host_id")
                .iterator(chunk_size=CHUNK)
            }
        for change in created:
            service, placement = change.spec
            key = (self.service_ids[service.name], self.host_ids[placement.hostname])
            data = {"service": service.name, "host": placement.hostname, "running_jobs": placement.running_jobs}
            self.event(
                "service_placement.created", "fleet.serviceplacement", ids[key], change, host_id=key[1], data=data
            )
        for change in updated + removed:
            kind = "service_placement.updated" if change.action == "update" else "service_placement.deleted"
            live = change.live
            self.event(kind, "fleet.serviceplacement", live.id, change, host_id=live.host_id)
