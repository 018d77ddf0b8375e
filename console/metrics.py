"""Prometheus metrics, computed from the database at scrape time (text exposition format 0.0.4).

Every number is read from the tables the core writes, so any web process answers the same whatever
worker did the work, with no per-process counters and no multiprocess files. The reads are
set-based: a fixed number of queries whatever the fleet size (tests pin it). Nothing scans a whole
history table: current states come from open rows (index probes per pool), and what happened
lately (admissions, failures, finished work items) from the events of the last `RECENT_WINDOW`,
a range of the (kind, created_at) index. Those are gauges over a sliding window, not counters:
alert on their value, do not `rate()` them.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db.models import BigIntegerField, Count, DurationField, ExpressionWrapper, F, Max, Min, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from fleet.models import CapacityReservation, HostState, InstalledVersion
from fleet.models.hosts import RETIRED
from fleet.selectors.capacity import pool_capacities
from opsplanner import clock
from opsplanner.models import (
    OPEN_TASK_STATES,
    Adapter,
    Event,
    HostTask,
    Operation,
    OperationKind,
    TaskState,
    WaitingCode,
    WorkerHeartbeat,
    WorkItem,
    WorkKind,
    WorkState,
)
from trains.models import Train, TrainState, Upgrade, UpgradeState
from trains.selectors_promise import PromiseState, upgrade_promise

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RECENT_WINDOW = dt.timedelta(minutes=15)
PROMISES_WINDOW = dt.timedelta(days=7)  # completed upgrades counted in opsplanner_upgrade_promises
# Label value for a pending task without a waiting code (an empty label means "absent"). Tasks get
# their queue reason when submitted, so a non-zero count here is a task that waits in silence.
NOT_WAITING = "none"
# Open states in lifecycle order (OPEN_TASK_STATES is a set).
OPEN_TASK_ORDER = [state for state in TaskState.values if state in OPEN_TASK_STATES]
OPEN_WORK_STATES = [WorkState.WAITING, WorkState.READY, WorkState.RUNNING]
FINISHED_ITEM_EVENTS = ["work_item.done", "work_item.failed"]


# --- exposition -------------------------------------------------------------------------------------
@dataclass
class MetricFamily:
    """One metric: its name, help, type and samples (labels, value)."""

    name: str
    help: str
    type: str = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families: Iterable[MetricFamily]) -> str:
    """The text exposition format 0.0.4: HELP and TYPE once per family, then its samples."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for labels, value in family.samples:
            if labels:
                pairs = ",".join(f'{key}="{_escape_label(str(val))}"' for key, val in labels.items())
                lines.append(f"{family.name}{{{pairs}}} {format_value(value)}")
            else:
                lines.append(f"{family.name} {format_value(value)}")
    return "\n".join(lines) + "\n"


# --- collection -------------------------------------------------------------------------------------
def collect() -> list[MetricFamily]:
    """Every family, read now. About ten queries, whatever the number of pools, hosts or tasks."""
    started = time.perf_counter()
    now = clock.now()
    since = now - RECENT_WINDOW
    families, pools = _pool_families(now)
    families.append(_drift_family(pools))
    families += _task_families(pools)
    families += _train_families(pools)
    families.append(_promise_family(pools, now))
    families += _recent_task_families(pools, since)
    families += _work_item_families(now, since)
    families += _worker_families(now)
    took = MetricFamily("opsplanner_metrics_collect_seconds", "Time this scrape spent reading the database.")
    took.add(time.perf_counter() - started)
    families.append(took)
    return families


def _pool_label(pools: dict[int, str], pool_id: int | None) -> str:
    return pools.get(pool_id, str(pool_id)) if pool_id is not None else ""


def _pool_families(now: dt.datetime) -> tuple[list[MetricFamily], dict[int, str]]:
    """Hosts by state and the buffers they count against, per pool: two queries."""
    capacities = pool_capacities()
    pools = {capacity.pool.pk: capacity.pool.name for capacity in capacities}
    reserved = dict(
        CapacityReservation.objects.filter(cancelled_at__isnull=True, starts_at__lte=now, ends_at__gt=now)
        .values("pool_id")
        .annotate(hosts=Max("min_hosts_in_service"))
        .values_list("pool_id", "hosts")
    )
    hosts = MetricFamily("opsplanner_pool_hosts", "Hosts per pool and host state.")
    in_service = MetricFamily("opsplanner_pool_in_service_hosts", "Hosts in service.")
    planned_out = MetricFamily(
        "opsplanner_pool_planned_out_hosts", "Hosts out for planned work (draining, maintenance, verifying, returning)."
    )
    failure_out = MetricFamily("opsplanner_pool_failure_out_hosts", "Hosts out broken (failed, repair, escalated).")
    planned_buffer = MetricFamily("opsplanner_pool_planned_buffer_hosts", "Size of the planned-maintenance buffer.")
    failure_buffer = MetricFamily("opsplanner_pool_failure_buffer_hosts", "Size of the failure buffer.")
    floor = MetricFamily("opsplanner_pool_floor_hosts", "Hosts that must stay in service (total minus buffers).")
    reservation = MetricFamily(
        "opsplanner_pool_reserved_hosts", "Hosts the largest active capacity reservation keeps in service."
    )
    for capacity in capacities:
        pool = capacity.pool.name
        for state in HostState.values:
            hosts.add(capacity.by_state.get(state, 0), pool=pool, state=state)
        buffers = capacity.buffers
        in_service.add(capacity.in_service, pool=pool)
        planned_out.add(capacity.planned_out, pool=pool)
        failure_out.add(capacity.failure_out, pool=pool)
        planned_buffer.add(buffers.planned, pool=pool)
        failure_buffer.add(buffers.failure, pool=pool)
        floor.add(buffers.floor, pool=pool)
        reservation.add(reserved.get(capacity.pool.pk, 0), pool=pool)
    return [hosts, in_service, planned_out, failure_out, planned_buffer, failure_buffer, floor, reservation], pools


def _drift_family(pools: dict[int, str]) -> MetricFamily:
    """Hosts whose last version report differed from what OpsPlanner believed (fleet.services.host_versions):
    one query, a probe of the partial index on drifted rows."""
    drift = MetricFamily(
        "opsplanner_hosts_with_version_drift",
        "Hosts per pool running a version other than what OpsPlanner believed, as they last reported it.",
    )
    counts = dict(
        InstalledVersion.objects.filter(drift_from__isnull=False)
        .exclude(host__state=RETIRED)
        .values("host__pool_id")
        .annotate(n=Count("host_id", distinct=True))
        .values_list("host__pool_id", "n")
    )
    for pool_id, pool in pools.items():
        drift.add(counts.get(pool_id, 0), pool=pool)
    return drift


def _task_families(pools: dict[int, str]) -> list[MetricFamily]:
    """Open host tasks by state, and pending ones by why they wait: one query over open rows only
    (pool and state lead the index, so the terminal history is never read)."""
    rows = (
        HostTask.objects.filter(pool_id__any=list(pools), state__in=OPEN_TASK_ORDER)
        .values("pool_id", "state", "waiting_code")
        .annotate(n=Count("id"))
        .values_list("pool_id", "state", "waiting_code", "n")
    )
    by_state: dict[tuple[int, str], int] = defaultdict(int)
    waiting: dict[tuple[int, str], int] = defaultdict(int)
    for pool_id, state, code, n in rows:
        by_state[(pool_id, state)] += n
        if state == TaskState.PENDING:
            waiting[(pool_id, code or NOT_WAITING)] += n
    tasks = MetricFamily("opsplanner_host_tasks", "Open host tasks per pool and state.")
    pending = MetricFamily(
        "opsplanner_pending_tasks",
        f"Pending host tasks per pool and the reason the admission gave for not admitting them "
        f'(waiting_code; "{NOT_WAITING}": no reason recorded, which should stay 0).',
    )
    codes = [code or NOT_WAITING for code in WaitingCode.values]
    for pool_id, pool in pools.items():
        for state in OPEN_TASK_ORDER:
            tasks.add(by_state.pop((pool_id, state), 0), pool=pool, state=state)
        for code in codes:
            pending.add(waiting.pop((pool_id, code), 0), pool=pool, waiting_code=code)
    # Codes this module does not know yet (added later) still show up.
    for (pool_id, code), n in sorted(waiting.items()):
        pending.add(n, pool=_pool_label(pools, pool_id), waiting_code=code)
    return [tasks, pending]


def _train_families(pools: dict[int, str]) -> list[MetricFamily]:
    rows = Train.objects.values("pool_id", "state").annotate(n=Count("id")).values_list("pool_id", "state", "n")
    counts = {(pool_id, state): n for pool_id, state, n in rows}
    trains = MetricFamily("opsplanner_trains", "Maintenance trains per pool and state.")
    for pool_id, pool in pools.items():
        for state in TrainState.values:
            trains.add(counts.get((pool_id, state), 0), pool=pool, state=state)
    return [trains]


def _promise_family(pools: dict[int, str], now: dt.datetime) -> MetricFamily:
    """How each upgrade's promise (its first forecast) stands: the active upgrades, and those
    completed within PROMISES_WINDOW, classified by upgrade_promise (one query on a small table)."""
    fields = ["pool_id", "state", "finished_at", "promise_made_at", "promised_cycle", "promised_at"]
    upgrades = Upgrade.objects.filter(emergency=False).filter(
        Q(state=UpgradeState.ACTIVE) | Q(state=UpgradeState.COMPLETED, finished_at__gte=now - PROMISES_WINDOW)
    )
    counts: dict[tuple[int, str], int] = defaultdict(int)
    for upgrade in upgrades.only(*fields).order_by():
        counts[(upgrade.pool_id, upgrade_promise(upgrade, now=now).state)] += 1
    family = MetricFamily(
        "opsplanner_upgrade_promises",
        "Active upgrades, and those completed in the last 7 days, per pool and how the promise of their first "
        "forecast stands (pending, overdue, kept, missed, ...).",
    )
    for pool_id, pool in pools.items():
        for state in PromiseState.values:
            family.add(counts.get((pool_id, state), 0), pool=pool, promise=state)
    return family


def _recent_task_families(pools: dict[int, str], since: dt.datetime) -> list[MetricFamily]:
    """Admissions and failures of host tasks in the window, from their events: one query on the
    (kind, created_at) index, and one for the kinds of the few operations that had failures."""
    rows = list(
        Event.objects.filter(
            kind="task.state_changed", created_at__gte=since, data__to__in=[TaskState.ADMITTED, TaskState.FAILED]
        )
        .annotate(to_state=KT("data__to"), operation=Cast(KT("data__operation"), BigIntegerField()))
        .values("pool_id", "to_state", "operation")
        .annotate(n=Count("id"))
        .values_list("pool_id", "to_state", "operation", "n")
    )
    failed_operations = {op for _, state, op, _ in rows if state == TaskState.FAILED and op is not None}
    kinds = dict(Operation.objects.filter(pk__in=failed_operations).values_list("id", "kind"))
    admitted: dict[int | None, int] = defaultdict(int)  # an event's pool_id may be empty
    failed: dict[tuple[int | None, str], int] = defaultdict(int)
    for pool_id, state, operation, n in rows:
        if state == TaskState.ADMITTED:
            admitted[pool_id] += n
        else:
            failed[(pool_id, kinds.get(operation, "unknown"))] += n
    window = MetricFamily("opsplanner_recent_window_seconds", "Length of the window the opsplanner_recent_* cover.")
    window.add(int(RECENT_WINDOW.total_seconds()))
    admissions = MetricFamily(
        "opsplanner_recent_task_admissions", "Host tasks admitted (pending to admitted) in the recent window, per pool."
    )
    failures = MetricFamily(
        "opsplanner_recent_task_failures", "Host tasks that failed in the recent window, per pool and operation kind."
    )
    for pool_id, pool in pools.items():
        admissions.add(admitted.get(pool_id, 0), pool=pool)
        for kind in OperationKind.values:
            failures.add(failed.pop((pool_id, kind), 0), pool=pool, operation_kind=kind)
    for (pool_id, kind), n in sorted(failed.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        failures.add(n, pool=_pool_label(pools, pool_id), operation_kind=kind)
    return [window, admissions, failures]


# Per (kind, adapter, latency name): [items measured, total seconds, longest seconds], over both outcomes.
_Latencies = dict[tuple[str, str, str], list[float]]


def _work_item_families(now: dt.datetime, since: dt.datetime) -> list[MetricFamily]:
    """Open work items (the queues executors and drainers claim from) and the latencies of the items
    finished in the window: two queries, on open rows and on the window's finishing events."""
    open_counts, oldest_ready = _open_work_items()
    finished, latency = _finished_work_items(since)
    items = MetricFamily("opsplanner_work_items", "Open work items per kind, adapter and state.")
    oldest = MetricFamily(
        "opsplanner_work_item_oldest_ready_age_seconds",
        "Age of the oldest ready (unclaimed) work item per kind and adapter; 0 when none is ready.",
    )
    done = MetricFamily(
        "opsplanner_recent_work_items_finished", "Work items finished in the recent window, per kind, adapter, outcome."
    )
    stats = _latency_families()
    for kind in WorkKind.values:
        for adapter in Adapter.values:
            for state in OPEN_WORK_STATES:
                items.add(open_counts.get((kind, adapter, state), 0), kind=kind, adapter=adapter, state=state)
            since_ready = oldest_ready.get((kind, adapter))
            oldest.add(max((now - since_ready).total_seconds(), 0.0) if since_ready else 0, kind=kind, adapter=adapter)
            for state in (WorkState.DONE, WorkState.FAILED):
                done.add(finished.get((kind, adapter, state), 0), kind=kind, adapter=adapter, outcome=state)
            _add_latencies(stats, latency, kind=kind, adapter=adapter)
    return [items, oldest, done, *(family for pair in stats.values() for family in pair)]


def _open_work_items() -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str], dt.datetime]]:
    """({(kind, adapter, state): open items}, {(kind, adapter): creation of the oldest ready one}): one query."""
    open_rows = (
        WorkItem.objects.filter(state__in=OPEN_WORK_STATES)
        .values("kind", "adapter", "state")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .values_list("kind", "adapter", "state", "n", "oldest")
    )
    open_counts: dict[tuple[str, str, str], int] = {}
    oldest_ready: dict[tuple[str, str], dt.datetime] = {}
    for kind, adapter, state, n, oldest in open_rows:
        open_counts[(kind, adapter, state)] = n
        if state == WorkState.READY and oldest is not None:
            oldest_ready[(kind, adapter)] = oldest
    return open_counts, oldest_ready


def _finished_work_items(since: dt.datetime) -> tuple[dict[tuple[str, str, str], int], _Latencies]:
    """({(kind, adapter, outcome): items finished since}, their wait and run latencies): one query,
    the items picked by their finishing events so the work item table is not scanned."""
    finished_ids = Event.objects.filter(
        kind__in=FINISHED_ITEM_EVENTS, created_at__gte=since, subject_type="opsplanner.workitem"
    ).values("subject_id")
    wait = ExpressionWrapper(F("claimed_at") - F("created_at"), output_field=DurationField())
    run = ExpressionWrapper(F("finished_at") - F("claimed_at"), output_field=DurationField())
    claimed = Q(claimed_at__isnull=False)
    ran = Q(claimed_at__isnull=False, finished_at__isnull=False)
    finished_rows = (
        WorkItem.objects.filter(pk__in=finished_ids, state__in=[WorkState.DONE, WorkState.FAILED])
        .values("kind", "adapter", "state")
        .annotate(
            n=Count("id"),
            wait_n=Count("id", filter=claimed),
            wait_sum=Sum(wait, filter=claimed),
            wait_max=Max(wait, filter=claimed),
            run_n=Count("id", filter=ran),
            run_sum=Sum(run, filter=ran),
            run_max=Max(run, filter=ran),
        )
        .values_list("kind", "adapter", "state", "n", "wait_n", "wait_sum", "wait_max", "run_n", "run_sum", "run_max")
    )
    finished: dict[tuple[str, str, str], int] = {}
    latency: _Latencies = {}
    for kind, adapter, state, n, *measured in finished_rows:
        finished[(kind, adapter, state)] = n
        for name, (count, total, top) in (("wait", measured[:3]), ("run", measured[3:])):
            if not count or total is None or top is None:
                continue
            entry = latency.setdefault((kind, adapter, name), [0, 0.0, 0.0])
            entry[0] += count
            entry[1] += total.total_seconds()
            entry[2] = max(entry[2], top.total_seconds())
    return finished, latency


def _latency_families() -> dict[str, tuple[MetricFamily, MetricFamily]]:
    """{latency name: (its mean family, its max family)}, wait before run."""
    stats: dict[str, tuple[MetricFamily, MetricFamily]] = {}
    for name, what in (("wait", "creation (ready) to the last claim"), ("run", "the last claim to the outcome")):
        stats[name] = (
            MetricFamily(
                f"opsplanner_recent_work_item_{name}_mean_seconds",
                f"Mean seconds from {what}, over work items finished in the recent window.",
            ),
            MetricFamily(
                f"opsplanner_recent_work_item_{name}_max_seconds",
                f"Longest seconds from {what}, over work items finished in the recent window.",
            ),
        )
    return stats


def _add_latencies(
    stats: dict[str, tuple[MetricFamily, MetricFamily]], latency: _Latencies, *, kind: str, adapter: str
) -> None:
    for name, (mean_family, max_family) in stats.items():
        seconds = latency.get((kind, adapter, name))
        if seconds is None:
            continue  # nothing finished: no latency, rather than a misleading 0
        count, total, top = seconds
        mean_family.add(total / count, kind=kind, adapter=adapter)
        max_family.add(top, kind=kind, adapter=adapter)


def _worker_families(now: dt.datetime) -> list[MetricFamily]:
    """Seconds since each worker's last heartbeat, and how many count as live (as /healthz/workers)."""
    live_within = 3 * settings.WORKER_HEARTBEAT_SECONDS
    age = MetricFamily("opsplanner_worker_heartbeat_age_seconds", "Seconds since the worker last stamped a heartbeat.")
    live = MetricFamily(
        "opsplanner_workers_live",
        f"Workers whose last heartbeat is at most {live_within} s old (three beat intervals).",
    )
    count = 0
    for worker, seen in WorkerHeartbeat.objects.order_by("worker").values_list("worker", "last_seen_at"):
        seconds = max((now - seen).total_seconds(), 0.0)
        age.add(seconds, worker=worker)
        count += seconds <= live_within
    live.add(count)
    return [age, live]
