"""Running a policy over the simulated world in virtual time, with the real services.

The loop moves a virtual clock from tick to tick (every `tick_minutes`, skipping ahead when nothing
is due) and at each tick does what the workers would do: finish the simulated work that is due,
let the policy act (the train tick, or a peer controller), reconcile the pools (the real
`pool_tick`), and claim new work. Host counts are sampled at every tick; they only change on ticks,
so the samples are the exact capacity curve.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.core.management.color import no_style
from django.db import connection
from django.db.models import Count

from fleet.models import FAILURE_OUT_STATES, PLANNED_OUT_STATES, Host, HostState, OptOutWindow
from opsplanner import clock
from opsplanner.dbconstraints import sqlite_triggers_lifted
from opsplanner.live import live_muted
from opsplanner.models import OPEN_TASK_STATES, Event, HostTask, SimulatorProfile, WorkItem, WorkState
from opsplanner.prepared import PreparedQuery
from opsplanner.progress import Progress
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.failures import host_failure_report
from opsplanner.services.simulator import (
    WORKER,
    simulated_work_claim,
    simulated_work_finish,
    simulated_work_step,
    simulator_host_spread_set,
)
from opsplanner.services.tick import pool_tick
from opsplanner.services.tick.run import pools_with_work
from simulation.config import Failure, SimulationConfig, Workload
from simulation.policies import POLICY_CLASSES, Policy
from simulation.runner import lane_analyze, lane_tables, lane_vacuum
from simulation.world import World, world_create
from trains.services.phase_hosts import live_hosts_carried

IDLE_STEP = dt.timedelta(hours=6)  # with work open but nothing due, look again this often (timers, soaks)
ROUNDS_PER_TICK = 6
CHECK_EVERY_TICKS = 500
VACUUM_EVERY = dt.timedelta(hours=6)  # of simulated time: the lane's tables vacuumed (runner.lane_vacuum)
ANALYZED_EVERY = dt.timedelta(hours=24)  # and their statistics refreshed, less often


class SimulationError(Exception):
    """The simulation cannot run (bad configuration, or not a scratch database)."""


class VirtualClock:
    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now


@dataclass
class Sample:
    at: dt.datetime
    counts: dict[int, tuple[int, int, int]]  # pool id -> (in service, planned out, failure out)


@dataclass
class RunLog:
    """What the loop saw, for the report: samples, invariant checks, failures applied or absorbed."""

    policy: Policy
    world: World
    samples: list[Sample] = field(default_factory=list)
    ticks: int = 0
    rounds: int = 0
    invariant_checks: int = 0
    violations: list[str] = field(default_factory=list)
    failures_applied: int = 0
    failures_absorbed: int = 0  # the host was already out (drained or broken) when it broke
    wall_seconds: float = 0.0


def scratch_database_check() -> None:
    """Refuse to run anywhere but a scratch database: a simulation empties the product tables."""
    name = str(connection.settings_dict["NAME"])
    base = name.rsplit("/", 1)[-1]
    if (
        base.endswith(("_sim", "_sim.sqlite3"))
        or base.startswith("test_")
        or connection.settings_dict.get("TEST", {}).get("NAME") == name
    ):
        return
    raise SimulationError(
        f"database {name!r} is not a simulation scratch database (its name must end in _sim); "
        "`manage.py simulate` creates one for you"
    )


def tables_reset() -> None:
    """Empty every product table (fleet, core, trains) of the scratch database."""
    scratch_database_check()
    statements = connection.ops.sql_flush(no_style(), lane_tables(), reset_sequences=True, allow_cascade=True)
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cursor:  # TRUNCATE refuses while deferred checks are pending
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    # SQLite empties tables with DELETE, which the events' append-only triggers refuse (PostgreSQL
    # uses TRUNCATE, which they allow): lifted for the reset of this scratch database only.
    with sqlite_triggers_lifted(connection, table=Event._meta.db_table):
        connection.ops.execute_sql_flush(statements)


@contextmanager
def simulated_time(start: dt.datetime) -> Iterator[VirtualClock]:
    """The virtual clock, with the workers' kicks and the live pushes switched off."""
    virtual = VirtualClock(start)
    kick = settings.KICK_TASKS
    settings.KICK_TASKS = False
    # The services log each tick and submission for operators; a simulation makes thousands a day.
    quiet = [logging.getLogger(name) for name in ("opsplanner.services", "trains.services")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.WARNING)
    try:
        with clock.use_clock(virtual), live_muted():
            yield virtual
    finally:
        settings.KICK_TASKS = kick
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


@contextmanager
def _host_spread_for_the_run() -> Iterator[None]:
    """The policy's setup sets the scenario's spread of durations per host (simulation/scenarios.py);
    it is the process's, so it ends with the run rather than stretch whatever the process runs next."""
    try:
        yield
    finally:
        simulator_host_spread_set(0.0)


def simulator_profile_set(config: SimulationConfig) -> SimulatorProfile:
    profile = SimulatorProfile.current()
    profile.seed = config.seed
    profile.drain_seconds = config.drain_minutes * 60
    profile.execute_seconds = config.execute_minutes * 60
    profile.verify_seconds = config.verify_minutes * 60
    profile.undrain_seconds = config.undrain_minutes * 60
    profile.slow_host_fraction = Decimal("0.02")
    profile.slow_drain_factor = 3.0
    profile.refusing_host_fraction = Decimal(0)
    profile.execute_failure_rate = Decimal(str(config.upgrade_failure_rate))
    profile.verify_failure_rate = Decimal(str(config.verify_failure_rate))
    profile.execute_by_kind = {}
    profile.batch_size = 5000
    profile.full_clean()
    profile.save()
    return profile


def policy_run(
    config: SimulationConfig,
    workload: Workload,
    policy_name: str,
    *,
    pools: list[int] | None = None,
    progress: Progress | None = None,
) -> RunLog:
    """Reset the scratch database, build the world (or the shard of it numbered in `pools`), and
    run one policy through the workload of those pools."""
    problems = config.errors()
    if problems:
        raise SimulationError("; ".join(problems.values()))
    started = time.perf_counter()
    tables_reset()
    # A what-if's lane counts its phases' hosts carried from live (the live fleet's ticks never do).
    carrying = live_hosts_carried(bool(config.live_snapshot))
    with simulated_time(config.start) as virtual, _host_spread_for_the_run(), carrying:
        if pools is not None:
            workload = Workload(
                arrivals=[a for a in workload.arrivals if a.pool in pools],
                failures=[f for f in workload.failures if f.pool in pools],
            )
        world = world_create(config, workload, lockstep=policy_name == "lockstep", pools=pools)
        simulator_profile_set(config)
        policy = POLICY_CLASSES[policy_name](config, world)
        policy.setup()
        log = RunLog(policy=policy, world=world)
        _loop(config, workload, virtual, log, progress)
        lane_analyze()  # a month of rows the planner thinks empty made this check take minutes
        log.violations.extend(str(v) for v in check_invariants())
        log.invariant_checks += 1
    log.wall_seconds = time.perf_counter() - started
    return log


def _loop(
    config: SimulationConfig, workload: Workload, virtual: VirtualClock, log: RunLog, progress: Progress | None
) -> None:
    tick = dt.timedelta(minutes=config.tick_minutes)
    arrivals, failures = list(workload.arrivals), list(workload.failures)
    boundaries = sorted(
        {at for pair in OptOutWindow.objects.values_list("starts_at", "ends_at") for at in pair if at > config.start}
    )
    total = (config.end - config.start).total_seconds()
    last_full = config.start - IDLE_STEP
    last_vacuum = last_analyzed = config.start
    next_due: dt.datetime | None = None
    wake: dt.datetime | None = None
    profile = SimulatorProfile.current()
    while virtual.now <= config.end:
        now = virtual.now
        # The policy acts where something changed (an arrival, a pool's tick); every pool at
        # least every IDLE_STEP, at opt-out boundaries and when the policy asks, for what depends on time alone.
        touched: set[int] | None = set()
        while arrivals and arrivals[0].at <= now:
            arrival = arrivals.pop(0)
            log.policy.arrive(arrival)
            touched.add(log.world.pool(arrival.pool).id)  # type: ignore[union-attr]
        if touched:  # an arrival tells the simulated executor its duration; nothing else changes the profile
            profile = SimulatorProfile.current()
        broke: set[int] = set()
        while failures and failures[0].at <= now:
            failure = failures.pop(0)
            if _fail(log, failure):
                broke.add(log.world.pool(failure.pool).id)
        if now - last_full >= IDLE_STEP or (boundaries and boundaries[0] <= now) or (wake and last_full < wake <= now):
            touched, last_full = None, now
        moved = _settle(log, touched, profile, due=next_due is not None and next_due <= now, broke=broke)
        if moved or broke or not log.samples:
            _sample(log, now)
        log.ticks += 1
        if now - last_vacuum >= VACUUM_EVERY:
            analyze = now - last_analyzed >= ANALYZED_EVERY
            lane_vacuum(analyze=analyze)
            last_vacuum = now
            last_analyzed = now if analyze else last_analyzed
        if log.ticks % CHECK_EVERY_TICKS == 0:
            log.violations.extend(str(v) for v in check_invariants())
            log.invariant_checks += 1
        if progress:
            progress.update(
                f"{log.policy.name} day {(now - config.start).total_seconds() / 86_400:.1f}",
                round((now - config.start).total_seconds()),
                round(total),
            )
        boundaries = [b for b in boundaries if b > now]
        next_due = _next_due()
        wake = log.policy.wakes_at()  # on time alone (an autostopped train's countdown): every pool then
        upcoming = [
            t
            for t in (
                next_due,
                arrivals[0].at if arrivals else None,
                failures[0].at if failures else None,
                boundaries[0] if boundaries else None,
                wake if wake and wake > now else None,
            )
            if t
        ]
        # Open work looks again within IDLE_STEP: asked only when nothing else comes sooner.
        if (not upcoming or min(upcoming) > now + IDLE_STEP) and _work_open(log):
            upcoming.append(now + IDLE_STEP)
        if not upcoming:
            break
        target = max(min(upcoming), now + tick)
        # Ticks fall on the grid: a change waits for the next tick, as it would with beat.
        steps = math.ceil((target - config.start) / tick)
        virtual.now = config.start + steps * tick


def _settle(log: RunLog, touched: set[int] | None, profile: SimulatorProfile, *, due: bool, broke: set[int]) -> bool:
    """Rounds of work, policy and pool ticks at one instant until nothing more happens now.

    Event-driven, so a month of a large fleet runs in minutes: the policy acts for the pools in
    `touched` (None: all), then for pools where tasks finished; a pool is ticked when its work
    finished, when the policy gave it work, or when its previous tick changed something (all pools
    with work when touched is None). The skipped ticks would have found nothing to do. True when a
    host changed state."""
    everything = touched is None
    claim = everything or bool(_ANY_READY.rows())
    finish = due or everything  # what earlier instants claimed is due from `due` on
    hosts_moved = False
    for _ in range(ROUNDS_PER_TICK):
        log.rounds += 1
        finished = _work_step(profile, claim=claim, finish=finish)
        acted = log.policy.step(touched) if everything or touched else set()
        # A tick admits after it returns hosts, so a pool needs another only for new work or outcomes.
        pools_due = set(pools_with_work()) if everything else _pools_with_finished_work() | acted | broke
        broke = set()  # a pool where a host broke is ticked at once: its repair is admitted
        # The policy acts again where it changed something, as its next beat would seconds later: a
        # train that ended its cycle opens the next, a queue that finished a rollout starts the next.
        # Without it they waited for the next arrival or IDLE_STEP, up to 6 idle hours each time.
        everything, touched, claim = False, set(acted), False
        for pool_id in sorted(pools_due):
            counts = pool_tick(pool_id=pool_id, kick=False).counts
            claim |= counts.work_items_created > 0
            hosts_moved |= counts.hosts_moved > 0
            if counts.tasks_finished:
                touched.add(pool_id)
        # Due in the next round: only what it claims, or what a finish stopped at its batch left.
        finish = claim and finished >= profile.batch_size
        if not (finished or acted or claim or touched):
            return hosts_moved
    simulated_work_step(profile=profile)  # claim what the last round created, so it becomes due
    return hosts_moved


def _work_step(profile: SimulatorProfile, *, claim: bool, finish: bool) -> int:
    """simulated_work_step without the transactions that would find nothing: claim only when work
    is ready, finish only when some is due (`finish`: claimed at an earlier instant, or left by a
    finish that stopped at its batch; or claimed now with no duration). How many it finished."""
    first_due = simulated_work_claim(profile=profile) if claim else None
    if finish or (first_due is not None and first_due <= clock.now()):
        return simulated_work_finish(profile=profile)
    return 0


# What the loop asks at every instant or round, compiled once (opsplanner/prepared.py).
_FINISHED_POOLS = PreparedQuery(
    lambda: (
        WorkItem.objects.filter(state__in=[WorkState.DONE, WorkState.FAILED], consumed_at__isnull=True)
        .order_by()
        .values_list("pool_id")
        .distinct()
    )
)
_ANY_READY = PreparedQuery(lambda: WorkItem.objects.filter(state=WorkState.READY).order_by().values_list("id")[:1])
_NEXT_DUE = PreparedQuery(
    lambda: (
        WorkItem.objects.filter(state=WorkState.RUNNING, claimed_by=WORKER, due_at__isnull=False)
        .order_by("due_at")
        .values_list("due_at")[:1]
    )
)
_ANY_OPEN_TASK = PreparedQuery(
    lambda: HostTask.objects.filter(state__in=OPEN_TASK_STATES).order_by().values_list("id")[:1]
)
_HOST_COUNTS = PreparedQuery(
    lambda: (
        Host.objects.order_by().values("pool_id", "state").annotate(n=Count("id")).values_list("pool_id", "state", "n")
    )
)


def _pools_with_finished_work() -> set[int]:
    return {pool_id for (pool_id,) in _FINISHED_POOLS.rows()}


def _fail(log: RunLog, failure: Failure) -> bool:
    host_id = log.world.pool(failure.pool).host_ids[failure.host_index]
    state = Host.objects.values_list("state", flat=True).get(pk=host_id)
    if (
        state != HostState.IN_SERVICE
        or HostTask.objects.filter(host_id=host_id, state__in=OPEN_TASK_STATES).exclude(state="pending").exists()
    ):
        log.failures_absorbed += 1
        return False
    host_failure_report(host_id=host_id, reason="simulated hardware failure", actor="simulator")
    log.failures_applied += 1
    return True


def _next_due() -> dt.datetime | None:
    return next((at for (at,) in _NEXT_DUE.rows()), None)


def _work_open(log: RunLog) -> bool:
    if _ANY_OPEN_TASK.rows():
        return True
    policy = log.policy
    if policy.name.startswith("trains"):  # trains, trains-sliding
        from trains.models import Upgrade, UpgradeState

        return Upgrade.objects.filter(state=UpgradeState.ACTIVE).exists()
    return any(q.current or q.waiting for q in getattr(policy, "queues", {}).values())


def _sample(log: RunLog, at: dt.datetime) -> None:
    counts: dict[int, list[int]] = {pool.id: [0, 0, 0] for pool in log.world.pools}
    for pool_id, state, n in _HOST_COUNTS.rows():
        slot = (
            0
            if state == HostState.IN_SERVICE
            else 1
            if state in PLANNED_OUT_STATES
            else 2
            if state in FAILURE_OUT_STATES
            else None
        )
        if slot is not None:
            counts[pool_id][slot] += n
    frozen = {pool_id: (c[0], c[1], c[2]) for pool_id, c in counts.items()}
    if not log.samples or log.samples[-1].counts != frozen:
        log.samples.append(Sample(at=at, counts=frozen))
