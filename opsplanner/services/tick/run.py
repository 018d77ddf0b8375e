"""Running the tick: per pool under a non-blocking row lock, one transaction each, under a time budget."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import Exists, OuterRef

from fleet.models import Pool
from opsplanner import clock
from opsplanner.events import rolled_back_tick_record
from opsplanner.live import LiveBatch, live_batched
from opsplanner.models import OPEN_TASK_STATES, HostTask, WorkItem, WorkState
from opsplanner.prepared import PreparedModels
from opsplanner.services.tick.admission import admit
from opsplanner.services.tick.advance import advance, expire
from opsplanner.services.tick.closing import operations_close_finished
from opsplanner.services.tick.context import (
    WORK_ITEM_COLUMNS,
    ConcurrentChange,
    IllegalTransition,
    TickContext,
    TickCounts,
)

log = logging.getLogger(__name__)

ADVANCE_BUDGET = 20_000
ADMIT_BUDGET = 5_000
_ADAPTER = WORK_ITEM_COLUMNS.index("adapter")  # in the rows of new work items
TICK_LANES = 2  # pools ticked at once by fleet_tick, each on its own database connection
_POOL_LOCKED = PreparedModels(  # the tick's first statement, every few seconds for every pool: compiled once
    lambda *, pool_id: (
        Pool.objects.select_for_update(skip_locked=True, no_key=True).filter(pk=pool_id).order_by("pk")[:1]
    ),
    pool_id=int,
)


@dataclass
class TickReport:
    pool_id: int
    skipped: bool = False
    retried: bool = False
    seconds: float = 0.0
    ticked: bool = False  # the tick ran to its end (not skipped, not rolled back before its counts)
    counts: TickCounts = field(default_factory=TickCounts)
    new_simulated_work: bool = False


def pool_tick(
    *, pool_id: int, advance_budget: int = ADVANCE_BUDGET, admit_budget: int = ADMIT_BUDGET, kick: bool = True
) -> TickReport:
    """Reconcile one pool. Harmless to run twice at once: the second finds the pool locked and skips.
    With kick, new simulated work wakes the simulator when the tick commits (fleet_tick kicks once
    for all its pools instead)."""
    started = time.perf_counter()
    report = TickReport(pool_id=pool_id)
    try:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # A tick only reconciles what the database holds: if a crash loses its commit, the next
                # tick does the same work again, and anything that saw its result and committed
                # (a claim, a report) flushed the tick's WAL with its own. So it need not wait.
                # Foreign keys checked as each statement ends, not all at the commit: the same
                # checks, but deferred ones of thousands of new leases and work items cost PostgreSQL
                # about twice as much (measured: 0.4-0.6 s at the commit of a 5,000-host tick).
                # One round trip for both.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit = off; SET CONSTRAINTS ALL IMMEDIATE")
            pool = next(iter(_POOL_LOCKED.objects(pool_id=pool_id)), None)
            if pool is None:
                report.skipped = True
                return report
            ctx = TickContext(pool=pool, now=clock.now())
            expire(ctx)
            advance(ctx, budget=advance_budget)
            admit(ctx, budget=admit_budget)
            operations_close_finished(ctx=ctx)
            ctx.flush()
            report.ticked, report.counts = True, ctx.counts
            report.new_simulated_work = any(item[_ADAPTER] == "simulated" for item in ctx.new_items)
            if report.new_simulated_work and kick and settings.KICK_TASKS:
                transaction.on_commit(_kick_simulator)
    except (ConcurrentChange, IllegalTransition, IntegrityError) as change:
        # Someone changed rows this tick read, or the tick tried a host move the lifecycle forbids;
        # nothing was written. The next tick retries.
        log.warning("tick of pool %s rolled back: %s", pool_id, change, extra={"pool_id": pool_id})
        report.retried = True
        _record_conflict(pool_id, str(change))
    report.seconds = time.perf_counter() - started
    if report.ticked:
        log.info(
            "pool %s ticked",
            pool_id,
            extra={"pool_id": pool_id, "seconds": round(report.seconds, 4), "counts": report.counts.as_dict()},
        )
    return report


def _record_conflict(pool_id: int, message: str) -> None:
    rolled_back_tick_record(
        kind="tick.rolled_back", subject_type="fleet.pool", subject_id=pool_id, pool_id=pool_id, reason=message
    )


def pools_with_work() -> list[int]:
    """Pools where a tick could change something: open tasks, open work items (to expire or to
    time out), or finished work to act on. Index probes, one query."""
    open_tasks = HostTask.objects.filter(
        pool_id=OuterRef("pk"),
        state__in=OPEN_TASK_STATES,
    )
    open_items = WorkItem.objects.filter(
        pool_id=OuterRef("pk"), state__in=[WorkState.WAITING, WorkState.READY, WorkState.RUNNING]
    )
    finished_work = WorkItem.objects.filter(
        pool_id=OuterRef("pk"), state__in=[WorkState.DONE, WorkState.FAILED], consumed_at__isnull=True
    )
    return list(
        Pool.objects.filter(Exists(open_tasks) | Exists(open_items) | Exists(finished_work))
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def fleet_tick(*, time_budget_s: float = 10.0, lanes: int | None = None) -> list[TickReport]:
    """Tick every pool with work, one transaction each, until the time budget is spent. The order
    is shuffled so that no pool waits behind the others tick after tick. Pools are ticked in
    `lanes` (settings.TICK_LANES, default TICK_LANES) at once, each lane on its own connection, so
    that PostgreSQL writes one pool's tick while Python works out another's."""
    deadline = time.perf_counter() + time_budget_s
    pool_ids = pools_with_work()
    random.shuffle(pool_ids)
    lanes = _lane_count(lanes, len(pool_ids))
    # Each pool's commit announces its live updates; sent once when every pool is done, not per commit.
    with live_batched() as batch:
        if lanes > 1:
            reports = _tick_in_lanes(pool_ids, lanes=lanes, deadline=deadline, batch=batch)
        else:
            reports = []
            for pool_id in pool_ids:
                if time.perf_counter() > deadline:
                    break
                reports.append(pool_tick(pool_id=pool_id, kick=False))
        operations_close_finished()
    if settings.KICK_TASKS and any(report.new_simulated_work for report in reports):
        transaction.on_commit(_kick_simulator)  # once, after every pool committed (at once outside a transaction)
    return reports


def _lane_count(requested: int | None, pools: int) -> int:
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        # SQLite has one writer at a time; inside the caller's transaction only its own connection
        # sees what it wrote.
        return 1
    wanted = requested if requested is not None else getattr(settings, "TICK_LANES", TICK_LANES)
    return max(1, min(wanted, pools))


def _tick_in_lanes(pool_ids: list[int], *, lanes: int, deadline: float, batch: LiveBatch) -> list[TickReport]:
    """Each lane takes the next pool until none is left or the time is spent: this thread is one
    lane, the others are threads with their own connections, closed when they finish."""
    queue = iter(pool_ids)
    taking = threading.Lock()
    reports: dict[int, TickReport] = {}
    errors: list[BaseException] = []

    def lane(own_connection: bool) -> None:
        try:
            with live_batched(batch):  # this lane's commits are announced with the others, at the end
                while time.perf_counter() <= deadline and not errors:
                    with taking:
                        pool_id = next(queue, None)
                    if pool_id is None:
                        return
                    reports[pool_id] = pool_tick(pool_id=pool_id, kick=False)
        except BaseException as error:  # noqa: BLE001 - re-raised below, once every lane has stopped
            errors.append(error)
        finally:
            if own_connection:
                connections.close_all()

    helpers = [threading.Thread(target=lane, args=(True,), name=f"tick-lane-{n}") for n in range(1, lanes)]
    for helper in helpers:
        helper.start()
    lane(False)
    for helper in helpers:
        helper.join()
    if errors:
        raise errors[0]
    return [reports[pool_id] for pool_id in pool_ids if pool_id in reports]


def _kick_simulator() -> None:
    from opsplanner.tasks import simulated_work_step

    simulated_work_step.delay()
