"""Offboarding a failing upgrade: its pending work cancelled, its version withdrawn and rolled
back, the completed upgrades that some hosts reached only through it made active again, and the
ad-hoc work it superseded on hosts its rollback takes below asked for again (re-onboarding, asked and
approved, is trains/services/reonboarding.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef

from fleet.models import ComponentVersion, InstalledVersion, Pool, WithdrawnBy
from opsplanner import clock
from opsplanner.events import Actor, event_record
from opsplanner.models import Event, HostTask, Operation, OperationState, TaskState
from opsplanner.services.operation_cancel import operations_cancel
from opsplanner.services.resubmission import superseded_work_resubmit
from opsplanner.services.rollback import (
    AS_THEY_ARE,
    PlannedWithdrawals,
    StoppedInstalls,
    VersionRollback,
    going_back_below,
    installs_stop,
    stopped_operations_open,
    version_rollback,
)
from trains.models import Upgrade, UpgradePhase, UpgradeState
from trains.services.upgrade_scopes import upgrade_scope_hosts
from trains.services.upgrades import upgrade_tasks


def upgrade_offboard(*, upgrade: Upgrade, reason: str, actor: Actor = "scheduler", roll_back: bool = True) -> bool:
    """Remove a failing upgrade from every train: its pending work is cancelled, its version is
    withdrawn (no host returns running it: repairs roll it back; its installs no executor claimed
    yet are stopped, and their operations of this pool cancelled), hosts that may serve with it
    (back in service, past the pre-return gate, draining) get a rollback operation, and completed
    upgrades that some hosts reached only through it are active again, and ad-hoc work it
    superseded is asked for again (fallen_back_restore, which reads the version in every pool).
    Not `roll_back` (the rollback and what it takes below, both of every pool) when a withdrawal
    offboarding the version's upgrades in several pools had it done with the first
    (`versions_withdrawal_apply`): it would repeat that one's refusals and alerts; its event then
    lists no rollback, nothing reopened or resubmitted (the first's lists them). Runs in the caller's
    transaction; whether it offboarded the upgrade (False: it was no longer active)."""
    now = clock.now()
    # The pool's tick lock, then the version's row, then the upgrade's: the order of the train tick
    # (which holds the pool while it writes its upgrades) and of a withdrawal. Its pending work's
    # cancellation takes the pool after the upgrade's row otherwise, and the version's row was
    # taken after the upgrade's: each way it deadlocked with a tick or an operator's withdrawal.
    Pool.objects.select_for_update(no_key=True).filter(pk=upgrade.pool_id).values_list("pk").first()
    # A full lock: it waits for a tick that recorded hosts running the version (a key share) to
    # commit, so the rollback below sees them (installs_stop waits but a moment for its rows).
    ComponentVersion.objects.select_for_update().filter(pk=upgrade.component_version_id).values_list("pk").first()
    if not Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.ACTIVE).update(
        state=UpgradeState.OFFBOARDED, state_reason=reason[:500], finished_at=now
    ):
        return False
    upgrade.state, upgrade.state_reason = UpgradeState.OFFBOARDED, reason[:500]
    target = upgrade.component_version
    # An operator's or the fleet file's withdrawal keeps its reason, and stays theirs to release.
    if target.withdrawn_by in (WithdrawnBy.NOT_WITHDRAWN, WithdrawnBy.OFFBOARDING):
        target.withdrawn_at = now
        target.withdrawn_reason = f"upgrade #{upgrade.pk} offboarded: {reason}"[:500]
        target.withdrawn_by = WithdrawnBy.OFFBOARDING
        target.save(update_fields=["withdrawn_at", "withdrawn_reason", "withdrawn_by"])
    # Withdrawn now: no host installs it from here on, not even one whose install is queued.
    stopped = installs_stop(version_ids=[target.pk], reason=f"upgrade #{upgrade.pk} offboarded", actor=actor)
    cancelled = _offboarded_work_cancel(upgrade, stopped, actor=actor)
    rollback, fallen_back = (
        _version_roll_back(upgrade, actor=actor) if roll_back else (VersionRollback([], 0), FallenBack([], []))
    )
    _offboarded_record(
        upgrade,
        reason,
        data={
            "cancelled_tasks": cancelled[True],
            "other_tasks_cancelled": cancelled[False],  # of other operations whose installs were stopped
            "installs_stopped": stopped.installs,
            "rollbacks": rollback.operations,
            "reopened": fallen_back.reopened,
            "resubmitted": fallen_back.resubmitted,
        },
        actor=actor,
    )
    return True


def _version_roll_back(upgrade: Upgrade, *, actor: Actor) -> tuple[VersionRollback, FallenBack]:
    """Roll back the offboarded upgrade's version on every host that may serve with it, in every
    pool, and ask again for what that takes below (fallen_back_restore)."""
    target = upgrade.component_version
    rollback = version_rollback(
        version=target,
        scope=f"upgrade #{upgrade.pk}",
        reason=f"roll back withdrawn {target} (upgrade #{upgrade.pk} offboarded)",
        actor=actor,
        subject=upgrade,
        refused_kind="upgrade.rollback_refused",
    )
    why = f"withdrawn as upgrade #{upgrade.pk} was offboarded"
    return rollback, fallen_back_restore(withdrawn=target, why=why, offboarded=upgrade.pk, actor=actor)


def _offboarded_record(upgrade: Upgrade, reason: str, *, data: dict[str, Any], actor: Actor) -> None:
    """Its `upgrade.offboarded` event (what the offboarding did, `data`, and the hosts its tasks
    failed on) and its alert."""
    failed_hosts = list(
        upgrade_tasks(upgrade).filter(state=TaskState.FAILED).values_list("host_id", flat=True).distinct()
    )
    event_record(
        kind="upgrade.offboarded",
        subject=upgrade,
        actor=actor,
        reason=reason,
        pool_id=upgrade.pool_id,
        data={**data, "failed_hosts": failed_hosts},
    )
    event_record(
        kind="alert.upgrade_offboarded",
        subject=upgrade,
        actor=actor,
        reason=f"{upgrade.component_version} offboarded: {reason}; failed hosts went to repair, "
        "re-onboarding needs an approval",
        pool_id=upgrade.pool_id,
    )


def _offboarded_work_cancel(upgrade: Upgrade, stopped: StoppedInstalls, *, actor: Actor) -> Counter[bool]:
    """Cancel its visits' operations with work pending, and the operations of this pool whose
    installs were stopped (an ad-hoc one to the version too), as a withdrawal cancels them: their
    installs there ran nothing. In id order; the pending tasks cancelled, counted by whether the
    operation was its own."""
    with_pending = HostTask.objects.filter(operation=OuterRef("pk"), state=TaskState.PENDING)
    open_ops = Operation.objects.filter(visit_link__upgrade=upgrade, state=OperationState.OPEN).filter(
        Exists(with_pending)
    )
    own = set(open_ops.values_list("id", flat=True))
    cancelled = Counter[bool]()
    for pk, n in operations_cancel(
        operation_ids=own | stopped_operations_open(stopped, only_pool=upgrade.pool_id),
        reason=f"upgrade #{upgrade.pk} offboarded",
        actor=actor,
        within_pool=upgrade.pool_id,
    ).items():
        cancelled[pk in own] += n
    return cancelled


class FallenBack(NamedTuple):
    """What a withdrawal asked for again (`fallen_back_restore`)."""

    reopened: list[int]  # completed upgrades made active again
    resubmitted: list[int]  # ad-hoc operations submitted again (opsplanner.services.resubmission)


def fallen_back_restore(
    *, withdrawn: ComponentVersion, why: str, offboarded: int | None = None, actor: Actor
) -> FallenBack:
    """Ask again for what the withdrawn version's rollback takes hosts below: the completed upgrades
    they reached only through it (upgrades_fallen_back_reopen), and the ad-hoc upgrades it superseded
    (superseded_work_resubmit). The one place both ways of withdrawing call (an offboarding, and an
    operator's or the fleet file's withdrawal of a version no upgrade offboarded), in their
    transaction, after their rollback. `why` the version was withdrawn."""
    return FallenBack(
        reopened=upgrades_fallen_back_reopen(withdrawn=withdrawn, why=why, offboarded=offboarded, actor=actor),
        resubmitted=superseded_work_resubmit(withdrawn=withdrawn, why=why, actor=actor),
    )


class FallenBackUpgrade(NamedTuple):
    """A completed upgrade some hosts of whose scope the withdrawn version's rollback takes below its
    target (`upgrades_fallen_back`)."""

    upgrade: Upgrade
    hosts: list[int]
    not_reopened: str  # why it stays completed, an alert saying so ("" when it is made active again)
    alerted: bool = False  # an alert named these hosts for this version since it completed: not again

    @property
    def alert(self) -> bool:
        """Whether its withdrawal raises `alert.upgrade_fallen_back` (the apply and the plan both ask)."""
        return bool(self.not_reopened) and not self.alerted


def upgrades_fallen_back(
    withdrawn: ComponentVersion, *, planned: PlannedWithdrawals = AS_THEY_ARE
) -> list[FallenBackUpgrade]:
    """The completed upgrades to an older release of the withdrawn version's component that some host
    of their scope reached only through it ("all hosts run 2.16.0 or newer" with 2.17.0), in id
    order: its rollback takes them below their target, and a completed upgrade the train no longer
    looks at left them there. Each is made active again but an emergency one (its train has finished)
    or one whose own target is withdrawn too (by the same fleet file apply, say): no train takes them
    up again. Reads only: `upgrades_fallen_back_reopen` acts on it, a fleet file's plan counts it
    (`planned`: the versions as the file will have them, and the upgrades its earlier withdrawals
    reopen, no longer completed)."""
    running = InstalledVersion.objects.filter(version=withdrawn, host__pool_id=OuterRef("pool_id"))
    candidates = Upgrade.objects.filter(
        Exists(running.filter(going_back_below(OuterRef("component_version__sort_key"), planned=planned))),
        state=UpgradeState.COMPLETED,
        component_version__component_id=withdrawn.component_id,
        component_version__sort_key__lt=withdrawn.sort_key,
    ).select_related("pool", "component_version__component")
    if planned.reopened:  # active again by then: an earlier withdrawal of the same apply reopened them
        candidates = candidates.exclude(pk__in=sorted(planned.reopened))
    found = []
    for upgrade in candidates.order_by("pk"):
        try:
            scope = upgrade_scope_hosts(upgrade)
        except ValidationError:  # a name its scope used is gone: what it covers cannot be told
            continue
        fallen = sorted(
            InstalledVersion.objects.filter(going_back_below(upgrade.component_version.sort_key, planned=planned))
            .filter(version=withdrawn, host_id__any=scope)
            .values_list("host_id", flat=True)
        )
        if not fallen:
            continue
        target_withdrawn = planned.refusal(upgrade.component_version)
        if target_withdrawn is not None:
            not_reopened = f"{target_withdrawn.message}: not made active again"
        else:
            not_reopened = "request another emergency train if still urgent" if upgrade.emergency else ""
        found.append(FallenBackUpgrade(upgrade, fallen, not_reopened))
    alerted = _fallen_back_alerted(withdrawn, [f for f in found if f.not_reopened])
    return [f._replace(alerted=f.upgrade.pk in alerted) for f in found]


def _fallen_back_alerted(withdrawn: ComponentVersion, fallen: list[FallenBackUpgrade]) -> set[int]:
    """Those an `alert.upgrade_fallen_back` for this withdrawn version (by id) already names since they
    last completed, with every host now falling back: a later withdrawal of it (an offboarding in
    another pool) says it not again. One with a host no alert named (reached the version again after
    a release, say) is alerted for again; so is one of over 100 hosts, which an alert names in part."""
    if not fallen:
        return set()
    by_pk = {f.upgrade.pk: f for f in fallen}
    alerts = Event.objects.filter(
        kind="alert.upgrade_fallen_back",
        subject_type=Upgrade._meta.label_lower,
        subject_id__in=list(by_pk),
        data__withdrawn_id=withdrawn.pk,
    ).values_list("subject_id", "created_at", "data__hosts")
    return {
        pk
        for pk, at, hosts in alerts
        if pk is not None and at >= (by_pk[pk].upgrade.finished_at or at) and set(by_pk[pk].hosts) <= set(hosts or ())
    }


def upgrades_fallen_back_reopen(
    *, withdrawn: ComponentVersion, why: str, offboarded: int | None = None, actor: Actor
) -> list[int]:
    """Make active again the completed upgrades the withdrawn version's rollback takes hosts below
    (`upgrades_fallen_back`); an alert for those it may not. `why` the version was withdrawn (and
    the upgrade `offboarded` for it, if one was). Runs in the withdrawal's transaction (an
    offboarding's, or an operator's or the fleet file's); the ids made active."""
    return [
        fallen.upgrade.pk
        for fallen in upgrades_fallen_back(withdrawn)
        if _fallen_back_record(fallen, withdrawn, why=why, offboarded=offboarded, actor=actor)
    ]


def _fallen_back_record(
    fallen: FallenBackUpgrade, withdrawn: ComponentVersion, *, why: str, offboarded: int | None, actor: Actor
) -> bool:
    """Active again (guarded: only from completed), with an event saying why, or the alert saying why
    not; whether it was."""
    upgrade = fallen.upgrade
    why = (
        f"{len(fallen.hosts)} hosts of its scope reached {upgrade.component_version} only through {withdrawn}, "
        f"{why}: its rollback takes them below it"
    )
    data = {
        "withdrawn": str(withdrawn),
        "withdrawn_id": withdrawn.pk,
        "offboarded": offboarded,
        "hosts": fallen.hosts[:100],
    }
    if fallen.not_reopened:
        if not fallen.alert:
            return False
        said = f"{'emergency ' if upgrade.emergency else ''}{upgrade} completed, but {why}; {fallen.not_reopened}"
        event_record(
            kind="alert.upgrade_fallen_back",
            subject=upgrade,
            actor=actor,
            reason=said[:500],
            pool_id=upgrade.pool_id,
            data=data,
        )
        return False
    reason = f"active again: {why}"[:500]
    if not Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.COMPLETED).update(
        state=UpgradeState.ACTIVE, state_reason=reason, finished_at=None
    ):
        return False
    # Judged afresh, as a re-onboarded phase is: until their rollback, its hosts on the withdrawn
    # version are no successes, and its old failures against those few could offboard it.
    UpgradePhase.objects.filter(upgrade=upgrade, position=upgrade.current_phase).update(started_at=clock.now())
    event_record(
        kind="upgrade.reopened", subject=upgrade, actor=actor, reason=reason, pool_id=upgrade.pool_id, data=data
    )
    return True
