"""A host repaired during its visit catches up in the same drain.

When a host fails during a visit, the core sends it to repair and leaves its other train work to the
next cycle (one drain per host per cycle). At 0.5% failed installs nearly every rollout of a large
pool then waited a whole cycle for its last few hosts (BENCHMARKS.md, "What failures cost the trains'
rollouts"). So while such a host is being repaired, its train re-submits, for that host alone, the
visit's upgrades it missed (the one that failed and those the failure deferred), linked to the visit
as catch-up operations. When the repair is applied, the core hands the host over to them in the same
drain if the pool has room for one more host out for planned work, or returns the host and leaves
them to the next cycle (opsplanner/services/tick/repair.py).

A host catches up once per visit. The operations count for their upgrade's phase (successes and
failures), but the visit does not wait for them: it ends on time, and its measured length (which
sizes the next visits) is not stretched by a repair. A sliding train counts the host as out, so
it releases no more hosts than its allowance.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import NamedTuple

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef

from fleet.models import HostState, Pool
from opsplanner.events import event_record
from opsplanner.models import OPEN_TASK_STATES, HostTask, OperationKind, TaskState
from trains.models import Train, Visit, VisitState
from trains.selectors_missed import MISSED_TASK
from trains.services.actor import ACTOR
from trains.services.pace import ActiveUpgrade, sliding_allowance, train_hosts_out, train_slides
from trains.services.visits import Step, UpgradePlan, visit_steps_submit

CAUGHT_UP_KEY = "caught_up"  # a visit's plan: the hosts that caught up in it


class _Missed(NamedTuple):
    """An upgrade of a visit a repaired host did not get: its phase and per-host work."""

    upgrade_id: int
    phase: int
    work_s: int


def _repaired_now(running: list[Visit]) -> dict[int, set[int]]:
    """{visit: hosts} whose task of the visit failed and that are being repaired in that drain, not
    caught up in the visit yet (one query)."""
    repairing = HostTask.objects.filter(
        host_id=OuterRef("host_id"),
        drain_key=OuterRef("drain_key"),
        operation__kind=OperationKind.REPAIR,
        state=TaskState.RUNNING,
    )
    rows = (
        HostTask.objects.filter(
            operation__visit_link__visit_id__in=[v.pk for v in running],
            state=TaskState.FAILED,
            host__state=HostState.REPAIR,
        )
        .filter(Exists(repairing))
        .values_list("operation__visit_link__visit_id", "host_id")
    )
    done = {v.pk: set(v.plan.get(CAUGHT_UP_KEY, [])) for v in running}
    found: dict[int, set[int]] = defaultdict(set)
    for visit_id, host_id in rows:
        if host_id not in done[visit_id]:
            found[visit_id].add(host_id)
    return found


def _missed(visit_hosts: Mapping[int, set[int]]) -> dict[tuple[int, int], list[_Missed]]:
    """{(visit, host): the visit's upgrades that left the host below their target (failed before or
    while installing, or deferred: trains.selectors_missed.MISSED_TASK) and that it did not get
    since. An upgrade whose check failed after the install is not missed: the host runs it."""
    hosts = {h for hs in visit_hosts.values() for h in hs}
    rows = (
        HostTask.objects.filter(operation__visit_link__visit_id__in=list(visit_hosts), host_id__in=hosts)
        .annotate(missed=ExpressionWrapper(MISSED_TASK, output_field=BooleanField()))
        .values_list(
            "operation__visit_link__visit_id",
            "host_id",
            "operation__visit_link__upgrade_id",
            "operation__visit_link__phase",
            "operation__estimated_duration_s",
            "state",
            "missed",
        )
    )
    missed: dict[tuple[int, int], dict[int, _Missed]] = defaultdict(dict)
    got: set[tuple[int, int, int]] = set()
    for visit_id, host_id, upgrade_id, phase, work_s, state, below_target in rows:
        if host_id not in visit_hosts[visit_id]:
            continue
        if below_target:
            missed[(visit_id, host_id)][upgrade_id] = _Missed(upgrade_id, phase, work_s)
        elif state in OPEN_TASK_STATES or state in (TaskState.DONE, TaskState.HANDED_OVER):
            got.add((visit_id, host_id, upgrade_id))
    return {
        key: [m for upgrade_id, m in sorted(by_upgrade.items()) if (*key, upgrade_id) not in got]
        for key, by_upgrade in missed.items()
    }


def visits_catch_up(
    *, train: Train, running: list[Visit], active: Mapping[int, ActiveUpgrade]
) -> list[tuple[int, int]]:
    """Re-submit, for each host being repaired in a running visit's drain, the visit's upgrades it
    missed that are still active; (visit, host) for each host that will catch up. Holds the pool row
    meanwhile, like a late join: a pool tick that holds it defers this to the next train tick, so a
    repair is never applied between the check and the write."""
    if not _repaired_now(running):  # the usual tick: nobody to catch up, and no lock taken
        return []
    if Pool.objects.select_for_update(no_key=True, skip_locked=True).filter(pk=train.pool_id).first() is None:
        return []
    # Read again under the lock: a pool tick that committed after the first read may have applied a
    # repair and sent the host to its checks; work submitted for it then opened a second drain.
    found = _repaired_now(running)
    if not found:
        return []
    room = sliding_allowance(train) - train_hosts_out(train) if train_slides(train) else None
    missed = _missed(found)
    caught: list[tuple[int, int]] = []
    for visit in running:
        hosts = sorted(found.get(visit.pk, ()))
        steps: dict[int, Step] = {}
        taken: list[int] = []
        for host_id in hosts:
            work = [m for m in missed.get((visit.pk, host_id), []) if m.upgrade_id in active]
            if not work or (room is not None and room <= 0):
                continue
            if room is not None:
                room -= 1
            taken.append(host_id)
            for m in work:
                known = active[m.upgrade_id]
                plan = UpgradePlan(upgrade=known.upgrade, phase=known.phases[m.phase], allowed=set())
                steps.setdefault(m.upgrade_id, Step(plan=plan, hosts=set(), work_s=m.work_s)).hosts.add(host_id)
        if taken and _record(train, visit, taken, list(steps.values())):
            caught += [(visit.pk, host_id) for host_id in taken]
    return caught


def _record(train: Train, visit: Visit, hosts: list[int], steps: list[Step]) -> bool:
    """Submit the catch-up and record its hosts on the visit (once per host); whether it was
    submitted. A submission the core refuses (a target that became incompatible or was withdrawn
    meanwhile) writes nothing but the record and an event saying why: the hosts return as they
    would have, their work is the next cycle's."""
    plan_record = {**visit.plan, CAUGHT_UP_KEY: sorted({*visit.plan.get(CAUGHT_UP_KEY, []), *hosts})}
    if not Visit.objects.filter(pk=visit.pk, state=VisitState.RUNNING).update(plan=plan_record):
        return False
    visit.plan = plan_record
    data = {"train": train.pk, "cycle": visit.cycle_id, "hosts": hosts,
            "upgrades": sorted(s.plan.upgrade.pk for s in steps)}  # fmt: skip
    try:
        with transaction.atomic():
            visit_steps_submit(train, visit, steps, joined=False, catch_up=True)
    except ValidationError as refusal:
        why = "; ".join(refusal.messages)
        event_record(
            kind="train.visit_catch_up_refused",
            subject=visit,
            actor=ACTOR,
            pool_id=train.pool_id,
            reason=f"{len(hosts)} hosts being repaired return without their missed work: {why}"[:500],
            data=data,
        )
        return False
    event_record(
        kind="train.visit_catch_up",
        subject=visit,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=f"{len(hosts)} hosts being repaired in the visit's drain may take the {len(steps)} upgrades they "
        "missed before they return, if the pool has room for planned work then",
        data=data,
    )
    return True
