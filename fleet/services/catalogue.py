"""Single changes to pools, domains, components, versions, compatibility rules, services and
placements (creations are in fleet.services.inventory and fleet.services.owners). Each is one
transaction, validated, with an event; the fleet file's rules are asked, not written again: buffers
(`fleet.fleetfile.safety.buffer_refusals`), the withdrawn refusal
(`opsplanner.services.compatibility.withdrawn_refusal`) and what withdrawing a version does (its upgrades
offboarded, its hosts rolled back)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, QuerySet

from fleet.fleetfile.safety import buffer_refusals, pool_host_counts
from fleet.models import (
    RELEASED_WHERE,
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    MaintenanceDomain,
    Pool,
    Service,
    ServicePlacement,
    WithdrawnBy,
)
from fleet.services.audit import inventory_record_delete, inventory_record_save
from opsplanner import clock
from opsplanner.events import Actor, event_record
from opsplanner.services.compatibility import withdrawn_refusal
from opsplanner.services.rollback import StoppedInstalls, installs_stop, stopped_operations_open, version_rollback

POOL_FIELDS = (
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
# Which pool fields make up each buffer rule of fleet.fleetfile.safety.
BUFFER_RULES = {
    "planned_buffer": ("planned_buffer_hosts", "planned_buffer_fraction"),
    "failure_buffer": ("failure_buffer_hosts", "failure_buffer_fraction"),
    "hard_floor": ("hard_floor_hosts",),
}


@transaction.atomic
def pool_update(*, pool_id: int, changes: Mapping[str, Any], actor: Actor = None, reason: str = "") -> Pool:
    """Change a pool's fields (POOL_FIELDS). A buffer given as hosts drops its fraction and the
    other way round. Refused (conflict) when a buffer would fall below what is out for it now, or
    the hard floor rise above what is in service (the numbers are named)."""
    unknown = set(changes) - set(POOL_FIELDS)
    if unknown:
        raise ValueError(f"not pool fields: {sorted(unknown)}")
    pool = Pool.objects.select_for_update(no_key=True).get(pk=pool_id)
    for name, value in changes.items():
        setattr(pool, name, value)
    for kind in ("planned", "failure"):
        hosts, fraction = f"{kind}_buffer_hosts", f"{kind}_buffer_fraction"
        if hosts in changes and fraction not in changes and changes[hosts] is not None:
            setattr(pool, fraction, None)
        if fraction in changes and hosts not in changes and changes[fraction] is not None:
            setattr(pool, hosts, None)
    pool.full_clean()
    refusals = pool_change_refusals(pool=pool, changed_fields=set(changes))
    if refusals:
        raise ValidationError([ValidationError(refusal, code="conflict") for refusal in refusals])
    inventory_record_save(obj=pool, actor=actor, fields=POOL_FIELDS, reason=reason or "pool changed")
    return pool


def pool_change_refusals(*, pool: Pool, changed_fields: set[str]) -> list[str]:
    """Why the pool's new buffers or hard floor (in `changed_fields`) may not be saved now, against
    its hosts by state; [] when they may. Locks the pool row (as its tick does) until the caller's
    transaction ends, so no admission slips in between the check and the write: for the API and the
    admin."""
    Pool.objects.select_for_update(no_key=True).filter(pk=pool.pk).values_list("pk").first()
    counts = pool_host_counts(pool.pk)
    changed = {rule for rule, fields in BUFFER_RULES.items() if set(fields) & changed_fields}
    return buffer_refusals(pool, counts, sum(counts.values()), changed)


@transaction.atomic
def domain_update(
    *, domain_id: int, kind: str | None = None, position: int | None = None, actor: Actor = None, reason: str = ""
) -> MaintenanceDomain:
    domain = MaintenanceDomain.objects.select_related("pool").get(pk=domain_id)
    domain.kind = domain.kind if kind is None else kind
    domain.position = domain.position if position is None else position
    inventory_record_save(obj=domain, actor=actor, fields=["kind", "position"], reason=reason or "domain changed")
    return domain


@transaction.atomic
def component_update(
    *,
    component_id: int,
    display_name: str | None = None,
    needs_reboot: bool | None = None,
    needs_drain: bool | None = None,
    actor: Actor = None,
    reason: str = "",
) -> Component:
    """Change how a component installs; its name and layer stay (rules and trains refer to them)."""
    component = Component.objects.get(pk=component_id)
    for name, value in (("display_name", display_name), ("needs_reboot", needs_reboot), ("needs_drain", needs_drain)):
        if value is not None:
            setattr(component, name, value)
    fields = ["display_name", "needs_reboot", "needs_drain"]
    inventory_record_save(obj=component, actor=actor, fields=fields, reason=reason or "component changed")
    return component


class Withdrawal(NamedTuple):
    """What withdrawing versions did (`versions_withdrawal_apply`)."""

    offboarded: int  # active upgrades offboarded (each rolls back the hosts running its version)
    rollbacks: list[int]  # rollback operations of versions that had no active upgrade
    without_previous: int  # hosts running such a version with nothing recorded to go back to
    tasks_cancelled: int  # pending tasks of other operations to them (ad-hoc, rollbacks, emergencies)
    installs_stopped: int  # installs of them no executor had claimed (`installs_stop`): not run

    def event_data(self) -> dict[str, Any]:
        """What the withdrawal did, as the events of a withdrawal say it (the API's and the fleet file's)."""
        return {
            "offboarded_upgrades": self.offboarded,
            "rollbacks": self.rollbacks,
            "hosts_without_previous": self.without_previous,
            "pending_tasks_cancelled": self.tasks_cancelled,
            "installs_stopped": self.installs_stopped,
        }


def versions_withdrawal_apply(
    *, version_ids: Iterable[int], reason: str, actor: Actor, roll_back_without_upgrade: bool = True
) -> Withdrawal:
    """What withdrawing these versions does, the one rule for the API and the fleet file: every
    active upgrade to them is offboarded through the upgrade's own service (pending work cancelled,
    hosts running it rolled back, and what that takes them below asked for again, once per version:
    by its first upgrade offboarded); a version without one has the hosts that may serve with it
    rolled back all the same (`version_rollback`), rather than left serving it until their next
    drain, and what that takes them below asked for again (`fallen_back_restore`), as an offboarding
    does. Not when the version is withdrawn already (`roll_back_without_upgrade=False`): that was
    done then. Whichever way, the installs of them no executor has claimed are stopped
    (`installs_stop`): the offboardings', the ad-hoc operations', the rollbacks' and the emergencies'."""
    from trains.models import Upgrade, UpgradeState
    from trains.services.offboarding import fallen_back_restore, upgrade_offboard

    version_ids = list(version_ids)
    stopped = installs_stop(version_ids=version_ids, reason=reason, actor=actor)
    # In id order, as every writer of several upgrades (the forecast's promises, a replan's locks).
    upgrades = Upgrade.objects.filter(component_version_id__in=version_ids, state=UpgradeState.ACTIVE).order_by("id")
    offboarded: list[int] = []  # the version of each upgrade offboarded
    for upgrade in upgrades:
        # The version is rolled back, and what that takes below asked for again, once, by its first
        # upgrade offboarded (both read every pool), as the fleet file's plan counts them: the
        # others would repeat its refusals and alerts. One that was no longer active leaves it to the next.
        roll_back = upgrade.component_version_id not in offboarded
        if upgrade_offboard(upgrade=upgrade, reason=reason, actor=actor, roll_back=roll_back):
            offboarded.append(upgrade.component_version_id)
    rollbacks: list[int] = []
    without_previous = 0
    unhandled = ComponentVersion.objects.filter(pk__in=version_ids).exclude(pk__in=offboarded).order_by("pk")
    for version in unhandled if roll_back_without_upgrade else []:
        why = f"roll back withdrawn {version}: {reason}"
        rollback = version_rollback(
            version=version,
            scope=f"withdrawn {version}",
            reason=why,
            actor=actor,
            subject=version,
            refused_kind="component_version.rollback_refused",
        )
        rollbacks += rollback.operations
        without_previous += rollback.without_previous
        fallen_back_restore(withdrawn=version, why=f"withdrawn: {reason}", actor=actor)
    return Withdrawal(
        offboarded=len(offboarded),
        rollbacks=rollbacks,
        without_previous=without_previous,
        tasks_cancelled=_pending_operations_cancel(version_ids, reason=reason, actor=actor, stopped=stopped),
        installs_stopped=stopped.installs,
    )


def _pending_operations_cancel(
    version_ids: list[int], *, reason: str, actor: Actor, stopped: StoppedInstalls | None = None
) -> int:
    """Cancel the open operations with tasks still pending to these versions, the ones an
    offboarding does not reach (ad-hoc upgrades, rollbacks, emergencies): their tasks would wait,
    refused, for as long as the version stays withdrawn; and those whose installs the withdrawal
    stopped (`stopped`, `stopped_operations_open`). Tasks under way finish; the
    operation then closes cancelled. Not one an offboarding cancelled already. How many tasks were
    cancelled."""
    from opsplanner.services.operation_cancel import operations_cancel

    pending = set(_operations_pending_to(version_ids).values_list("pk", flat=True)) | stopped_operations_open(stopped)
    return sum(operations_cancel(operation_ids=pending, reason=reason, actor=actor).values())


def withdrawal_cancels(version_ids: Iterable[int]) -> dict[int, int]:
    """Per version, how many pending tasks withdrawing it would cancel besides its active upgrades'
    (which their offboarding cancels): those of the operations `_pending_operations_cancel` takes,
    counted before the withdrawal, for the fleet file's plan (one query)."""
    from opsplanner.models import HostTask, TaskState
    from trains.models import UpgradeState

    operations = _operations_pending_to(list(version_ids)).exclude(visit_link__upgrade__state=UpgradeState.ACTIVE)
    return dict(
        HostTask.objects.filter(operation__in=operations, state=TaskState.PENDING)
        .values_list("operation__component_version_id")
        .annotate(n=Count("id"))
        .order_by()
    )


def _operations_pending_to(version_ids: list[int]) -> QuerySet[Any]:
    """The open operations with a task still pending to one of these versions."""
    from opsplanner.models import Operation, OperationState, TaskState

    return Operation.objects.filter(
        component_version_id__in=version_ids, state=OperationState.OPEN, tasks__state=TaskState.PENDING
    )


@transaction.atomic
def component_version_withdraw(*, version_id: int, reason: str, actor: Actor = None) -> ComponentVersion:
    """Withdraw a version: no upgrade may target it, and its active upgrades are offboarded (their
    pending work cancelled with the reason). A version an operator withdrew is refused with why; one
    the offboarding of an upgrade withdrew becomes the operator's, with their reason (what the
    offboarding did stands), so re-onboarding that upgrade no longer lifts it."""
    if not reason.strip():
        raise ValidationError({"reason": "Say why the version is withdrawn."})
    # Every pool's tick lock in id order before the version's row, as the fleet file's apply does:
    # offboarding takes a pool, then the version, then the upgrade (trains/services/offboarding.py).
    list(Pool.objects.select_for_update(no_key=True).order_by("pk").values_list("pk", flat=True))
    version = ComponentVersion.objects.select_for_update().select_related("component").get(pk=version_id)
    refusal = withdrawn_refusal(version)
    if refusal is not None and version.withdrawn_by != WithdrawnBy.OFFBOARDING:
        raise ValidationError(refusal.message, code="conflict")
    withdrawal = versions_withdrawal_apply(
        version_ids=[version.pk],
        reason=f"version withdrawn: {reason}",
        actor=actor,
        # Withdrawn already by an offboarding, which rolled its hosts back: upgrades of other pools
        # still active are offboarded (each rolls back its own hosts), and nothing is rolled back twice.
        roll_back_without_upgrade=refusal is None,
    )
    ComponentVersion.objects.filter(pk=version.pk).update(
        withdrawn_at=clock.now(), withdrawn_reason=reason[:500], withdrawn_by=WithdrawnBy.OPERATOR
    )
    version.refresh_from_db()
    event_record(
        kind="component_version.withdrawn",
        subject=version,
        actor=actor,
        reason=reason,
        data={"component": version.component.name, "version": version.version, **withdrawal.event_data()},
    )
    return version


@transaction.atomic
def component_version_release(*, version_id: int, reason: str, actor: Actor = None) -> ComponentVersion:
    """Release a version an operator withdrew: upgrades may target it again. Its upgrades offboarded
    by the withdrawal stay offboarded (each is re-onboarded on its own, by approval) and hosts rolled
    back stay rolled back. A version withdrawn by an upgrade's offboarding or by the fleet file is
    released where it was withdrawn; the refusal says where."""
    if not reason.strip():
        raise ValidationError({"reason": "Say why the version is released."})
    version = ComponentVersion.objects.select_for_update().select_related("component").get(pk=version_id)
    if version.withdrawn_at is None:
        raise ValidationError(f"{version} is not withdrawn.", code="conflict")
    if version.withdrawn_by != WithdrawnBy.OPERATOR:
        raise ValidationError(
            f"{version} is not released here: {RELEASED_WHERE[version.withdrawn_by]}.", code="conflict"
        )
    withdrawn_for = version.withdrawn_reason
    ComponentVersion.objects.filter(pk=version.pk).update(
        withdrawn_at=None, withdrawn_reason="", withdrawn_by=WithdrawnBy.NOT_WITHDRAWN
    )
    version.refresh_from_db()
    event_record(
        kind="component_version.released",
        subject=version,
        actor=actor,
        reason=reason,
        data={"component": version.component.name, "version": version.version, "was_withdrawn_for": withdrawn_for},
    )
    return version


@transaction.atomic
def compatibility_rule_delete(*, rule_id: int, actor: Actor = None, reason: str = "") -> None:
    rule = CompatibilityRule.objects.get(pk=rule_id)
    inventory_record_delete(obj=rule, actor=actor, reason=reason or "compatibility rule removed")


@transaction.atomic
def service_update(
    *,
    service_id: int,
    display_name: str | None = None,
    description: str | None = None,
    owners: Iterable[Any] | None = None,
    actor: Actor = None,
    reason: str = "",
) -> Service:
    service = Service.objects.get(pk=service_id)
    if display_name is not None:
        service.display_name = display_name
    if description is not None:
        service.description = description
    m2m = {"owners": list(owners)} if owners is not None else None
    fields = ["display_name", "description"]
    inventory_record_save(obj=service, actor=actor, fields=fields, m2m=m2m, reason=reason or "service changed")
    return service


@transaction.atomic
def service_placements_set(
    *, service: Service, hosts: Iterable[Host], running_jobs: int, actor: Actor = None
) -> dict[str, int]:
    """Place service on hosts with running_jobs each: new placements are added, existing ones get
    the new count. Event `service.placed` with how many were added and changed."""
    if running_jobs < 0:
        raise ValidationError({"running_jobs": "Running jobs cannot be negative."})
    host_ids = sorted({host.pk for host in hosts})
    if not host_ids:
        raise ValidationError({"hosts": "Name at least one host."})
    existing = dict(
        ServicePlacement.objects.filter(service=service, host_id__in=host_ids).values_list("host_id", "running_jobs")
    )
    ServicePlacement.objects.bulk_create(
        [
            ServicePlacement(service=service, host_id=pk, running_jobs=running_jobs)
            for pk in host_ids
            if pk not in existing
        ]
    )
    changed = [pk for pk, jobs in existing.items() if jobs != running_jobs]
    ServicePlacement.objects.filter(service=service, host_id__in=changed).update(running_jobs=running_jobs)
    counts = {"added": len(host_ids) - len(existing), "changed": len(changed)}
    if counts["added"] or counts["changed"]:
        data = {"hosts_added": counts["added"], "hosts_changed": counts["changed"], "running_jobs": running_jobs}
        event_record(kind="service.placed", subject=service, actor=actor, data=data)
    return counts


@transaction.atomic
def service_placements_remove(*, service: Service, hosts: Iterable[Host], actor: Actor = None) -> int:
    """Take service off hosts; hosts it is not on are left alone. Event `service.unplaced`."""
    host_ids = sorted({host.pk for host in hosts})
    if not host_ids:
        raise ValidationError({"hosts": "Name at least one host."})
    removed, _ = ServicePlacement.objects.filter(service=service, host_id__in=host_ids).delete()
    if removed:
        event_record(kind="service.unplaced", subject=service, actor=actor, data={"hosts_removed": removed})
    return removed
