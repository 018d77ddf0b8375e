"""Starting a visit and letting late upgrades join it.

A visit takes, within its budget (trains/services/budget.py), the pending upgrades of its domain in
(priority, deadline, age) order; per component only the newest pending upgrade is applied to a host
(an older one counts the host as superseded there, not pending), and the newest takes the best place
in the queue of the upgrades it supersedes; a multi-cycle one takes at most its hosts_per_visit
(where it fits the budget first), the older ones the hosts it leaves. An upgrade created while a
visit runs joins the visit's hosts that are still drained or not yet started, in the same drain,
where it fits the budget, chosen the same way.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field, replace

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import FAILURE_OUT_STATES, Host, HostState, Pool
from fleet.selectors.compatibility import PlannedHosts
from opsplanner.events import event_record
from opsplanner.models import Event, HostTask, OperationKind, OperationSource, TaskState
from opsplanner.models.operations import WaitingCode
from opsplanner.refusals import refusal_codes
from opsplanner.services.compatibility import Refusal, targets_refusals
from opsplanner.services.operations import OperationRequest, operations_submit
from trains.models import Train, Upgrade, UpgradePhase, Visit, VisitOperation, VisitState
from trains.services.actor import ACTOR
from trains.services.budget import Selection, VisitSizing, steps_cost_s, upgrade_order_key
from trains.services.emergency import emergency_incompatible
from trains.services.places import bound_rank, select_ranked, visit_bound, within_hosts_per_visit
from trains.services.upgrades import hosts_below_target, upgrades_hosts_below

# A host whose visit task is in one of these is still drained for the visit (or not yet started):
# a task pending for it is handed over in the same drain. Verifying hosts are on their way back.
JOINABLE_TASK_STATES = [TaskState.PENDING, TaskState.ADMITTED, TaskState.DRAINING, TaskState.RUNNING]


@dataclass
class UpgradePlan:
    """Per active upgrade: the hosts its current phase allows; which of them still need it is
    asked of the database only where it matters (a domain being visited, a cycle to open)."""

    upgrade: Upgrade
    phase: UpgradePhase
    allowed: set[int]
    _has_pending: bool | None = None

    def has_pending(self) -> bool:
        """Whether a cycle opened now could give this upgrade to a host: one below its target that is
        not out broken. A host failed, in repair or escalated (waiting for a person, often for days)
        cannot be taken by a visit: pending only there, the train opened a cycle that took nothing,
        then another every IDLE_AFTER_EMPTY_CYCLE; now the next tick after the host is back opens one."""
        if self._has_pending is None:
            below = hosts_below_target(self.upgrade, self.allowed)
            self._has_pending = below.exclude(state__in=sorted(FAILURE_OUT_STATES)).exists()
        return self._has_pending


@dataclass
class Step:
    """One upgrade on some hosts of a visit; `superseded` names the hosts an older upgrade of the
    same component would have taken that get this one directly."""

    plan: UpgradePlan
    hosts: set[int]
    work_s: int
    superseded: dict[int, set[int]] = field(default_factory=dict)  # older upgrade id -> its hosts


def _sort_key(upgrade: Upgrade) -> str:
    return upgrade.component_version.sort_key


def domain_selection(plans: list[UpgradePlan], host_ids: set[int], sizing: VisitSizing) -> Selection:
    """What a visit starting over `host_ids` takes within its budget (`_ranked_selection`)."""
    return _ranked_selection(_pending(plans, host_ids), host_ids, sizing)


def _ranked_selection(
    pending: list[tuple[UpgradePlan, set[int]]],
    host_ids: set[int],
    sizing: VisitSizing,
    running: dict[int, float] | None = None,
) -> Selection:
    """domain_steps, then select_within_budget (beside the `running` visit's work, for late
    joiners). A multi-cycle upgrade's hosts_per_visit places go to hosts where it fits the budget:
    chosen before the budget, they went to the first hosts by id, and where an upgrade ahead of it
    had filled a host's share the budget dropped it there and the place went unused, though it
    fitted on the domain's other hosts (trains/services/places.py: select_ranked; no query)."""
    failed = _hosts_failed_beyond_bound(pending)
    return select_ranked(
        lambda unfit: domain_steps(pending, failed, sizing, unfit),
        sizing=sizing,
        hosts_of=lambda s: s.hosts,
        work_of=lambda s: s.work_s,
        restrict=_restricted,
        upgrade_of=lambda s: s.plan.upgrade,
        places_of=lambda s: host_ids if visit_bound(s.plan.upgrade) else None,
        running=running,
    )


def _pending(plans: list[UpgradePlan], host_ids: set[int]) -> list[tuple[UpgradePlan, set[int]]]:
    """Per plan, its hosts among `host_ids` below its target that its phase allows (one query)."""
    below = upgrades_hosts_below([plan.upgrade for plan in plans], set().union(*(p.allowed for p in plans)) & host_ids)
    return [(plan, below[plan.upgrade.pk] & plan.allowed) for plan in plans]


def domain_steps(
    pending: list[tuple[UpgradePlan, set[int]]],
    failed: dict[int, set[int]],
    sizing: VisitSizing,
    unfit: dict[int, set[int]] | None = None,
) -> list[Step]:
    """The `pending` work (_pending), one step per upgrade, newest version per component and host,
    in the order a visit takes them (a newer release inherits the best place it supersedes; no
    query). A multi-cycle upgrade takes at most its hosts_per_visit hosts (`failed`: the hosts that
    failed it; `unfit`: those where it does not fit the visit's budget, _ranked_selection; both
    ranked last); an older release of its component takes the hosts it leaves this visit (else they
    would run neither for as many cycles as the newer one needs to reach them)."""
    unfit = unfit or {}
    by_component: dict[int, list[tuple[UpgradePlan, set[int]]]] = defaultdict(list)
    for plan, hosts in pending:
        if hosts:
            by_component[plan.upgrade.component_version.component_id].append((plan, hosts))
    steps: list[tuple[tuple, Step]] = []
    for entries in by_component.values():
        entries.sort(key=lambda e: _sort_key(e[0].upgrade), reverse=True)  # newest first
        claimed: dict[int, int] = {}  # host -> the newer upgrade that takes it
        for i, (plan, hosts) in enumerate(entries):
            upgrade_id = plan.upgrade.pk
            olders = [its_hosts for _, its_hosts in entries[i + 1 :]]  # their pending hosts
            rank = bound_rank(unfit.get(upgrade_id, set()), failed.get(upgrade_id, set()), olders)
            own = within_hosts_per_visit(plan.upgrade, hosts - claimed.keys(), rank)
            step = Step(plan=plan, hosts=own, work_s=sizing.work_s(plan.upgrade))
            for host in own:
                claimed[host] = upgrade_id
            if own:
                steps.append((upgrade_order_key(plan.upgrade), step))
            superseded_by: dict[int, set[int]] = defaultdict(set)
            for host in hosts & claimed.keys() - own:
                superseded_by[claimed[host]].add(host)
            for newer_id, its_hosts in superseded_by.items():
                newer = next(s for _, s in steps if s.plan.upgrade.pk == newer_id)
                newer.superseded[upgrade_id] = its_hosts
    # A newer release takes the best queue place of what it supersedes.
    keys = {id(step): key for key, step in steps}
    for _, step in steps:
        for older in (p for p, _ in pending if p.upgrade.pk in step.superseded):
            keys[id(step)] = min(keys[id(step)], upgrade_order_key(older.upgrade))
    return [step for _, step in sorted(steps, key=lambda ks: keys[id(ks[1])])]


def _restricted(step: Step, hosts: set[int]) -> Step:
    """The step on some of its hosts (those where it fits the budget): it supersedes the older
    releases on those only."""
    superseded = {older: narrowed for older, its_hosts in step.superseded.items() if (narrowed := its_hosts & hosts)}
    return replace(step, hosts=hosts, superseded=superseded)


def visit_start(
    *,
    train: Train,
    visit: Visit,
    plans: list[UpgradePlan],
    sizing: VisitSizing,
    now: dt.datetime,
    release: int | None = None,
) -> Selection | None:
    """Record the plan, create one operation per upgrade taken over the domain's hosts; what the
    visit took and left (taken empty: nothing to do there), or None when another tick started it.
    A sliding train (`release`, trains/services/pace.py) hands only the first `release` hosts to the
    core now; the plan keeps the others ("unreleased") for the ticks to come."""
    in_service = set(
        Host.objects.filter(domain_id=visit.domain_id, state=HostState.IN_SERVICE).values_list("id", flat=True)
    )
    incompatible = _emergency_incompatible(plans, in_service) if train.emergency else {}
    if incompatible:  # its other hosts still get the fix (the core refuses a step on any host it breaks)
        plans = [replace(p, allowed=p.allowed - incompatible.get(p.upgrade.pk, {}).keys()) for p in plans]
    selection = domain_selection(plans, in_service, sizing)
    taken: list[Step] = selection.taken
    plan_record = _plan_record(selection, sizing)
    plan_record[CONSIDERED_KEY] = sorted({p.upgrade.pk for p in plans})
    submit = taken
    if release is not None:
        now_hosts, plan_record["unreleased"] = split_release(taken, release)
        plan_record["released"] = len(now_hosts)
        submit = [replace(s, hosts=s.hosts & now_hosts) for s in taken if s.hosts & now_hosts]
    if not Visit.objects.filter(pk=visit.pk, state=VisitState.PLANNED).update(
        state=VisitState.RUNNING, started_at=now, skip_reason="", plan=plan_record
    ):
        return None
    visit.state, visit.started_at, visit.train, visit.plan = VisitState.RUNNING, now, train, plan_record
    for upgrade_id, hosts in incompatible.items():
        _hosts_refused(train, visit, next(p.upgrade for p in plans if p.upgrade.pk == upgrade_id), hosts)
    if submit:  # a target now incompatible is left out (with an event); the visit goes on with the rest
        refused = visit_steps_submit_compatible(train, visit, submit, joined=False)
        visit_plan_record_refused(visit, refused, cost=_cost_without(taken, refused, sizing))
    event_record(
        kind="train.visit_started",
        subject=visit,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=_start_reason(train, selection, sizing),
        data={"train": train.pk, "domain": visit.domain.name, "cycle": visit.cycle_id, "emergency": train.emergency,
              "hosts": sum(len(s.hosts) for s in taken), "upgrades": [s.plan.upgrade.pk for s in taken],
              "left": [s.plan.upgrade.pk for s in selection.left], "budget_s": round(sizing.budget_s),
              "cost_s": round(selection.cost_s)},
    )  # fmt: skip
    return selection


def _hosts_failed_beyond_bound(pending: list[tuple[UpgradePlan, set[int]]]) -> dict[int, set[int]]:
    """{upgrade: its pending hosts that failed one of its tasks}, for the multi-cycle upgrades with
    more hosts pending than they take in a visit (one query; none without such upgrades)."""
    over = {plan.upgrade.pk: hosts for plan, hosts in pending if len(hosts) > (visit_bound(plan.upgrade) or len(hosts))}
    if not over:
        return {}
    rows = (
        HostTask.objects.filter(
            operation__visit_link__upgrade_id__in=over,
            state=TaskState.FAILED,
            host_id__in=set().union(*over.values()),
        )
        .values_list("operation__visit_link__upgrade_id", "host_id")
        .distinct()
    )
    failed: dict[int, set[int]] = defaultdict(set)
    for upgrade_id, host_id in rows:
        failed[upgrade_id].add(host_id)
    return failed


def split_release(steps: list[Step], limit: int) -> tuple[set[int], list[dict]]:
    """A sliding visit's hosts released now (the first `limit` by id, each with every step it is in,
    so one drain applies them all) and the record of the rest, per step."""
    hosts = sorted({h for step in steps for h in step.hosts})
    now = set(hosts[: max(0, limit)])
    rest = [
        {"upgrade": s.plan.upgrade.pk, "phase": s.plan.phase.position, "work_s": s.work_s, "hosts": sorted(left)}
        for s in steps
        if (left := s.hosts - now)
    ]
    return now, rest


def unreleased_hosts(visit: Visit) -> set[int]:
    """The hosts a sliding visit planned and has not handed to the core yet."""
    return {h for entry in visit.plan.get("unreleased", []) for h in entry["hosts"]}


def _start_reason(train: Train, selection: Selection, sizing: VisitSizing) -> str:
    if train.emergency:
        return "emergency"
    parts = []
    if selection.over_budget:
        given = f"; the rest of the cycle gives it {sizing.stretch_s:.0f} s" if sizing.stretch_s is not None else ""
        parts.append(f"over budget: its first upgrade alone does not fit the {sizing.budget_s:.0f} s budget{given}")
    elif selection.left:
        parts.append(f"{len(selection.taken)} upgrades fit the {sizing.budget_s:.0f} s budget")
    if selection.left:
        parts.append(f"{len(selection.left)} wait for the next cycle")
    return "; ".join(parts)


def _entry(step: Step, *, joined: bool) -> dict:
    upgrade = step.plan.upgrade
    entry = {"upgrade": upgrade.pk, "target": str(upgrade.component_version), "phase": step.plan.phase.name,
             "hosts": len(step.hosts), "work_s": step.work_s}  # fmt: skip
    if step.superseded:
        entry["supersedes"] = {str(k): len(v) for k, v in step.superseded.items()}
    if joined:
        entry["joined"] = True
    return entry


def _plan_record(selection: Selection, sizing: VisitSizing) -> dict:
    taken: list[Step] = selection.taken
    return {
        "hosts": sorted({h for step in taken for h in step.hosts}),
        "upgrades": [_entry(step, joined=False) for step in taken],
        "left": [{"upgrade": s.plan.upgrade.pk, "hosts": len(s.hosts)} for s in selection.left],
        "budget_s": round(sizing.budget_s),
        **_cost_record(selection.cost_s, sizing, hosts=len({h for step in taken for h in step.hosts})),
    }


def _cost_without(taken: list[Step], refused: set[int], sizing: VisitSizing) -> dict:
    """The hosts and cost records of a visit that took `taken` once the `refused` upgrades were left
    out: the visit is measured against the work it does (counted with the refused work, a visit
    looked quicker than planned and the correction shrank the next visits' estimates)."""
    kept = [step for step in taken if step.plan.upgrade.pk not in refused]
    hosts = sorted({h for step in kept for h in step.hosts})
    cost = steps_cost_s(sizing, kept, hosts_of=lambda s: s.hosts, work_of=lambda s: s.work_s)
    return {"hosts": hosts, **_cost_record(cost, sizing, hosts=len(hosts))}


def _cost_record(estimate_s: float, sizing: VisitSizing, *, hosts: int) -> dict:
    """The visit's cost as planned: before the measured correction (cost_s, what the next visits
    measure their length against: measured against the corrected one, the correction fed on itself
    and settled at the square root of the truth), its waves, the correction, and the estimate it gave."""
    record = {
        "cost_s": round(sizing.uncorrected_s(hosts, estimate_s)),
        "waves": sizing.waves(hosts),
        "factor": round(sizing.factor, 4),
        "estimate_s": round(estimate_s),
    }
    if sizing.extra_s is not None:
        record["extra_s"] = round(sizing.extra_s)
    return record


def visit_steps_submit(train: Train, visit: Visit, steps: list[Step], *, joined: bool, catch_up: bool = False) -> None:
    """One operation per step over its hosts, submitted together (one check and write for all), each
    linked to the visit with the phase it runs in (`catch_up`: for hosts repaired in the visit's
    drain, trains/services/catch_up.py)."""
    kind = "catches up in" if catch_up else "joined" if joined else "on"
    requests = [
        OperationRequest(
            kind=OperationKind.UPGRADE,
            scope=f"train {train.name}, domain {visit.domain.name}: {len(step.hosts)} hosts",
            host_ids=sorted(step.hosts),
            component=step.plan.upgrade.component_version.component.name,
            version=step.plan.upgrade.component_version.version,
            reason=f"upgrade #{step.plan.upgrade.pk} ({step.plan.phase.name}) {kind} visit {visit.pk} "
            f"of train {train.name}",
            priority=train.priority,
            source=OperationSource.EMERGENCY if train.emergency else OperationSource.TRAIN,
            override_buffers=train.emergency,
            or_newer=True,  # a train never takes a host back down (opsplanner/services/tick/supersede.py)
            estimated_duration_s=step.work_s,
            executor=train.executor,
            drainer=train.drainer,
        )
        for step in steps
    ]
    operations = operations_submit(requests=requests, actor=ACTOR)
    VisitOperation.objects.bulk_create(
        VisitOperation(
            visit=visit,
            upgrade=step.plan.upgrade,
            operation=operation,
            phase=step.plan.phase.position,
            catch_up=catch_up,
        )
        for step, operation in zip(steps, operations, strict=True)
    )


REFUSED_KEY = "refused"  # a visit's plan: the upgrades left out of it, incompatible with its hosts


def visit_steps_submit_compatible(train: Train, visit: Visit, steps: list[Step], *, joined: bool) -> set[int]:
    """visit_steps_submit, leaving out the steps the core refuses as incompatible with their hosts
    (a compatibility rule made after the upgrade was): each gets an event saying why, and the visit
    goes on with the others. The ids of the upgrades left out. Submitted in a savepoint, as the
    catch-up does (trains/services/catch_up.py), so a refusal writes nothing; the refused steps are
    found only then (one compatibility pass), so the usual visit pays nothing more."""
    if not steps:
        return set()
    try:
        with transaction.atomic():
            visit_steps_submit(train, visit, steps, joined=joined)
        return set()
    except ValidationError as refusal:
        if WaitingCode.INCOMPATIBLE not in refusal_codes(refusal):
            raise
        found = targets_refusals([PlannedHosts(sorted(s.hosts), [s.plan.upgrade.component_version]) for s in steps])
        refused = [(step, why) for step, why in zip(steps, found, strict=True) if why is not None]
        if not refused:
            raise
    for step, why in refused:
        _step_refused(train, visit, step, why)
    left_out = {step.plan.upgrade.pk for step, _ in refused}
    rest = [step for step in steps if step.plan.upgrade.pk not in left_out]
    if rest:
        visit_steps_submit(train, visit, rest, joined=joined)
    return left_out


def _step_refused(train: Train, visit: Visit, step: Step, why: Refusal) -> None:
    upgrade = step.plan.upgrade
    event_record(
        kind="train.visit_upgrade_refused",
        subject=visit,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=f"upgrade #{upgrade.pk} ({upgrade.component_version}) is left out of the visit to domain "
        f"{visit.domain.name} ({len(step.hosts)} hosts): {why.message}"[:500],
        data={"train": train.pk, "domain": visit.domain.name, "cycle": visit.cycle_id, "upgrade": upgrade.pk,
              "hosts": len(step.hosts), "code": why.code},
    )  # fmt: skip


def _emergency_incompatible(plans: list[UpgradePlan], host_ids: set[int]) -> dict[int, dict[int, str]]:
    """Per upgrade of an emergency visit (its one), the hosts among `host_ids` below its target that
    the target would leave incompatible, with why: {upgrade: {host: reason}}. The visit leaves them
    out and gives the fix to the others; the train counts them out of its reach (emergency.py)."""
    found = {}
    for plan in plans:
        below = hosts_below_target(plan.upgrade, host_ids & plan.allowed).values_list("id", flat=True)
        if refused := emergency_incompatible(plan.upgrade, below):
            found[plan.upgrade.pk] = refused
    return found


def _hosts_refused(train: Train, visit: Visit, upgrade: Upgrade, hosts: dict[int, str]) -> None:
    """Invariant 5, once per host and reason: the emergency visit leaves out `hosts` ({host: reason})
    as its target is incompatible there; a host an earlier visit of the train last named for the
    upgrade with the same reason is not named again (the train opens no cycle for it, but a cycle for
    other hosts visits it again); with another reason (its versions changed), it is."""
    named = (
        Event.objects.filter(
            kind="train.visit_upgrade_refused",
            subject_type=Visit._meta.label_lower,
            subject_id__in=Visit.objects.filter(train=train).exclude(pk=visit.pk).values("id"),
            data__upgrade=upgrade.pk,
        )
        .order_by("id")
        .values_list("data", flat=True)
    )
    said: dict[str, str] = {}  # hostname -> the reason it was last named with
    for data in named:
        said.update(data.get("why") or dict.fromkeys(data.get("hostnames", []), ""))
    names = dict(Host.objects.filter(pk__in=hosts).values_list("id", "hostname"))
    new = sorted((names[host_id], why) for host_id, why in hosts.items() if said.get(names[host_id]) != why)
    if not new:
        return
    event_record(
        kind="train.visit_upgrade_refused",
        subject=visit,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=(
            f"upgrade #{upgrade.pk} ({upgrade.component_version}) is left out on {len(new)} hosts of domain "
            f"{visit.domain.name}, the visit goes on with the others: "
            + "; ".join(f"{hostname}: {why}" for hostname, why in new)
        )[:500],
        data={"train": train.pk, "domain": visit.domain.name, "cycle": visit.cycle_id, "upgrade": upgrade.pk,
              "hosts": len(new), "hostnames": [hostname for hostname, _ in new], "why": dict(new),
              "code": WaitingCode.INCOMPATIBLE.value},
    )  # fmt: skip


def plan_without_refused(plan: dict, refused: set[int]) -> dict:
    """A visit's plan once `refused` upgrades were left out: its hosts not released yet no longer
    wait for them (released, they would only be refused again), and it says which were left out."""
    unreleased = [entry for entry in plan.get("unreleased", []) if entry["upgrade"] not in refused]
    record = {**plan, REFUSED_KEY: sorted({*plan.get(REFUSED_KEY, []), *refused})}
    if "unreleased" in plan:
        record["unreleased"] = unreleased
    return record


def visit_plan_record_refused(visit: Visit, refused: set[int], *, cost: dict | None = None) -> None:
    """Record on the running visit's plan the upgrades left out of it (see plan_without_refused), and
    its `cost` record without them when the caller could price it (_cost_without)."""
    if not refused:
        return
    plan = {**plan_without_refused(visit.plan, refused), **(cost or {})}
    Visit.objects.filter(pk=visit.pk, state=VisitState.RUNNING).update(plan=plan)
    visit.plan = plan


# --- late joiners -----------------------------------------------------------------------------------
# A visit's plan: the upgrades it chose from as it started. One created as the visit started, but
# committed after the train read its upgrades, is not among them, though it was created before the
# visit started: told apart by time alone, it never joined and its hosts were drained again next cycle.
CONSIDERED_KEY = "considered"


def late_joiner_candidates(running: list[Visit], upgrades: list[Upgrade]) -> dict[int, list[Upgrade]]:
    """Per running visit, the upgrades it did not choose from as it started and has not considered
    since (its plan records what it chose from, took and looked at): no query. A visit started before
    its plan kept what it chose from takes those created after it started."""
    candidates: dict[int, list[Upgrade]] = {}
    for visit in running:
        plan = visit.plan
        seen = {e["upgrade"] for e in plan.get("upgrades", [])} | set(plan.get("late_seen", []))
        if CONSIDERED_KEY in plan:
            seen |= set(plan[CONSIDERED_KEY])
            fresh = [u for u in upgrades if u.pk not in seen]
        else:
            fresh = [u for u in upgrades if visit.started_at and u.created_at > visit.started_at and u.pk not in seen]
        if fresh:
            candidates[visit.pk] = fresh
    return candidates


def visits_join_late(
    *,
    train: Train,
    running: list[Visit],
    candidates: dict[int, list[Upgrade]],
    plans: list[UpgradePlan],
    sizing: VisitSizing,
) -> list[tuple[int, int, int]]:
    """Let the candidates (with their `plans`) join the running visits they were created during;
    (visit, upgrade, hosts) for each join. Holds the pool row meanwhile (a pool tick skips the pool)
    so no host of the visit is handed back or returned while its new task is written; when a pool
    tick holds it, the join waits for the next train tick. Each visit considers an upgrade once."""
    if Pool.objects.select_for_update(no_key=True, skip_locked=True).filter(pk=train.pool_id).first() is None:
        return []
    by_upgrade = {plan.upgrade.pk: plan for plan in plans}
    joins = []
    for visit in running:
        upgrades = candidates.get(visit.pk, [])
        if upgrades:
            fresh = [by_upgrade[u.pk] for u in upgrades if u.pk in by_upgrade]
            joins += _join_visit(train, visit, fresh, sizing, seen=[u.pk for u in upgrades])
    return joins


def _visit_chains(visit: Visit, plan: dict) -> dict[int, float]:
    """Per host of the visit (its plan's hosts), the work its plan gives it (one query): the
    upgrades' tasks it has, and for a sliding visit the upgrades it takes when released; a
    catch-up's are not the visit's plan."""
    work_of = {int(e["upgrade"]): float(e.get("work_s", 0)) for e in plan.get("upgrades", [])}
    chains: dict[int, float] = dict.fromkeys(plan.get("hosts", []), 0.0)
    tasks = HostTask.objects.filter(
        operation__visit_link__visit=visit, operation__visit_link__catch_up=False
    ).values_list("host_id", "operation__visit_link__upgrade_id")
    for host_id, upgrade_id in tasks:
        chains[host_id] = chains.get(host_id, 0.0) + work_of.get(upgrade_id, 0.0)
    for entry in plan.get("unreleased", []):
        for host_id in entry["hosts"]:
            chains[host_id] = chains.get(host_id, 0.0) + float(entry["work_s"])
    return chains


def _join_selection(
    visit: Visit, plans: list[UpgradePlan], host_ids: set[int], sizing: VisitSizing
) -> tuple[list[Step], dict[int, float]]:
    """What late joiners take of the running visit's hosts `host_ids`, and the work the visit gave
    its hosts before them: chosen as a visit starting chooses (_ranked_selection), beside that work,
    within the budget the visit was given (a cycle behind its deadline gives less), so a multi-cycle
    one's places go to hosts where it fits, and one that does not fit every host joins where it fits
    (two queries, three with multi-cycle upgrades over their bound; none without pending hosts)."""
    pending = _pending(plans, host_ids) if host_ids else []
    if not any(hosts for _, hosts in pending):
        return [], {}
    running = _visit_chains(visit, visit.plan)
    budget = min(sizing.budget_s, float(visit.plan.get("budget_s", sizing.budget_s)))
    return _ranked_selection(pending, host_ids, replace(sizing, budget_s=budget), running).taken, running


def _join_visit(
    train: Train, visit: Visit, plans: list[UpgradePlan], sizing: VisitSizing, *, seen: list[int]
) -> list[tuple[int, int, int]]:
    drained = set(
        HostTask.objects.filter(
            operation__visit_link__visit=visit,
            operation__visit_link__catch_up=False,  # a host catching up after a repair takes no more
            state__in=JOINABLE_TASK_STATES,
        ).values_list("host_id", flat=True)
    )
    waiting = unreleased_hosts(visit)  # a sliding visit's hosts not yet started take it when released
    steps, running = _join_selection(visit, plans, drained | waiting, sizing)
    plan_record = dict(visit.plan)
    plan_record["late_seen"] = sorted({*plan_record.get("late_seen", []), *seen})
    hosts = set(plan_record.get("hosts", []))
    joins, joined = [], []
    for step in steps:
        if step.hosts - waiting:
            refused = visit_steps_submit_compatible(
                train, visit, [replace(step, hosts=step.hosts - waiting)], joined=True
            )
            if refused:  # left out, with an event saying why; the visit has seen it (late_seen)
                plan_record = plan_without_refused(plan_record, refused)
                continue
        if step.hosts & waiting:
            _, later = split_release([replace(step, hosts=step.hosts & waiting)], 0)
            plan_record["unreleased"] = [*plan_record.get("unreleased", []), *later]
        hosts |= step.hosts
        joined.append(step)
        cost = steps_cost_s(sizing, joined, hosts_of=lambda s: s.hosts, work_of=lambda s: s.work_s, running=running)
        plan_record["upgrades"] = [*plan_record.get("upgrades", []), _entry(step, joined=True)]
        plan_record.update(_cost_record(cost, sizing, hosts=len(hosts)))
        joins.append((visit.pk, step.plan.upgrade.pk, len(step.hosts)))
        event_record(
            kind="train.visit_joined",
            subject=visit,
            actor=ACTOR,
            pool_id=train.pool_id,
            reason=f"upgrade #{step.plan.upgrade.pk} ({step.plan.upgrade.component_version}) created during the "
            f"visit joins {len(step.hosts)} hosts still drained or not yet started, in the same drain",
            data={"train": train.pk, "domain": visit.domain.name, "cycle": visit.cycle_id,
                  "upgrade": step.plan.upgrade.pk, "hosts": len(step.hosts), "cost_s": round(cost)},
        )  # fmt: skip
    Visit.objects.filter(pk=visit.pk, state=VisitState.RUNNING).update(plan=plan_record)
    visit.plan = plan_record
    return joins
