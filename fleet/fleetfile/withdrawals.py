"""What a fleet file's withdrawals will set off, counted for its plan before anything is written.

A version the file withdraws offboards its active upgrades, or else rolls back the hosts that may
serve with it; either way it cancels the pending tasks of the other operations aimed at it, stops the
installs of it no executor has claimed, makes active again the completed upgrades its rollback takes
hosts below and asks again for the ad-hoc work it superseded there (`versions_withdrawal_apply`). Each
count is read by the selector the apply path acts on, with the versions as the file will have them
when that work runs (`PlannedWithdrawals`: the apply writes every version first), and in the apply's
order: it withdraws the versions one after another (writers.py `_offboard`), so an upgrade an earlier
one reopens is active, not reopened again, when a later one reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fleet.fleetfile.plan import Change, FleetPlan
from fleet.models import ComponentVersion
from opsplanner.services.resubmission import resubmissions_foreseen
from opsplanner.services.rollback import PlannedWithdrawals, rollback_groups, unstarted_installs_counts


@dataclass(slots=True)
class WithdrawalForeseen:
    """What withdrawing one version will do, as the plan's JSON gives it (`Change.withdrawal`)."""

    offboards: list[int] = field(default_factory=list)  # active upgrades offboarded
    rolls_back_hosts: int = 0  # hosts that may serve with it, rolled back to the version they ran before
    rollback_refused_hosts: int = 0  # those whose previous version is withdrawn: no rollback (an event says so)
    cancels_tasks: int = 0  # pending tasks of other operations aimed at it
    stops_installs: int = 0  # installs of it no executor has claimed
    reopens: list[int] = field(default_factory=list)  # completed upgrades made active again
    fallen_back_alerts: list[int] = field(default_factory=list)  # completed upgrades that stay so, with an alert
    resubmits_operations: int = 0  # ad-hoc operations submitted again for the work it superseded
    resubmits_hosts: int = 0  # their hosts
    resubmission_refused_hosts: int = 0  # hosts that work is not asked again on (an alert says why)

    def note(self) -> str:
        """The plan's line for it, empty when it does nothing else."""
        notes = []
        if self.offboards:
            notes.append("offboards " + ", ".join(f"upgrade #{pk}" for pk in self.offboards))
        if self.rolls_back_hosts:
            notes.append(f"rolls back the {self.rolls_back_hosts} hosts running it")
        if self.rollback_refused_hosts:
            n = self.rollback_refused_hosts
            notes.append(f"refuses the rollback of the {n} hosts whose previous version is withdrawn")
        if self.cancels_tasks:
            notes.append(f"cancels the {self.cancels_tasks} pending tasks of other operations aimed at it")
        if self.stops_installs:
            notes.append(f"stops the {self.stops_installs} installs of it no executor has claimed yet")
        if self.reopens:
            notes.append("reopens " + ", ".join(f"upgrade #{pk}" for pk in self.reopens))
        if self.fallen_back_alerts:
            listed = ", ".join(f"upgrade #{pk}" for pk in self.fallen_back_alerts)
            notes.append(f"leaves {listed} completed below its target, with an alert")
        if self.resubmits_operations:
            notes.append(f"resubmits {self.resubmits_operations} operations for {self.resubmits_hosts} hosts")
        if self.resubmission_refused_hosts:
            notes.append(f"refuses the resubmission on {self.resubmission_refused_hosts} hosts, with an alert")
        return "; ".join(notes)


def withdrawals_foresee(plan: FleetPlan) -> None:
    """Note on each version the plan withdraws what its withdrawal will do (`Change.withdrawal`, and
    the line's note). Reads only."""
    from fleet.services.catalogue import withdrawal_cancels  # it checks plans with this package: imported late
    from trains.models import Upgrade, UpgradeState

    # In plan order, the order the apply withdraws them in (writers.py `_offboard`).
    withdrawn: dict[int, Change] = {
        change.live.id: change
        for change in plan.of("version", "update")
        if change.fields.get("withdrawn") == (False, True)
    }
    if not withdrawn:
        return
    planned = planned_withdrawals(plan)
    foreseen = {version_id: WithdrawalForeseen() for version_id in withdrawn}
    active = Upgrade.objects.filter(component_version_id__in=list(withdrawn), state=UpgradeState.ACTIVE)
    for pk, version_id in active.order_by("id").values_list("id", "component_version_id"):
        foreseen[version_id].offboards.append(pk)
    for group in rollback_groups(withdrawn, planned=planned):
        if group.previous is None:  # nothing to go back to: the pre-return gate takes it off
            continue
        if group.refusal is not None:
            foreseen[group.version_id].rollback_refused_hosts += len(group.host_ids)
        else:
            foreseen[group.version_id].rolls_back_hosts += len(group.host_ids)
    for counts, name in (
        (withdrawal_cancels(withdrawn), "cancels_tasks"),
        (unstarted_installs_counts(withdrawn), "stops_installs"),
    ):
        for version_id, n in counts.items():
            setattr(foreseen[version_id], name, n)
    versions = ComponentVersion.objects.select_related("component").in_bulk(list(withdrawn))
    for version_id in withdrawn:
        each = foreseen[version_id]
        _fallen_back_foresee(versions[version_id], each, planned)
        # What this one reopens is active when the next one reads: that one does not reopen it again.
        planned = planned._replace(reopened=planned.reopened | frozenset(each.reopens))
    for version_id, change in withdrawn.items():
        change.withdrawal = asdict(foreseen[version_id])
        change.note = foreseen[version_id].note()


def _fallen_back_foresee(version: ComponentVersion, each: WithdrawalForeseen, planned: PlannedWithdrawals) -> None:
    """Count what the version's rollback takes hosts below, asked for again or not
    (`fallen_back_restore`), read as the apply will find it when it withdraws the version."""
    from trains.services.offboarding import upgrades_fallen_back

    for fallen in upgrades_fallen_back(version, planned=planned):
        if not fallen.not_reopened:
            each.reopens.append(fallen.upgrade.pk)
        elif fallen.alert:  # not one an earlier withdrawal of the version alerted for already
            each.fallen_back_alerts.append(fallen.upgrade.pk)
    for resubmission in resubmissions_foreseen(version, planned=planned):
        each.resubmits_operations += len(resubmission.requests)
        each.resubmits_hosts += sum(len(hosts) for hosts in resubmission.requests)
        each.resubmission_refused_hosts += sum(len(group.host_ids) for group in resubmission.refused)


def planned_withdrawals(plan: FleetPlan) -> PlannedWithdrawals:
    """The live versions the plan withdraws (with the file's reason) and releases."""
    updated = plan.of("version", "update")
    changed = [(change, change.fields["withdrawn"]) for change in updated if "withdrawn" in change.fields]
    return PlannedWithdrawals(
        withdrawn={change.live.id: change.spec[1].withdrawn_reason for change, (_, after) in changed if after},
        released=frozenset(change.live.id for change, (_, after) in changed if not after),
    )
