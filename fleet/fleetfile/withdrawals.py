"""What a fleet file's withdrawals will set off, counted for its plan before anything is written.

A version the file withdraws offboards its active upgrades, or else rolls back the hosts that may
serve with it; either way it cancels the pending tasks of the other operations aimed at it, stops the
installs of it no executor has claimed, makes active again the completed upgrades its rollback takes
hosts below and asks again for the ad-hoc work it superseded there (`versions_withdrawal_apply`). Each
count is read by the selector the apply path acts on, with the versions as the file will have them
when that work runs (`PlannedWithdrawals`: the apply writes every version first)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from fleet.fleetfile.plan import Change, FleetPlan
from fleet.models import ComponentVersion
from opsplanner.services.resubmission import resubmissions_foreseen
from opsplanner.services.rollback import PlannedWithdrawals, hosts_serving_counts, unstarted_installs_counts


@dataclass(slots=True)
class WithdrawalForeseen:
    """What withdrawing one version will do, as the plan's JSON gives it (`Change.withdrawal`)."""

    offboards: list[int] = field(default_factory=list)  # active upgrades offboarded
    rolls_back_hosts: int = 0  # hosts that may serve with it, rolled back to the version they ran before
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
    from trains.services.offboarding import upgrades_fallen_back

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
    for counts, name in (
        (hosts_serving_counts(withdrawn), "rolls_back_hosts"),
        (withdrawal_cancels(withdrawn), "cancels_tasks"),
        (unstarted_installs_counts(withdrawn), "stops_installs"),
    ):
        for version_id, n in counts.items():
            setattr(foreseen[version_id], name, n)
    for version in ComponentVersion.objects.filter(pk__in=list(withdrawn)).select_related("component"):
        each = foreseen[version.pk]
        for fallen in upgrades_fallen_back(version, planned=planned):
            (each.fallen_back_alerts if fallen.not_reopened else each.reopens).append(fallen.upgrade.pk)
        for resubmission in resubmissions_foreseen(version, planned=planned):
            each.resubmits_operations += len(resubmission.requests)
            each.resubmits_hosts += sum(len(hosts) for hosts in resubmission.requests)
            each.resubmission_refused_hosts += sum(len(group.host_ids) for group in resubmission.refused)
    for version_id, change in withdrawn.items():
        change.withdrawal = asdict(foreseen[version_id])
        change.note = foreseen[version_id].note()


def planned_withdrawals(plan: FleetPlan) -> PlannedWithdrawals:
    """The live versions the plan withdraws (with the file's reason) and releases."""
    updated = plan.of("version", "update")
    changed = [(change, change.fields["withdrawn"]) for change in updated if "withdrawn" in change.fields]
    return PlannedWithdrawals(
        withdrawn={change.live.id: change.spec[1].withdrawn_reason for change, (_, after) in changed if after},
        released=frozenset(change.live.id for change, (_, after) in changed if not after),
    )
