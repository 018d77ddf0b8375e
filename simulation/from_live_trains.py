"""What-if on the live fleet: its pending upgrades, from the live snapshot to the lane's arrivals.

The snapshot (`upgrades_snapshot`, read-only) takes each pending upgrade as upgrade_create takes it,
with the phases it has still to go through, and how far the phase in force has got
(`phase_progress`): the successes it has shown (counted by trains.services.upgrades, as the train tick
counts them), since when it soaks, and the hosts the phases so far picked from the pool. The lane
cannot count that evidence again (the tasks that showed it live are not copied), so it carries it
(`upgrade_arrival`):
- evidence in and soak over: the phase is done, the lane starts at the next one (the live tick moves
  on at its next look; the work in flight is assumed finished, as everywhere in the what-if);
- evidence in, still soaking: the phase graduates when its live soak ends (`CarriedPhase.soak_ends_at`,
  `carried_soaks_graduate`), once no task of it is open, as the tick's rule;
- short of evidence: it needs only what it lacks (at least one success, as upgrade_create asks of a
  phase before the last), and its soak, if under way, runs from when it began live.
Whether the phase holds is not copied: the lane's tick decides it with the carried evidence, as the
live one would (its hosts all in service); a phase held live is named in the forecast's notes
(`phase_in_force_note`), as the lane may widen it where the live fleet waits for an operator. A
snapshot without `phase_progress` (taken before it was) reads as before: the phases as they are, the
evidence from zero.

The hosts counted against the upgrade in its phase in force, and those its failure rate counts as
succeeded (`phase_progress`'s `failed_hosts` and `rate_succeeded_hosts`, by name, read by the tick's
own queries; `failures`, `rate_successes`, how many, and `breach`, the tick's reason to offboard it,
`policy_breach`), are carried too: the lane writes them on its phase as its own hosts of the same
names (`carried_phase_write`: CarriedHost rows, UpgradePhase.carries_live_hosts), and the tick
counts them with the hosts of the phase's own tasks, each host once, as live
(trains.services.phase_hosts): a host that failed live and fails again in the lane is one failure;
one that failed live and succeeds in the lane stays a failure and is no success of the rate (live, a
host that failed then caught up finished once, as a failure). So it offboards as the live one would.
Only the phase in force carries them: a phase after it counts from zero, as live (the failures
before it started are not its), and so does the next phase when the lane starts there. An upgrade
already over its policy live is offboarded by the live tick at its next look, before it graduates:
the lane keeps its phase (or creates the next, where upgrade_create refuses a domain with no host in
scope) and offboards it at its first; a carried soak does not graduate over a breach either
(`_carried_graduate`). The forecast's notes say what it carried (`carried_failures_note`). A
snapshot without the hosts carries none.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any, NamedTuple

from django.db import transaction

from fleet.models import Host, Pool
from opsplanner import clock
from simulation.config import CarriedPhase, SimulationConfig
from simulation.scenarios import upgrade_announced_seconds

PENDING_UPGRADE_STATES = ("active",)  # trains.models.UpgradeState.ACTIVE: what a train still has to apply
_NOT_CREATED = ("component", "version", "phase_progress")  # the keys that are no upgrade_create argument


class _Counted(NamedTuple):
    """What the train tick counts of an upgrade's phase in force: the evidence, the hosts counted
    against its policy and those its failure rate counts as succeeded (none without a rate: nothing
    reads them)."""

    successes: int
    failed: set[int]
    rate_succeeded: set[int]


def upgrades_snapshot(pool: Pool) -> list[dict[str, Any]]:
    """The pool's pending upgrades (not emergency ones), oldest first, each with its phase's progress."""
    from trains.models import Upgrade

    upgrades = list(
        Upgrade.objects.filter(pool=pool, state__in=PENDING_UPGRADE_STATES, emergency=False)
        .select_related("component_version__component")
        .prefetch_related("phases__domain")
        .order_by("created_at", "id")
    )
    phases = {u.pk: sorted(u.phases.all(), key=lambda p: p.position) for u in upgrades}
    in_force = [p for u in upgrades for p in phases[u.pk] if p.position == u.current_phase]
    emptied = {p.upgrade_id for p in in_force if p.domain_id is not None and not _domain_in_scope(p)}
    counted = _in_force_counted(upgrades, in_force)
    picked = {h for u in upgrades for p in phases[u.pk] if p.position <= u.current_phase for h in p.picked_hosts}
    picked |= {h for c in counted.values() for h in c.failed | c.rate_succeeded}
    # Retired hosts too: one the phase counted failed live still counts (and the lane has none of its name).
    names = dict(Host.all_objects.filter(pk__in=picked).values_list("id", "hostname")) if picked else {}
    return [_upgrade_snapshot(u, phases[u.pk], counted[u.pk], names, u.pk not in emptied) for u in upgrades]


def _in_force_counted(upgrades: list[Any], in_force: list[Any]) -> dict[int, _Counted]:
    """Per upgrade, its phase in force's counts, with the tick's own selectors (a query each)."""
    from trains.services.upgrades import upgrades_failed_hosts, upgrades_phase_successes, upgrades_rate_succeeded_hosts

    successes = upgrades_phase_successes(in_force)
    failed = upgrades_failed_hosts(in_force)
    rated = {u.pk for u in upgrades if u.max_failure_rate is not None}
    rate = upgrades_rate_succeeded_hosts([p for p in in_force if p.upgrade_id in rated])
    return {u.pk: _Counted(successes.get(u.pk, 0), failed.get(u.pk, set()), rate.get(u.pk, set())) for u in upgrades}


def _domain_in_scope(phase: Any) -> bool:
    """Whether the domain of a phase has a host in its upgrade's scope now: a scope that selects
    hosts below the target (`hosts running C below V`) has none left in a canary domain all of whose
    hosts reached it, and upgrade_create refuses such a phase (the lane creates its upgrades)."""
    from trains.services.upgrade_scopes import upgrade_scope_hosts

    scope = upgrade_scope_hosts(phase.upgrade)
    return bool(scope) and Host.objects.filter(pk__in=scope, domain_id=phase.domain_id).exists()


def _upgrade_snapshot(
    upgrade: Any, phases: list[Any], counted: _Counted, names: dict[int, str], in_scope: bool
) -> dict[str, Any]:
    """A pending upgrade as upgrade_create takes it: its target, scope and policy, the phases it has
    still to go through (a graduated phase's evidence is in: the lane does not wait for it again) and
    how far the first of them, the phase in force, has got."""
    remaining = [
        {"name": p.name, "domain": p.domain.name if p.domain else "", "percent": p.percent,
         "min_successes": p.min_successes, "soak_s": p.soak_s, "selection": p.selection}
        for p in phases
        if p.position >= upgrade.current_phase
    ]  # fmt: skip
    deadline = upgrade.deadline
    return {
        "component": upgrade.component_version.component.name,
        "version": upgrade.component_version.version,
        "scope": upgrade.scope,
        "phases": remaining or None,
        "max_failures": upgrade.max_failures,
        "max_failure_rate": None if upgrade.max_failure_rate is None else float(upgrade.max_failure_rate),
        "failure_rate_min_hosts": upgrade.failure_rate_min_hosts,
        "multi_cycle": upgrade.multi_cycle,
        "hosts_per_visit": upgrade.hosts_per_visit if upgrade.multi_cycle else None,  # only bounds multi-cycle
        "priority": upgrade.priority,
        "deadline": None if deadline is None else deadline.isoformat(),
        "duration_s": upgrade.duration_s,
        "phase_progress": _phase_progress(upgrade, phases, counted, names, in_scope),
    }


def _phase_progress(
    upgrade: Any, phases: list[Any], counted: _Counted, names: dict[int, str], in_scope: bool
) -> dict[str, Any] | None:
    """How far the phase in force has got: its successes, the evidence it needs (both as the tick
    judges them), since when it soaks (None: not yet, or afresh since a re-onboarding) and the hosts
    it and the phases before it picked (the tick lets every later phase touch them too); whether
    its domain, if it has one, still has a host in scope (`_domain_in_scope`); the failures counted
    against it and the successes its failure rate counts (the hosts, by name, and how many), and why
    they breach its policy if they do (the live tick offboards it at its next look)."""
    from trains.services.phases import phase_evidence_needed
    from trains.services.upgrade_policy import policy_breach

    phase = next((p for p in phases if p.position == upgrade.current_phase), None)
    if phase is None:  # no phase in force to go on from: the lane starts the phases afresh, as before
        return None
    picked = [names[h] for p in phases if p.position <= phase.position for h in p.picked_hosts if h in names]
    reached = phase.successes_reached_at
    return {
        "successes": counted.successes,
        "evidence_needed": phase_evidence_needed(phase),
        "successes_reached_at": None if reached is None else reached.isoformat(),
        "picked_hosts": list(dict.fromkeys(picked)),
        "domain_in_scope": in_scope,
        "held_reason": phase.held_reason if phase.held_code else "",
        "failed_hosts": sorted(names[h] for h in counted.failed),
        "rate_succeeded_hosts": sorted(names[h] for h in counted.rate_succeeded),
        "failures": len(counted.failed),
        "rate_successes": len(counted.rate_succeeded),
        "breach": policy_breach(upgrade, phase, len(counted.failed), len(counted.rate_succeeded)),
    }


def upgrade_arrival(upgrade: dict[str, Any], start: dt.datetime) -> tuple[dict[str, Any] | None, CarriedPhase | None]:
    """upgrade_create's arguments for a live upgrade but its target (Arrival.upgrade; None: the lane
    cannot create it, see phase_in_force_note), and what its first phase carries of the live
    progress (Arrival.carried; None: nothing, as an older snapshot)."""
    fields = {k: v for k, v in upgrade.items() if k not in _NOT_CREATED}
    deadline = dt.datetime.fromisoformat(fields["deadline"]) if fields["deadline"] else None
    # A deadline already missed live is not one the lane can be held to (upgrade_create refuses the past).
    fields["deadline"] = deadline if deadline is not None and deadline > start else None
    progress = upgrade.get("phase_progress")
    if not progress or not fields["phases"]:
        return fields, None
    phases = [dict(p) for p in fields["phases"]]
    if not progress.get("domain_in_scope", True):
        # Its domain has no host left in scope: upgrade_create refuses the phase, and the lane cannot
        # show its evidence. With the evidence in, it widens at once (early by what is left of its
        # soak); without, it holds live until an operator acts, and the lane leaves it out. Over its
        # failure policy, the live tick offboards it at its next look: the lane creates the next phase
        # with the failures, and its tick offboards it at its first.
        picked = tuple(progress["picked_hosts"])
        if progress.get("breach"):
            return {**fields, "phases": phases[1:]}, replace(_failures_carried(progress), picked_hosts=picked)
        if progress["successes"] < progress["evidence_needed"]:
            return None, None
        return {**fields, "phases": phases[1:]}, CarriedPhase(picked_hosts=picked)
    fields["phases"], carried = _phases_carried(phases, progress, start)
    return fields, carried


def _phases_carried(
    phases: list[dict[str, Any]], progress: dict[str, Any], start: dt.datetime
) -> tuple[list[dict[str, Any]], CarriedPhase]:
    """The phases the lane creates and what its first one carries, from the live phase in force's progress."""
    first, picked = phases[0], tuple(progress["picked_hosts"])
    reached = dt.datetime.fromisoformat(progress["successes_reached_at"]) if progress["successes_reached_at"] else None
    successes, needed = progress["successes"], progress["evidence_needed"]
    failed = _failures_carried(progress)  # the lane's tick judges the policy with them, as the live one
    if len(phases) == 1:  # the last phase opens nothing wider: the upgrade completes with its scope
        return phases, replace(failed, picked_hosts=picked)
    if successes < needed:
        if successes:  # what it still lacks; a phase before the last needs one at least (upgrade_create)
            first["min_successes"] = max(1, needed - successes)
        return phases, replace(failed, successes_reached_at=reached, picked_hosts=picked)
    # Its evidence is in: the tick stamps when it was reached at its next look if it has not yet.
    soak_ends_at = (reached or start) + dt.timedelta(seconds=first["soak_s"])
    # Soaking: the lane's tick cannot see the evidence, so the phase looks for none of its own (an
    # 'any' phase would pick hosts the live one never will) and graduates when its soak ends.
    first["min_successes"], first["selection"] = 1, "fixed"
    if soak_ends_at <= start:
        if not progress.get("breach"):  # the next phase counts its failures from its start, as live
            return phases[1:], CarriedPhase(picked_hosts=picked)
        # Over its policy: the live tick offboards it before it graduates, at its next look; the lane's at its first.
        return phases, replace(failed, picked_hosts=picked)
    return phases, replace(
        failed, successes_reached_at=reached or start, soak_ends_at=soak_ends_at, picked_hosts=picked
    )


def _failures_carried(progress: dict[str, Any]) -> CarriedPhase:
    """What a phase carries of the hosts its failure policy counted (none from a snapshot taken
    before they were)."""
    return CarriedPhase(
        failed_hosts=tuple(progress.get("failed_hosts", ())),
        rate_succeeded_hosts=tuple(progress.get("rate_succeeded_hosts", ())),
    )


def carried_phase_write(upgrade: Any, carried: CarriedPhase) -> None:
    """Write on the lane's upgrade (just created) its first phase's carried progress: the hosts its
    failure policy counted live as the lane's hosts of the same names (CarriedHost; a host no longer
    in the pool with none: it still counts, and the lane never takes it again)."""
    from trains.models import CarriedHost, UpgradePhase

    if carried == CarriedPhase():
        return
    named = {*carried.picked_hosts, *carried.failed_hosts, *carried.rate_succeeded_hosts}
    ids = dict(Host.objects.filter(pool_id=upgrade.pool_id, hostname__in=named).values_list("hostname", "id"))
    phase = UpgradePhase.objects.get(upgrade_id=upgrade.pk, position=0)
    counted = [(name, True) for name in carried.failed_hosts] + [(name, False) for name in carried.rate_succeeded_hosts]
    UpgradePhase.objects.filter(pk=phase.pk).update(
        successes_reached_at=carried.successes_reached_at,
        picked_hosts=[ids[name] for name in carried.picked_hosts if name in ids],
        carries_live_hosts=bool(counted),
    )
    CarriedHost.objects.bulk_create(
        CarriedHost(phase=phase, host_id=ids.get(name), failed=failed) for name, failed in counted
    )


def carried_soaks_graduate(soaking: dict[int, tuple[int, dt.datetime]], pool_ids: set[int] | None) -> set[int]:
    """Graduate the lane's phases whose evidence was in live once their soak is over (`soaking`:
    upgrade id -> its pool and when its soak ends; an entry settled is removed); the pools where one did."""
    now = clock.now()
    moved = set()
    for upgrade_id, (pool_id, ends_at) in list(soaking.items()):
        if ends_at > now or (pool_ids is not None and pool_id not in pool_ids):
            continue
        graduated = _carried_graduate(upgrade_id, now)
        if graduated is not None:
            del soaking[upgrade_id]
        if graduated:
            moved.add(pool_id)
    return moved


@transaction.atomic
def _carried_graduate(upgrade_id: int, now: dt.datetime) -> bool | None:
    """Graduate the upgrade's first phase (True); False: it left it already (the tick moved it on, it
    completed or was offboarded); None: not yet, a task of it is still open (the tick's rule: no
    phase widens over a host whose outcome is not known), or its failures breach its policy (the
    tick offboards it first, as it judges the policy before it graduates a phase)."""
    from opsplanner.models import OPEN_TASK_STATES
    from trains.models import Upgrade, UpgradeState
    from trains.services.phases import phase_graduate
    from trains.services.upgrade_policy import policy_breach
    from trains.services.upgrades import upgrade_phase_failures, upgrade_tasks, upgrades_rate_successes

    upgrade = Upgrade.objects.select_related("component_version").get(pk=upgrade_id)
    if upgrade.state != UpgradeState.ACTIVE or upgrade.current_phase != 0:
        return False
    if upgrade_tasks(upgrade).filter(state__in=sorted(OPEN_TASK_STATES)).exists():
        return None  # every task of the upgrade is of its first phase until it graduates
    phase, following = list(upgrade.phases.order_by("position")[:2])
    failures = upgrade_phase_failures(upgrade, phase)
    rate = upgrades_rate_successes([phase], up_to=None).get(upgrade.pk, 0) if failures else 0
    if policy_breach(upgrade, phase, failures, rate):
        return None
    return phase_graduate(
        upgrade=upgrade, phase=phase, nxt=following, now=now, data={"carried": True},
        reason=f"phase {phase.name} had its evidence on the live fleet and has soaked; now {following.name}",
    )  # fmt: skip


def phase_in_force_note(upgrade: dict[str, Any]) -> str:
    """What a forecast says of an upgrade whose phase in force has no host left in scope (upgrade_arrival
    treats it so), or holds on the live fleet (the lane judges the hold anew); empty for any other."""
    progress = upgrade.get("phase_progress") or {}
    phases = upgrade.get("phases") or []
    if progress.get("domain_in_scope", True):
        if not progress.get("held_reason") or not phases:
            return ""
        return (
            f"upgrade {upgrade['component']} {upgrade['version']}: phase {phases[0]['name']} holds on the live "
            f"fleet ({progress['held_reason']}); the forecast judges the hold anew with every host in service "
            "and no operator to skip it, so it may widen where the live fleet waits"
        )
    said = (
        f"upgrade {upgrade['component']} {upgrade['version']}: phase {phases[0]['name']} has no host left in its scope"
    )
    if progress["successes"] < progress["evidence_needed"]:
        return f"{said} and lacks its evidence: it holds on the live fleet until an operator acts; left out here"
    return f"{said} and has its evidence: the forecast widens it at once (the live fleet, when its soak ends)"


def carried_failures_note(upgrade: dict[str, Any]) -> str:
    """What a forecast says of an upgrade whose phase in force counted failures on the live fleet (the
    lane carries them while the phase is in force); empty for any other."""
    progress = upgrade.get("phase_progress") or {}
    failures, phases = progress.get("failures", 0), upgrade.get("phases") or []
    if not failures or not phases:
        return ""
    said = f"upgrade {upgrade['component']} {upgrade['version']}: "
    if progress.get("breach"):
        offboarded = "its tick offboards it at its next look, the forecast at its first"
        return f"{said}{progress['breach']} on the live fleet: {offboarded}"
    hosts = f"{failures} host{'' if failures == 1 else 's'}"
    return (
        f"{said}{hosts} failed in phase {phases[0]['name']} on the live fleet (its policy allows "
        f"{upgrade['max_failures']}): the forecast counts them while the phase is in force, as the live tick"
    )


def open_cycle_snapshot(train: Any) -> dict[str, Any] | None:
    """Where a live train stands in its open cycle (None: none open): its number, start and deadline,
    and the domains it has visited in it. A visit running live is not among them: the lane visits
    its domain first (its hosts' work in flight is taken as not done, as their versions show)."""
    from trains.models import Cycle, Visit, VisitState

    cycle = Cycle.objects.filter(train=train, ended_at__isnull=True).first()
    if cycle is None:
        return None
    visited = Visit.objects.filter(cycle=cycle, state=VisitState.DONE).select_related("domain").order_by("position")
    return {
        "number": cycle.number,
        "started_at": cycle.started_at.isoformat(),
        "deadline_at": cycle.deadline_at.isoformat(),
        "visited": [
            {"domain": v.domain.name, "started_at": _iso(v.started_at), "ended_at": _iso(v.ended_at)} for v in visited
        ],
    }


def _iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def open_cycle_copy(train: Any, cycle: dict[str, Any] | None) -> None:
    """Open on the lane's train (just created, its stops the live ones) the live train's open cycle:
    its number, start and deadline, the domains it visited done as they were. Its tick then visits
    the other domains first and ends the cycle when the live one would, judged by the live deadline;
    without it, the lane started a new cycle at the first stop, visiting again the domains just
    visited live and leaving the others for last."""
    from trains.models import Cycle, Visit, VisitState

    if not cycle:
        return
    opened = Cycle.objects.create(
        train=train,
        number=cycle["number"],
        started_at=dt.datetime.fromisoformat(cycle["started_at"]),
        deadline_at=dt.datetime.fromisoformat(cycle["deadline_at"]),
    )
    visited = {v["domain"]: v for v in cycle["visited"]}
    visits = []
    for stop in train.stops.select_related("domain").order_by("position"):
        visit = Visit(train=train, cycle=opened, domain_id=stop.domain_id, position=stop.position)
        done = visited.get(stop.domain.name)
        if done is not None and done["started_at"] and done["ended_at"]:
            visit.state, visit.outcome = VisitState.DONE, "visited on the live fleet"
            visit.started_at = dt.datetime.fromisoformat(done["started_at"])
            visit.ended_at = dt.datetime.fromisoformat(done["ended_at"])
        visits.append(visit)
    Visit.objects.bulk_create(visits)


def open_cycle_note(train: dict[str, Any]) -> str:
    """What a forecast says of a live train in the middle of a cycle (empty: none open)."""
    cycle = train.get("open_cycle")
    if not cycle:
        return ""
    visited = len(cycle["visited"])
    return (
        f"train {train['name']} is in cycle {cycle['number']} on the live fleet, {visited} "
        f"domain{'' if visited == 1 else 's'} visited: the forecast goes on from there, to the cycle's live "
        f"deadline ({cycle['deadline_at']})"
    )


def live_setting(snapshot: dict[str, Any], config: SimulationConfig) -> list[str]:
    """What the lane of this live pool runs with, for the report's header in place of the generated
    fleet's: the pool's buffers, its trains' visit sizing (the trains policies recreate them as they
    are live) and the time a host takes for each pending upgrade (upgrade_announced_seconds, as the
    lane's executor takes it; without one, the simulator's execute_minutes)."""
    from trains.models import Train
    from trains.selectors_web import duration_text
    from trains.services.budget import train_default_work_s, train_overhead_s

    pool = snapshot["pool"]
    lines = [
        f"Pool {pool['name']}: {len(snapshot['hosts']):,} hosts in {len(snapshot['domains']):,} domains; planned "
        f"buffer {config.planned_buffer_hosts:,} hosts, failure buffer {config.failure_buffer_hosts:,} hosts"
    ]
    for spec in snapshot["trains"]:
        train = Train(visit_estimate_s=spec["visit_estimate_s"], visit_overhead_s=spec["visit_overhead_s"])
        lines.append(
            f"Train {spec['name']}: visits of {spec['visit_concurrency']} domain(s) at once, each estimated at "
            f"{duration_text(train.visit_estimate_s)} ({duration_text(train_overhead_s(train))} of it drain, "
            f"checks and return; an upgrade without a duration sized at {duration_text(train_default_work_s(train))} "
            f"a host); cycle SLO {duration_text(spec['cycle_slo_s'])}"
        )
    works = []
    for upgrade in snapshot["upgrades"]:
        seconds = upgrade_announced_seconds(config, upgrade["component"], upgrade["version"], upgrade["duration_s"])
        own = "" if seconds is not None else " (none given: the simulator's default)"
        work = duration_text(config.execute_minutes * 60 if seconds is None else round(seconds))
        works.append(f"{upgrade['component']} {upgrade['version']} {work}{own}")
    lines.append(f"Pending upgrades, a host's work each: {'; '.join(works)}" if works else "No pending upgrade")
    return lines
