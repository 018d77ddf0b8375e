"""One more try in the same drain. A host whose upgrade failed during a visit goes to repair without
returning to service; repaired and verified, it takes up the train work still pending for it in that
drain (opsplanner/services/tick/repair.py::resume_after_repair). The train adds the upgrade that
failed to that work, once per visit, host and upgrade, while the host is still under repair and the
visit's budget still has the time. Without it a failure left the upgrade's rollout a whole cycle
short, and nearly every rollout over hundreds of hosts meets one (0.5% of hosts in the meta regime).
"""

from __future__ import annotations

import datetime as dt
from itertools import groupby
from typing import NamedTuple

from fleet.models import HostState, Pool
from opsplanner.events import event_record
from opsplanner.models import HostTask, TaskState
from opsplanner.models.operations import FailureCode
from trains.models import Train, Upgrade, UpgradePhase, Visit, VisitState
from trains.services.budget import VisitSizing, train_sizing
from trains.services.visits import ACTOR, Step, UpgradePlan, visit_step_submit

# An upgrade whose execute failed is worth another try on the repaired host; one that was applied
# but failed its checks left its version installed (the host returns with it).
RETRIED_FAILURES = [FailureCode.EXECUTE_FAILED]
UNDER_REPAIR = [HostState.FAILED, HostState.REPAIR]


class RetryCandidate(NamedTuple):
    visit_id: int
    upgrade_id: int
    host_id: int


def retry_candidates(running: list[Visit]) -> list[RetryCandidate]:
    """The upgrades of the running visits whose execute failed on a host still under repair, not
    retried in that visit yet (one query; none without running visits)."""
    if not running:
        return []
    retried = {visit.pk: {tuple(pair) for pair in visit.plan.get("retried", [])} for visit in running}
    rows = (
        HostTask.objects.filter(
            operation__visit_link__visit__in=running,
            state=TaskState.FAILED,
            failure_code__in=RETRIED_FAILURES,
            host__state__in=UNDER_REPAIR,
        )
        .order_by("operation__visit_link__visit_id", "host_id", "id")
        .values_list("operation__visit_link__visit_id", "operation__visit_link__upgrade_id", "host_id")
        .distinct()
    )
    return [RetryCandidate(*row) for row in rows if (row[1], row[2]) not in retried[row[0]]]


def visits_retry_failed(
    *,
    train: Train,
    running: list[Visit],
    active: dict[int, tuple[Upgrade, UpgradePhase]],
    now: dt.datetime,
) -> list[RetryCandidate]:
    """Give each candidate its retry: a one-host operation of the visit, pending until the repair
    hands the host over. Holds the pool row meanwhile and reads the candidates under it, so no pool
    tick returns the host between the read and the write (when a pool tick holds the row, the retries
    wait for the next train tick). `active`: the train's upgrades still running, with their phase."""
    if not retry_candidates(running):
        return []
    if Pool.objects.select_for_update(no_key=True, skip_locked=True).filter(pk=train.pool_id).first() is None:
        return []
    by_id, sizing = {visit.pk: visit for visit in running}, train_sizing(train)
    retried: list[RetryCandidate] = []
    for visit_id, group in groupby(retry_candidates(running), key=lambda c: c.visit_id):
        retried += _retry_in_visit(train, by_id[visit_id], list(group), active, sizing, now)
    return retried


def _retry_in_visit(
    train: Train,
    visit: Visit,
    candidates: list[RetryCandidate],
    active: dict[int, tuple[Upgrade, UpgradePhase]],
    sizing: VisitSizing,
    now: dt.datetime,
) -> list[RetryCandidate]:
    plan_record = dict(visit.plan)
    budget = float(plan_record.get("budget_s", sizing.budget_s))
    elapsed = (now - visit.started_at).total_seconds() if visit.started_at else 0.0
    done: list[RetryCandidate] = []
    for candidate in candidates:
        if candidate.upgrade_id not in active:
            continue  # offboarded or complete since
        upgrade, phase = active[candidate.upgrade_id]
        work = sizing.work_s(upgrade)
        # The retry follows the repair and its checks, and the host's return ends it: an overhead
        # more than the work (retries timed on the work alone made cycles overrun before the
        # correction was measured)
        if elapsed + sizing.factor * (sizing.overhead_s + work) > budget:
            continue  # no time left in the visit: the next cycle takes the host again
        step = Step(plan=UpgradePlan(upgrade=upgrade, phase=phase, allowed={candidate.host_id}),
                    hosts={candidate.host_id}, work_s=work)  # fmt: skip
        visit_step_submit(train, visit, step, joined=True, retry=True)
        done.append(candidate)
        event_record(
            kind="train.visit_retry",
            subject=visit,
            actor=ACTOR,
            pool_id=train.pool_id,
            reason=f"upgrade #{upgrade.pk} ({upgrade.component_version}) failed on a host now under repair: "
            "retried once there, in the same drain, after the repair",
            data={"train": train.pk, "cycle": visit.cycle_id, "upgrade": upgrade.pk, "host": candidate.host_id},
        )
    if done:
        plan_record["retried"] = [*plan_record.get("retried", []), *([c.upgrade_id, c.host_id] for c in done)]
        Visit.objects.filter(pk=visit.pk, state=VisitState.RUNNING).update(plan=plan_record)
        visit.plan = plan_record
    return done
