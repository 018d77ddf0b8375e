"""What a run cost, read from the scratch database and the run log right after the run: capacity
out, drains, interrupted jobs and the capacity they strand, rollouts, cycles and visits, per pool,
as plain JSON-able data (shards of one simulation run in separate processes and are merged by the
report)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.db.models import F, Q

from fleet.models import HostState
from opsplanner.models import Event, HostTask
from simulation.config import SimulationConfig
from simulation.engine import RunLog
from simulation.rollout_measures import rollout_measures_add


def hours(config: SimulationConfig, at: dt.datetime | None) -> float | None:
    return None if at is None else round((at - config.start).total_seconds() / 3600, 4)


def run_measure(config: SimulationConfig, log: RunLog) -> dict[str, Any]:
    pools = {pool.id: _pool_base(config, pool.name) for pool in log.world.pools}
    _capacity(config, log, pools)
    _drains_and_interruptions(config, log, pools)
    _trains(config, pools)
    rollout_measures_add(config, log, pools)
    for rollout in log.policy.rollouts():
        pool = next(p for p in pools.values() if p["name"] == rollout.pool)
        pool["rollouts"].append(
            [
                rollout.component,
                rollout.version,
                hours(config, rollout.arrived),
                hours(config, rollout.finished),
                rollout.outcome,
            ]
        )
        # Aligned with "rollouts": the first forecast of each (trains; None and "" for the peers).
        pool["forecasts"].append([hours(config, rollout.forecast_at), rollout.forecast_code])
    for kind, key in (("train.autostopped", "autostops"), ("upgrade.offboarded", "offboardings")):
        for pool_id in Event.objects.filter(kind=kind).values_list("pool_id", flat=True):
            if pool_id in pools:
                pools[pool_id][key] += 1
    return {
        "policy": log.policy.name,
        "label": log.policy.label,
        "wall_seconds": round(log.wall_seconds, 2),
        "ticks": log.ticks,
        "rounds": log.rounds,
        "invariant_checks": log.invariant_checks,
        "violations": log.violations[:20],
        "failures_applied": log.failures_applied,
        "failures_absorbed": log.failures_absorbed,
        "pools": sorted(pools.values(), key=lambda p: p["name"]),
    }


def _pool_base(config: SimulationConfig, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "hosts": config.hosts_per_pool,
        "domains": config.domains_per_pool,
        # The floor every policy is held to: the configuration's buffers (lock-step gives its up).
        "floor": config.hosts_per_pool - config.planned_buffer_hosts - config.failure_buffer_hosts,
        "samples": [],
        "planned_hours": 0.0,
        "failure_hours": 0.0,
        "hours_below_floor": 0.0,  # this pool's hours below its floor (summed over pools: pool-hours)
        "min_in_service": config.hosts_per_pool,
        "drains": 0,
        "jobs": 0,
        "interrupted_by_drains": 0,
        "interrupted_by_failures": 0,
        # Host-hours of interrupted jobs' hosts still in service, by what began the interruption.
        "stranded_host_hours_by_drains": 0.0,
        "stranded_host_hours_by_failures": 0.0,
        "autostops": 0,
        "offboardings": 0,
        "cycles": [],
        "host_cycles": 0,  # (host, cycle) pairs a train drained, and those it drained more than once
        "host_cycles_redrained": 0,
        "visits": [],
        "rollouts": [],
        "forecasts": [],
    }


def _capacity(config: SimulationConfig, log: RunLog, pools: dict[int, dict[str, Any]]) -> None:
    """Host counts only change on ticks, and every tick that moved hosts was sampled: integrating
    the step function is exact."""
    for pool_id, pool in pools.items():
        series = [(s.at, *s.counts[pool_id]) for s in log.samples if pool_id in s.counts]
        compact: list[list[Any]] = []  # [hour, in service, planned out, failed out]
        for at, in_service, planned, failure in series:
            if not compact or compact[-1][1:] != [in_service, planned, failure]:
                compact.append([hours(config, at), in_service, planned, failure])
        pool["samples"] = compact
        ends = [row[0] for row in compact[1:]] + [config.days * 24]
        for row, end in zip(compact, ends, strict=True):
            span = max(0.0, end - row[0])
            pool["planned_hours"] += row[2] * span
            pool["failure_hours"] += row[3] * span
            if row[1] < pool["floor"]:
                pool["hours_below_floor"] += span
            pool["min_in_service"] = min(pool["min_in_service"], row[1])
        for key in ("planned_hours", "failure_hours", "hours_below_floor"):
            pool[key] = round(pool[key], 2)


@dataclass(eq=False)
class _JobOut:
    """One job's interruption as its hosts' events go by: which of its hosts are out, what began the
    interruption ("drains" or "failures"), since when the count out stands, when the last came back."""

    pool: dict[str, Any]
    hosts: int
    out: set[int] = field(default_factory=set)
    cause: str = ""
    since: dt.datetime | None = None
    back_at: dt.datetime | None = None

    def strand(self, until: dt.datetime) -> None:
        """While interrupted, its hosts still in service stand idle for it: their host-hours since the
        last change are stranded (charged to what began the interruption, as the count is)."""
        if self.out and self.since is not None:
            span = max(0.0, (until - self.since).total_seconds() / 3600)
            self.pool[f"stranded_host_hours_by_{self.cause}"] += (self.hosts - len(self.out)) * span
        self.since = until

    def leave(self, host: int, at: dt.datetime, cause: str) -> None:
        self.strand(at)
        # Events of one instant come in the order written (returns before admissions in a tick): a
        # zero gap is judged by the instant, so that order does not count twice.
        if not self.out and self.back_at != at:
            self.cause = cause
            self.pool[f"interrupted_by_{cause}"] += 1
        self.out.add(host)

    def back(self, host: int, at: dt.datetime) -> None:
        if host in self.out:
            self.strand(at)
            self.out.discard(host)
            if not self.out:
                self.back_at = at


def _drains_and_interruptions(config: SimulationConfig, log: RunLog, pools: dict[int, dict[str, Any]]) -> None:
    """A job runs on consecutive hosts; it is interrupted when its first host leaves service (by a
    drain or by breaking) and runs again once all its hosts are back. A host leaving in the very
    instant the last one came back (the next domain drained in the tick that returned the previous
    one) gives the job no time to run: that continues the interruption, it does not start another.

    Stranded host-hours: while a job is interrupted, the host-hours of its hosts still in service
    (they run nothing for it). A job spanning several domains is interrupted once if the train
    visits them back to back, but stays out for all those visits: that is what small domains cost.
    Measured in the same pass; an interruption still open at the end is counted up to the end."""
    host_pool = {h: pool.id for pool in log.world.pools for h in pool.host_ids}
    jobs = [_JobOut(pool=pools[host_pool[hosts[0]]], hosts=len(hosts)) for hosts in log.world.jobs.values()]
    job_of = {host: job for job, hosts in zip(jobs, log.world.jobs.values(), strict=True) for host in hosts}
    for each in jobs:
        each.pool["jobs"] += 1
    transitions = (
        Event.objects.filter(kind="host.state_changed")
        .filter(Q(data__from=HostState.IN_SERVICE) | Q(data__to=HostState.IN_SERVICE))
        .order_by("created_at", "id")
        .values_list("created_at", "host_id", "data")
    )
    for at, host_id, data in transitions.iterator(chunk_size=10_000):
        if host_id is None:  # host events always name their host
            continue
        pool = pools.get(host_pool.get(host_id, -1))
        if pool is None:
            continue
        job = job_of.get(host_id)
        if data.get("from") == HostState.IN_SERVICE:
            drained = data.get("to") == HostState.DRAINING
            pool["drains"] += drained
            if job is not None:
                job.leave(host_id, at, "drains" if drained else "failures")
        elif job is not None:
            job.back(host_id, at)
    for each in jobs:
        each.strand(config.end)
    for pool in pools.values():
        for key in ("stranded_host_hours_by_drains", "stranded_host_hours_by_failures"):
            pool[key] = round(pool[key], 2)


def _trains(config: SimulationConfig, pools: dict[int, dict[str, Any]]) -> None:
    from trains.models import Cycle, Visit

    _drains_per_host_cycle(pools)
    for pool_id, number, started, ended, deadline in Cycle.objects.values_list(
        "train__pool_id", "number", "started_at", "ended_at", "deadline_at"
    ).order_by("train__pool_id", "number"):
        if pool_id in pools:
            pools[pool_id]["cycles"].append(
                [number, hours(config, started), hours(config, ended), hours(config, deadline)]
            )
    for pool_id, domain, visit_started, visit_ended, state, skips in (
        Visit.objects.filter(started_at__isnull=False)
        .values_list("train__pool_id", "domain__name", "started_at", "ended_at", "state", "skips")
        .order_by("train__pool_id", "started_at", "id")
    ):
        if pool_id in pools:
            pools[pool_id]["visits"].append(
                [domain, hours(config, visit_started), hours(config, visit_ended), state, skips]
            )


def _drains_per_host_cycle(pools: dict[int, dict[str, Any]]) -> None:
    """The trains' promise of one drain per host per cycle: the drains trains' tasks opened (a task
    whose drain key is its own id), per host and cycle."""
    drains = Counter(
        HostTask.objects.filter(drain_key=F("id"), operation__visit_link__isnull=False).values_list(
            "pool_id", "host_id", "operation__visit_link__visit__cycle_id"
        )
    )
    for (pool_id, _, _), count in drains.items():
        if pool_id in pools:
            pools[pool_id]["host_cycles"] += 1
            pools[pool_id]["host_cycles_redrained"] += count > 1
