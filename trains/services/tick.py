"""The train tick: per train, under its row lock, in one transaction; harmless to run twice.

1. upgrades: offboard what fails beyond its policy, graduate phases on evidence only (a phase short of
   hosts picks some from the pool or holds: trains/services/phases.py), complete finished upgrades;
2. visits: a visit whose tasks are all finished is done;
3. autostop when the pool's buffers are exhausted (and resume automatically if configured);
4. start visits while the train runs and has room (trains/services/cycles.py; domains under an opt-out
   window are skipped for now); a sliding train (trains/services/pace.py) releases hosts to the core
   as others come back;
5. forecast the cycle and alert when it will miss its SLO.
The core's pool tick does the admitting, draining and returning of the operations a visit creates.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Exists, OuterRef

from fleet.models import PLANNED_OUT_STATES, Host, HostState
from fleet.selectors.capacity import PoolCapacity, pool_capacity
from opsplanner import clock
from opsplanner.events import event_record, rolled_back_tick_record
from opsplanner.models import OPEN_TASK_STATES, HostTask, Lease, TaskState
from opsplanner.prepared import PreparedModels, PreparedQuery
from opsplanner.services.approvals import approvals_expire
from trains.models import (
    LIVE_TRAIN_STATES,
    Cycle,
    Train,
    TrainState,
    Upgrade,
    UpgradePhase,
    UpgradeState,
    Visit,
    VisitOperation,
    VisitState,
)
from trains.selectors_promise import upgrade_promise
from trains.selectors_web import trains_forecasts_with_visits
from trains.services.actor import ACTOR
from trains.services.budget import (
    HOST_TIME_KEY,
    sliding_visit_ratios,
    train_overhead_s,
    train_sizing,
)
from trains.services.catch_up import visits_catch_up
from trains.services.cycle_played import cycle_played_store, played_key
from trains.services.cycles import cycle_visits_start, visit_end
from trains.services.emergency import emergency_train_finish_if_done
from trains.services.offboarding import upgrade_offboard
from trains.services.pace import (
    ActiveUpgrade,
    sliding_allowance,
    train_hosts_out,
    train_slides,
    train_tasks,
    visit_release,
)
from trains.services.phases import phase_allowed_hosts, phase_evidence_needed, phase_evidence_step, phase_graduate
from trains.services.trains import SUBJECT, train_set_state
from trains.services.upgrade_policy import policy_breach, successes_that_matter, train_upgrades
from trains.services.upgrade_scopes import upgrade_scope_hosts
from trains.services.upgrades import phase_host_sets, upgrades_unfinished
from trains.services.visits import (
    UpgradePlan,
    late_joiner_candidates,
    unreleased_hosts,
    visits_join_late,
)

log = logging.getLogger(__name__)


@dataclass
class TrainTickReport:
    train_id: int
    skipped: bool = False
    rolled_back: bool = False  # the tick failed: nothing it did was kept (a `train.tick_rolled_back` event says why)
    events: list[str] = field(default_factory=list)


def trains_tick() -> list[TrainTickReport]:
    """Tick every live train, each in its own transaction: one whose tick fails is rolled back,
    logged and recorded, and the others still tick."""
    approvals_expire()
    trains = Train.objects.filter(state__in=sorted(LIVE_TRAIN_STATES)).values_list("id", "pool_id")  # by name
    return [_train_tick_isolated(train_id, pool_id) for train_id, pool_id in trains]


def _train_tick_isolated(train_id: int, pool_id: int) -> TrainTickReport:
    try:
        return train_tick(train_id=train_id)
    except Exception as failure:  # whatever it was, the other trains must still tick
        log.exception("tick of train %s rolled back", train_id, extra={"pool_id": pool_id, "train_id": train_id})
        rolled_back_tick_record(
            kind="train.tick_rolled_back",
            subject_type=SUBJECT,
            subject_id=train_id,
            pool_id=pool_id,
            reason=f"{type(failure).__name__}: {_said(failure)}"[:500],
        )
        return TrainTickReport(train_id=train_id, rolled_back=True)


def _said(failure: Exception) -> str:
    return "; ".join(failure.messages) if isinstance(failure, ValidationError) else str(failure)


@transaction.atomic
def train_tick(*, train_id: int) -> TrainTickReport:
    report = TrainTickReport(train_id=train_id)
    train = next(iter(_TRAIN_LOCKED.objects(train_id=train_id)), None)
    if train is None or train.state not in (TrainState.RUNNING, TrainState.PAUSED, TrainState.AUTOSTOPPED):
        report.skipped = True
        return report
    now = clock.now()
    active = _upgrades_policy_step(train, report)
    # The running visits, read once: the steps below only change their plans (in place) and end them.
    running = _RUNNING_VISITS.objects(train_id=train.pk)
    capacity = pool_capacity(train.pool)  # read once, as the tick began: the catch-up, the autostop, the played key
    if train.state == TrainState.RUNNING and capacity.by_state.get(HostState.REPAIR):
        _catch_up_step(train, running, active, report)  # before the visits finish: a failed host may be their last
    running = _finish_visits(train, running, now, report)
    _autostop_step(train, capacity, now, report)
    if train.state == TrainState.RUNNING:
        _late_joiners_step(train, running, active, now, report)
    if train.state == TrainState.RUNNING and train_slides(train):
        _slide_step(train, running, active, now, report)
    else:
        if train.state == TrainState.RUNNING:  # a train that stopped sliding hands over the rest at once
            _release(train, running, active, room=None, report=report)
        # Completion, graduation and the hosts still pending matter when a visit could start; while
        # every visit slot is taken (most ticks of a busy train) they wait for the next free slot.
        if train.state != TrainState.RUNNING or len(running) < train.visit_concurrency:
            plans = _upgrades_progress_step(train, active, running, now, report)
            if train.state == TrainState.RUNNING:
                cycle_visits_start(train=train, plans=plans, now=now, events=report.events)
    if train.emergency and emergency_train_finish_if_done(train=train):
        report.events.append("finished")
    _forecast_step(train, active, capacity, now, report)
    return report


def _slide_step(
    train: Train, running: list[Visit], active: list[_Active], now: dt.datetime, report: TrainTickReport
) -> None:
    """A sliding train (trains/services/pace.py): release to the core as many hosts as came back,
    first those its running visits have not released yet, in the train's order, then the next
    domains'. Upgrades and phases progress, as in the domain pace, only when a visit could start."""
    room = _release(train, running, active, room=sliding_allowance(train) - train_hosts_out(train), report=report)
    if any(v.plan.get("unreleased") for v in running):
        return  # the running visits still have hosts to give before the next domain starts
    # At the end of a cycle (nothing planned, visits still running) nothing could start.
    if room > 0 and (not running or Visit.objects.filter(train=train, state=VisitState.PLANNED).exists()):
        plans = _upgrades_progress_step(train, active, running, now, report)
        cycle_visits_start(train=train, plans=plans, now=now, events=report.events, room=room)


def _release(
    train: Train, running: list[Visit], active: list[_Active], *, room: int | None, report: TrainTickReport
) -> int:
    """Release up to `room` (None: all) not yet released hosts of the running visits, in the train's
    order; the room left. No query unless a visit has such hosts."""
    waiting = sorted((v for v in running if v.plan.get("unreleased")), key=lambda v: (v.cycle_id, v.position))
    left = room if room is not None else sum(len(unreleased_hosts(v)) for v in waiting)
    if not waiting:
        return left
    known = {a.upgrade.pk: ActiveUpgrade(upgrade=a.upgrade, phases=a.phases) for a in active}
    for visit in waiting:
        if left <= 0:
            break
        released = visit_release(train=train, visit=visit, active=known, limit=left)
        left -= released
        if released:
            report.events.append(f"visit {visit.pk} released {released} hosts")
    return left


def _late_joiners_step(
    train: Train, running: list[Visit], active: list[_Active], now: dt.datetime, report: TrainTickReport
) -> None:
    """Upgrades created while a visit runs join its hosts still drained (trains/services/visits.py);
    no query unless a visit has such an upgrade it has not considered yet."""
    candidates = late_joiner_candidates(running, [a.upgrade for a in active])
    if not candidates:
        return
    late = {u.pk for upgrades in candidates.values() for u in upgrades}
    plans = _upgrades_progress_step(train, [a for a in active if a.upgrade.pk in late], running, now, report)
    sizing = train_sizing(train, cycle=running[0].cycle.number)  # running visits are of the one open cycle
    for visit_id, upgrade_id, hosts in visits_join_late(
        train=train, running=running, candidates=candidates, plans=plans, sizing=sizing
    ):
        report.events.append(f"upgrade {upgrade_id} joined visit {visit_id} on {hosts} hosts")


def _catch_up_step(train: Train, running: list[Visit], active: list[_Active], report: TrainTickReport) -> None:
    """Hosts being repaired in a running visit's drain get the visit's work they missed, to take in
    the same drain (trains/services/catch_up.py); one query unless there are such hosts. The train
    tick calls it only while some host of the pool is in repair."""
    if not running:
        return
    known = {a.upgrade.pk: ActiveUpgrade(upgrade=a.upgrade, phases=a.phases) for a in active}
    for visit_id, host_id in visits_catch_up(train=train, running=running, active=known):
        report.events.append(f"host {host_id} catches up in visit {visit_id}")


# The train's own row and its running visits, asked at every tick: compiled once.
_TRAIN_LOCKED = PreparedModels(
    lambda *, train_id: (
        Train.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("pool")
        .filter(pk=train_id)
        .order_by("pk")[:1]
    ),
    train_id=int,
)
_RUNNING_VISITS = PreparedModels(
    lambda *, train_id: Visit.objects.filter(train_id=train_id, state=VisitState.RUNNING).select_related(
        "domain", "cycle"
    ),
    train_id=int,
)


# --- 1. upgrades ------------------------------------------------------------------------------------
@dataclass
class _Active:
    upgrade: Upgrade
    phases: list[UpgradePhase]
    counted: int  # the successes of the phase at `counted_in`, read once as the tick began
    counted_in: int

    @property
    def phase(self) -> UpgradePhase:
        return self.phases[self.upgrade.current_phase]

    @property
    def successes(self) -> int | None:
        """The successes of the phase the upgrade is in; None once a graduation earlier in this tick
        (phase_graduate moves `upgrade.current_phase` in place) left the phase they were counted in:
        they are the previous phase's, no evidence for this one."""
        return self.counted if self.upgrade.current_phase == self.counted_in else None


def _upgrades_policy_step(train: Train, report: TrainTickReport) -> list[_Active]:
    """Offboard the upgrades that fail beyond their policy; the others, with their phases. Phases
    and failures are read once for all the train's upgrades (this runs on every train tick)."""
    upgrades, phases, failures = train_upgrades(train)
    if not upgrades:
        return []
    counted = successes_that_matter(upgrades, phases, failures)
    active = []
    for upgrade in upgrades:
        phase = phases[upgrade.pk][upgrade.current_phase]
        breach = policy_breach(upgrade, phase, failures.get(upgrade.pk, 0), counted.rate.get(upgrade.pk, 0))
        if breach:
            upgrade_offboard(upgrade=upgrade, reason=breach, actor=ACTOR)
            report.events.append(f"offboarded upgrade {upgrade.pk}")
            continue
        active.append(
            _Active(
                upgrade=upgrade,
                phases=phases[upgrade.pk],
                counted=counted.evidence.get(upgrade.pk, 0),
                counted_in=upgrade.current_phase,
            )
        )
    return active


def _upgrades_progress_step(
    train: Train, active: list[_Active], running: list[Visit], now: dt.datetime, report: TrainTickReport
) -> list[UpgradePlan]:
    """Complete the upgrades every host has, graduate phases; the plans of the others. It may run
    twice in a tick (late joiners, then a free visit slot): an upgrade that graduated in the first
    run is only planned in its new phase in the second, whose evidence the next tick counts."""
    sharing: dict[str, list[Upgrade]] = defaultdict(list)
    for entry in active:  # the upgrades of a pool mostly share one scope ("pool X"): a query per scope
        sharing[entry.upgrade.scope].append(entry.upgrade)
    scopes = {name: upgrade_scope_hosts(upgrades[0]) for name, upgrades in sharing.items()}
    unfinished: set[int] = set()
    for name, upgrades in sharing.items():
        unfinished |= upgrades_unfinished(upgrades, scopes[name])
    plans = []
    for entry in active:
        upgrade, phases, phase = entry.upgrade, entry.phases, entry.phase
        scope = scopes[upgrade.scope]
        # Done when every host runs the target or newer: a newer release of the component that
        # reached a host first supersedes this upgrade there (the train never takes a host back down).
        if upgrade.pk not in unfinished:
            _complete(upgrade, now, _done_reason(upgrade, scope))
            report.events.append(f"completed upgrade {upgrade.pk}")
            continue
        sets = phase_host_sets(phases, scope)
        if phase is phases[-1]:  # nothing wider to open: the upgrade completes when its scope is done
            plans.append(UpgradePlan(upgrade=upgrade, phase=phase, allowed=sets[phase.position]))
            continue
        successes = entry.successes
        if successes is None:  # it graduated earlier in this tick: its phase has no count of its own yet
            plans.append(
                UpgradePlan(upgrade=upgrade, phase=phase, allowed=phase_allowed_hosts(phases, phase.position, sets))
            )
            continue
        allowed = phase_evidence_step(
            train=train, upgrade=upgrade, phases=phases, sets=sets, scope=scope, successes=successes, now=now
        )
        plan = UpgradePlan(upgrade=upgrade, phase=phase, allowed=allowed)
        if _graduates(upgrade, phase, successes, running, now):
            following = phases[phase.position + 1]
            if phase_graduate(
                upgrade=upgrade,
                phase=phase,
                nxt=following,
                now=now,
                reason=f"phase {phase.name} graduated with {successes} successes after its soak; now {following.name}",
            ):
                report.events.append(f"upgrade {upgrade.pk} graduated to phase {following.position}")
                plan = UpgradePlan(
                    upgrade=upgrade, phase=following, allowed=phase_allowed_hosts(phases, following.position, sets)
                )
        plans.append(plan)
    return plans


def _done_reason(upgrade: Upgrade, scope: list[int]) -> str:
    if not scope:  # its selector matches nothing any more (trains/services/upgrade_scopes.py)
        return f"its scope {upgrade.scope!r} matches no live host any more: nothing left to do"
    return f"all {len(scope)} hosts run {upgrade.component_version} or newer"


def _graduates(upgrade: Upgrade, phase: UpgradePhase, successes: int, running: list[Visit], now: dt.datetime) -> bool:
    """Enough successes, then the soak time, and every host of the phase (or an earlier one)
    finished: none a running sliding visit has yet to release, no task still open. A phase with
    nothing left to do has shown nothing: it never graduates on that (it holds, or picks hosts, in
    phase_evidence_step)."""
    if successes < phase_evidence_needed(phase):
        return False
    if phase.successes_reached_at is None:
        phase.successes_reached_at = now
        UpgradePhase.objects.filter(pk=phase.pk).update(successes_reached_at=now)
        event_record(
            kind="upgrade.phase_succeeded",
            subject=upgrade,
            actor=ACTOR,
            reason=f"phase {phase.name}: {successes} hosts succeeded; soaking {phase.soak_s} s",
            pool_id=upgrade.pool_id,
        )
    if now < phase.successes_reached_at + dt.timedelta(seconds=phase.soak_s):
        return False
    # A stopped sliding train releases nothing, yet ticks its upgrades: its canary graduated with
    # canary hosts not even started. No query: the running visits' plans are read.
    if _unreleased_in(running, upgrade, phase):
        return False
    # Every host of the phase (and a catch-up of an earlier one) finished first: a slow canary host
    # that failed after the graduation counted against no phase, and the rollout had widened. An
    # EXISTS, asked only of a phase otherwise ready to graduate: too rare to be worth preparing.
    operations = VisitOperation.objects.filter(upgrade_id=upgrade.pk, phase__lte=phase.position)
    return not HostTask.objects.filter(
        operation_id__in=operations.values("operation_id"), state__in=sorted(OPEN_TASK_STATES)
    ).exists()


def _unreleased_in(running: list[Visit], upgrade: Upgrade, phase: UpgradePhase) -> bool:
    """Whether a running visit has hosts of the upgrade not released yet, planned in `phase` or an
    earlier one (the plan's "unreleased" entries: trains/services/visits.py, split_release)."""
    return any(
        entry["upgrade"] == upgrade.pk and entry["phase"] <= phase.position
        for visit in running
        for entry in visit.plan.get("unreleased", [])
    )


def _complete(upgrade: Upgrade, now: dt.datetime, reason: str) -> None:
    if Upgrade.objects.filter(pk=upgrade.pk, state=UpgradeState.ACTIVE).update(
        state=UpgradeState.COMPLETED, state_reason=reason, finished_at=now
    ):
        upgrade.state, upgrade.state_reason, upgrade.finished_at = UpgradeState.COMPLETED, reason, now
        promise = upgrade_promise(upgrade, now=now)
        event_record(
            kind="upgrade.completed",
            subject=upgrade,
            actor=ACTOR,
            reason=f"{reason}; {promise.text}",
            pool_id=upgrade.pool_id,
            data={"promise": promise.state, "late_s": None if promise.late_s is None else round(promise.late_s)},
        )


# --- 2. visits finishing ----------------------------------------------------------------------------
_VISIT_HAS_OPEN_TASK = PreparedQuery(  # asked of every running visit at every tick: compiled once
    lambda *, visit_id: (
        HostTask.objects.filter(
            operation__visit_link__visit_id=visit_id,
            operation__visit_link__catch_up=False,  # a repaired host's catch-up does not hold the visit
            state__in=OPEN_TASK_STATES,
        )
        .order_by()
        .values_list("id")[:1]
    ),
    visit_id=int,
)


def _finish_visits(train: Train, running: list[Visit], now: dt.datetime, report: TrainTickReport) -> list[Visit]:
    """End the running visits with no open task left; those still running."""
    still: list[Visit] = []
    for visit in running:
        if visit.plan.get("unreleased") or _VISIT_HAS_OPEN_TASK.rows(visit_id=visit.pk):
            still.append(visit)  # a sliding visit with hosts still to release is not done either
            continue
        tasks = HostTask.objects.filter(operation__visit_link__visit=visit)
        done = tasks.filter(state__in=[TaskState.DONE, TaskState.HANDED_OVER]).values("host_id").distinct().count()
        failed = tasks.filter(state=TaskState.FAILED).values("host_id").distinct().count()
        plan = visit.plan
        if "released" in plan:  # sliding: keep its hosts' time, which the sizings read every tick
            host_time = sliding_visit_ratios({visit.pk: train_overhead_s(train)}).get(visit.pk)
            plan = {**plan, HOST_TIME_KEY: list(host_time)} if host_time else plan
        visit_end(visit=visit, now=now, outcome=f"{done} hosts done, {failed} failed", plan=plan)
        report.events.append(f"visit {visit.pk} done")
    return still


# --- 3. autostop ------------------------------------------------------------------------------------
_OTHERS_OUT = PreparedQuery(  # the pool's hosts out for planned work other than the train's
    lambda *, train_id, pool_id: (
        Host.objects.filter(pool_id=pool_id, state__in=PLANNED_OUT_STATES)
        .filter(
            ~Exists(
                train_tasks(train_id).filter(
                    host_id=OuterRef("pk"), state__in=sorted(OPEN_TASK_STATES - {TaskState.PENDING})
                )
            )
        )
        # A host whose drain failed returns with its task already failed, under that task's lease:
        # still the train's (counted as other work, it autostopped the train for its own hosts).
        .filter(~Exists(Lease.objects.filter(host_id=OuterRef("pk"), active=True, host_task__in=train_tasks(train_id))))
        .order_by()
        .values_list("id")
    ),
    train_id=int,
    pool_id=int,
)


def _exhausted(train: Train, capacity: PoolCapacity) -> str:
    buffers = capacity.buffers
    name = train.pool.name
    if capacity.failure_out and capacity.failure_out >= buffers.failure:
        # Invariant 2: an approved emergency may use both buffers down to the hard floor (checked
        # below); it stops once more hosts are out broken than the failure buffer allows, not as
        # soon as they fill it (one broken host stopped it on a buffer of 1, the fix undelivered).
        # What its own fix breaks is bounded by its upgrade's failure policy (offboarding).
        if not train.emergency:
            return (
                f"failure buffer of pool {name} exhausted: {capacity.failure_out} hosts out broken, "
                f"buffer {buffers.failure}"
            )
        if capacity.failure_out > buffers.failure:
            return (
                f"failure buffer of pool {name} overrun: {capacity.failure_out} hosts out broken, "
                f"buffer {buffers.failure}"
            )
    floor = buffers.floor
    if train.emergency and train.pool.hard_floor_hosts is not None:
        floor = min(floor, train.pool.hard_floor_hosts)  # an approved emergency goes down to the hard floor
    if capacity.in_service < floor:
        return f"pool {name} is below its floor: {capacity.in_service} in service, floor {floor}"
    if train.emergency:
        # Invariant 2: an approved emergency may go past the planned buffer down to the hard floor
        # (admission bounds its work there: Headroom.remaining); the regular work that fills the
        # buffer must not stop it.
        return ""
    # The other work is among the hosts out for planned work: no need to count it unless they fill the buffer.
    if buffers.planned and capacity.planned_out >= buffers.planned:
        # One statement: counted apart, a pool tick committing in between (hosts back, tasks done)
        # made the train's own finished hosts look like other work and stopped it for nothing.
        others = len(_OTHERS_OUT.rows(train_id=train.pk, pool_id=train.pool_id))
        if others >= buffers.planned:
            return (
                f"planned buffer of pool {name} exhausted by other work: {others} hosts out, buffer {buffers.planned}"
            )
    return ""


def _autostop_step(train: Train, capacity: PoolCapacity, now: dt.datetime, report: TrainTickReport) -> None:
    if train.state == TrainState.RUNNING:
        why = _exhausted(train, capacity)
        if why and train_set_state(
            train=train, expected={TrainState.RUNNING}, new=TrainState.AUTOSTOPPED, reason=why, actor=ACTOR,
            kind="train.autostopped",
        ):  # fmt: skip
            event_record(kind="alert.train_autostopped", subject=train, actor=ACTOR, reason=why, pool_id=train.pool_id)
            report.events.append("autostopped")
        return
    if train.state != TrainState.AUTOSTOPPED or train.auto_resume_after_s is None:
        return
    if _exhausted(train, capacity):
        if train.recovered_since is not None:
            Train.objects.filter(pk=train.pk).update(recovered_since=None)
        return
    if train.recovered_since is None:
        Train.objects.filter(pk=train.pk).update(recovered_since=now)
        return
    if now - train.recovered_since >= dt.timedelta(seconds=train.auto_resume_after_s):
        train_set_state(
            train=train,
            expected={TrainState.AUTOSTOPPED},
            new=TrainState.RUNNING,
            reason=f"buffers recovered for {train.auto_resume_after_s} s",
            actor=ACTOR,
            kind="train.resumed",
        )
        report.events.append("auto-resumed")


# --- 5. forecast ------------------------------------------------------------------------------------
def _forecast_step(
    train: Train, active: list[_Active], capacity: PoolCapacity, now: dt.datetime, report: TrainTickReport
) -> None:
    # When the domains were last visited: not needed.
    forecasts, visits = trains_forecasts_with_visits([train], now=now, last_visits=False)
    forecast = forecasts[train.pk]
    cycle = forecast.cycle  # the open one
    if cycle is None:
        return
    key = played_key(train, visits[train.pk].values(), [a.upgrade for a in active], capacity)
    if key != cycle.played_key:  # its visits to come played again, only when what they depend on changed
        cycle_played_store(train=train, forecast=forecast, visits=visits[train.pk], key=key, now=now)
    if forecast.cycle_end != cycle.forecast_end_at:
        Cycle.objects.filter(pk=cycle.pk).update(forecast_end_at=forecast.cycle_end)
    # A forecast that misses its SLO has an end (cycle_end is None only before one is computed).
    if forecast.meets_slo or forecast.cycle_end is None or cycle.miss_alerted_at is not None:
        return
    Cycle.objects.filter(pk=cycle.pk).update(miss_alerted_at=now, miss_cause=forecast.miss_cause[:500])
    event_record(
        kind="alert.cycle_will_miss",
        subject=cycle,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=f"cycle {cycle.number} of train {train.name} is forecast to end at {forecast.cycle_end:%Y-%m-%d %H:%M} "
        f"UTC, after its deadline {cycle.deadline_at:%Y-%m-%d %H:%M} UTC: {forecast.miss_cause}",
        data={"train": train.pk, "forecast_end": forecast.cycle_end.isoformat()},
    )
    report.events.append("cycle will miss")
