"""Rollout measures: how fast each upgrade reaches its pool, and which cycles broke a promise they could keep.

- reach: per upgrade, the share of the pool's hosts (of a scoped upgrade: of the hosts its scope
  named when it arrived) running it (or a later version of the same component, which supersedes it)
  24 hours, 72 hours and 7 days after it arrived; None where the run ended before that horizon.
  Read from the lane's `host.version_installed` events and the versions the world started with, so
  every policy is measured by the same code.
- forecasts kept: per upgrade, the forecast the product gave when it appeared (trains only), against
  when every host ran it (`forecast_summary`).
- cycles missed: the cycles that ended after their deadline (or were still open past it at the end),
  counting only cycles whose SLO is at or above the lower bound (the shortest cycle the buffers and
  visit times allow): a train cannot be blamed for a promise no schedule could keep.

`rollout_measures_add` runs in a shard, on the lane's database, and adds to the pools measured by
`measure.run_measure`; `rollout_summary` runs in the report, over the merged pools.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import defaultdict
from typing import Any

from fleet.models import InstalledVersion
from fleet.versions import version_sort_key
from opsplanner.models import Event
from simulation.config import SimulationConfig
from simulation.engine import RunLog
from simulation.policies import Rollout
from trains.selectors_forecast import ForecastCode

REACH_HOURS = (24, 72, 168)
REACH_KEYS = ("reach_24h", "reach_72h", "reach_7d")

# (at, host id, version sort key) per (pool id, component)
_Installs = dict[tuple[int, str], list[tuple[dt.datetime, int, str]]]


def _installs(config: SimulationConfig, host_pool: dict[int, int]) -> _Installs:
    """Every version a host got, with when: the world's versions at the start, then the events."""
    installs: _Installs = defaultdict(list)
    at_start = InstalledVersion.objects.filter(installed_at__lte=config.start).values_list(
        "host_id", "component__name", "version__sort_key"
    )
    for host_id, component, key in at_start.iterator(chunk_size=20_000):
        if host_id in host_pool:
            installs[(host_pool[host_id], component)].append((config.start, host_id, key))
    events = Event.objects.filter(kind="host.version_installed").values_list("created_at", "host_id", "data")
    keys: dict[str, str] = {}
    for at, event_host, data in events.iterator(chunk_size=20_000):
        if event_host is None or event_host not in host_pool or not data.get("component") or not data.get("to"):
            continue
        version = data["to"]
        if version not in keys:
            keys[version] = version_sort_key(version)
        installs[(host_pool[event_host], data["component"])].append((at, event_host, keys[version]))
    for rows in installs.values():
        rows.sort()
    return installs


def reach_shares(
    config: SimulationConfig, rollout: Rollout, installs: list[tuple[dt.datetime, int, str]], hosts: int
) -> list[float | None]:
    """The share of `hosts` running the rollout's version or a later one at each of REACH_HOURS."""
    wanted = version_sort_key(rollout.version)
    first: dict[int, dt.datetime] = {}
    for at, host_id, key in installs:
        if key >= wanted and host_id not in first:
            first[host_id] = at
    times = sorted(first.values())
    shares: list[float | None] = []
    for horizon in REACH_HOURS:
        at = rollout.arrived + dt.timedelta(hours=horizon)
        if at > config.end or not hosts:
            shares.append(None)
        else:
            shares.append(round(min(1.0, bisect.bisect_right(times, at) / hosts), 4))
    return shares


def rollout_reach(config: SimulationConfig, log: RunLog) -> dict[int, list[list[Any]]]:
    """{pool id: [[component, version, arrived hour, reach 24 h, 72 h, 7 days], …]} in arrival order."""
    host_pool = {h: pool.id for pool in log.world.pools for h in pool.host_ids}
    pool_by_name = {pool.name: pool for pool in log.world.pools}
    installs = _installs(config, host_pool)
    reach: dict[int, list[list[Any]]] = {pool.id: [] for pool in log.world.pools}
    for rollout in log.policy.rollouts():
        pool = pool_by_name.get(rollout.pool)
        if pool is None:
            continue
        rows = installs.get((pool.id, rollout.component), [])
        hosts = len(pool.host_ids)
        if rollout.host_ids is not None:  # an upgrade narrower than its pool reaches its own hosts
            # (those its scope named on arrival; only the pool's, whose installs are the rows counted)
            scope = set(rollout.host_ids) & set(pool.host_ids)
            rows, hosts = [row for row in rows if row[1] in scope], len(scope)
        shares = reach_shares(config, rollout, rows, hosts)
        arrived = round((rollout.arrived - config.start).total_seconds() / 3600, 4)
        reach[pool.id].append([rollout.component, rollout.version, arrived, *shares])
    return reach


def rollout_measures_add(config: SimulationConfig, log: RunLog, pools: dict[int, dict[str, Any]]) -> None:
    """Add `reach` to each pool measured by run_measure (the hook: one call after its `_trains`)."""
    for pool_id, rows in rollout_reach(config, log).items():
        if pool_id in pools:
            pools[pool_id]["reach"] = rows


def cycles_missed_keepable(config: SimulationConfig, pool: dict[str, Any]) -> int:
    """Cycles [number, start h, end h, deadline h] that missed a deadline at or above the lower bound."""
    end = config.days * 24
    bound = config.cycle_lower_bound_hours_of(pool.get("domains") or config.domains_per_pool)
    missed = 0
    for _, started, ended, deadline in pool.get("cycles") or []:
        if started is None or deadline is None or deadline - started < bound - 1e-9:
            continue
        missed += (end if ended is None else ended) > deadline
    return missed


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def forecast_summary(pools: list[dict[str, Any]], end_hours: float) -> dict[str, Any]:
    """How the product's first forecast of each upgrade ("reaches every host by cycle N, around
    <date>") held up: of the upgrades forecast to finish within the run, how many finished by then,
    and how far from it they finished (hours, signed: positive is late; an unfinished one counts
    at the run's end, so the lateness is a lower bound). None for a policy without forecasts."""
    due: list[tuple[float, float | None]] = []
    forecast = 0
    for pool in pools:
        for rollout, (at, code) in zip(pool.get("rollouts") or [], pool.get("forecasts") or [], strict=False):
            forecast += code == ForecastCode.SCHEDULED
            if code == ForecastCode.SCHEDULED and at is not None and at <= end_hours:
                due.append((at, rollout[3]))
    if not forecast:
        return {"forecasts_due": None, "forecasts_kept": None, "forecast_late_median_hours": None,
                "forecast_late_p90_hours": None}  # fmt: skip
    late = sorted((end_hours if finished is None else finished) - at for at, finished in due)
    return {
        "forecasts_due": len(due),
        "forecasts_kept": sum(1 for at, finished in due if finished is not None and finished <= at),
        "forecast_late_median_hours": _quantile(late, 0.5),
        "forecast_late_p90_hours": _quantile(late, 0.9),
    }


def _quantile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank quantile of an ordered list."""
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 2)


def rollout_summary(config: SimulationConfig, pools: list[dict[str, Any]]) -> dict[str, Any]:
    """Over merged pools: the mean reach of the upgrades that were observed long enough at each
    horizon, and the cycles that missed an SLO they could have kept (None without cycles)."""
    rows = [row for pool in pools for row in pool.get("reach") or []]
    summary: dict[str, Any] = {}
    for offset, key in enumerate(REACH_KEYS):
        observed = [row[3 + offset] for row in rows if row[3 + offset] is not None]
        summary[f"{key}_mean"] = _mean(observed)
        summary[f"{key}_upgrades"] = len(observed)
        summary[f"{key}_complete"] = sum(1 for share in observed if share >= 1.0)
    has_cycles = any(pool.get("cycles") for pool in pools)
    summary["cycles_missed_keepable"] = (
        sum(cycles_missed_keepable(config, pool) for pool in pools) if has_cycles else None
    )
    summary.update(forecast_summary(pools, config.days * 24))
    return summary
