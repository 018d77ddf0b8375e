"""What-if on the live fleet: a pool's present copied into a scratch lane, and its next days forecast.

`live_snapshot` reads (only reads: in a read-only transaction where it can) the live pool's hosts,
domains, installed versions, components, jobs (services and placements), opt-out windows and
reservations still ahead, its trains and its pending upgrades, as plain JSON-able data. Each lane
(`from_live_lane.live_world_create`, in a `simulate --shard` process on a scratch lane) writes that data back
as the world, and the pending upgrades arrive when time starts (`live_workload`); failures are drawn
from the seed as in any run. The work in flight is assumed finished: every host starts in service,
and a host already running an upgrade's version does not get it again. A pending upgrade's phase in
force goes on from where it stands live (its evidence, its soak, its picked hosts:
`from_live_trains`), the lane being unable to count again what the live tasks showed.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    InstalledVersion,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    ServicePlacement,
)
from opsplanner import clock
from simulation.config import LIVE_TRAIN_STATE, Arrival, Failure, SimulationConfig, Workload
from simulation.from_live_trains import (
    carried_failures_note,
    live_setting,
    open_cycle_note,
    open_cycle_snapshot,
    phase_in_force_note,
    upgrade_arrival,
    upgrades_snapshot,
)
from simulation.report import Runs, summarise
from simulation.runner import (
    Job,
    jobs_run,
    lanes_claimed,
    scratch_databases,
    scratch_databases_drop,
    scratch_databases_swept,
)

# Whatever a forecast is asked, its work is the live pending upgrades: no arrivals or windows are drawn.
LIVE_FIXED: dict[str, Any] = {"upgrades_per_week": 0.0, "optout_windows_per_week": 0.0}
# What live_config takes from the live pool, whatever the command line says: a problem with one of
# these is the pool's, never an option's.
LIVE_POOL_FIELDS = frozenset(
    {"hosts", "pools", "hosts_per_domain", "planned_buffer_domains", "planned_buffer_size", "failure_buffer_fraction",
     "components", "upgrades_at_start", "live_snapshot", "start_at", "cycle_slo_hours"}
)  # fmt: skip
LIVE_TAGS = r"_live\d+"  # the tags live_run_tag gives (as a regular expression)
_NO_POOL = "there is no pool named {!r}"
_NO_HOSTS = "pool {!r} has no hosts to forecast"


class LiveSnapshotError(Exception):
    """The live fleet cannot be forecast as asked (no such pool, a pool without hosts)."""


class LiveConfigError(LiveSnapshotError):
    """A live pool whose shape the simulator cannot take (`problems`: SimulationConfig.errors())."""

    def __init__(self, pool: str, problems: dict[str, str]) -> None:
        self.pool = pool
        self.problems = problems
        super().__init__(f"pool {pool}: " + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in problems.items()))


@dataclass(frozen=True)
class LiveForecast:
    """A finished forecast: when it started, the whole fleet forecast (every pool summed) and the runs."""

    now: dt.datetime
    config: SimulationConfig
    runs: Runs


def _iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def live_pool_refusal(pool_name: str, *, max_hosts: int | None = None) -> str | None:
    """Why the named live pool cannot be forecast (no such pool, no hosts, more than `max_hosts`), or
    None: a cheap check before anything is queued."""
    pool = Pool.objects.filter(name=pool_name).first()
    if pool is None:
        return _NO_POOL.format(pool_name)
    hosts = Host.objects.filter(pool=pool)
    if not hosts.exists():
        return _NO_HOSTS.format(pool_name)
    if max_hosts is not None and hosts.count() > max_hosts:
        return f"pool {pool_name!r} has more than {max_hosts:,} hosts, too many to forecast here"
    return None


def live_snapshot(pool_name: str | None, now: dt.datetime) -> list[dict[str, Any]]:
    """One snapshot per live pool (or the one named), read without writing anything."""
    fresh = not connection.in_atomic_block
    with transaction.atomic():
        if fresh and connection.vendor == "postgresql":
            with connection.cursor() as cursor:  # the first statement of the transaction: any write fails
                cursor.execute("SET TRANSACTION READ ONLY")
        pools = Pool.objects.order_by("name")
        if pool_name:
            pools = pools.filter(name=pool_name)
        # As the lanes will read it back: JSON (lists, ISO times, floats).
        snapshots = [json.loads(json.dumps(_pool_snapshot(pool, now), default=str)) for pool in pools]
    if pool_name and not snapshots:
        raise LiveSnapshotError(_NO_POOL.format(pool_name))
    empty = [s["pool"]["name"] for s in snapshots if not s["hosts"]]
    if pool_name and empty:
        raise LiveSnapshotError(_NO_HOSTS.format(pool_name))
    snapshots = [s for s in snapshots if s["hosts"]]
    if not snapshots:
        raise LiveSnapshotError("the live fleet has no pool with hosts to forecast")
    return snapshots


def _pool_snapshot(pool: Pool, now: dt.datetime) -> dict[str, Any]:
    # In live id order: the lane creates them in this order, so its ids follow the live ones, and a
    # percentage phase (the first hosts of its scope by id) covers the same hosts there.
    hosts = list(
        Host.objects.filter(pool=pool).order_by("id").values_list("id", "hostname", "domain__name", "sku", "gpu_count")
    )
    host_ids = [h[0] for h in hosts]
    return {
        "pool": {
            "name": pool.name,
            "workload_class": pool.workload_class,
            "planned_buffer_hosts": pool.planned_buffer_hosts,
            "planned_buffer_fraction": _decimal(pool.planned_buffer_fraction),
            "failure_buffer_hosts": pool.failure_buffer_hosts,
            "failure_buffer_fraction": _decimal(pool.failure_buffer_fraction),
            "hard_floor_hosts": pool.hard_floor_hosts,
        },
        "domains": list(
            MaintenanceDomain.objects.filter(pool=pool)
            .order_by("position", "name")
            .values_list("name", "kind", "position")
        ),
        "hosts": [[hostname, domain, sku, gpus] for _, hostname, domain, sku, gpus in hosts],
        "installed": list(
            InstalledVersion.objects.filter(host_id__in=host_ids)
            .order_by("host__hostname", "component__name")
            .values_list("host__hostname", "component__name", "version__version")
        ),
        **_catalogue_snapshot(),
        **_jobs_snapshot(pool, host_ids, now),
        **_trains_snapshot(pool),
    }


def _catalogue_snapshot() -> dict[str, Any]:
    """Every component, its versions (the withdrawn ones too, withdrawn: a host may still run one, and
    the lane must refuse to return it as the live pre-return check does), and the compatibility rules."""
    return {
        "components": list(
            Component.objects.order_by("name").values_list(
                "name", "display_name", "layer", "needs_reboot", "needs_drain"
            )
        ),
        "versions": [
            [name, version, _iso(released), _iso(withdrawn), reason, by]
            for name, version, released, withdrawn, reason, by in ComponentVersion.objects.order_by(
                "component__name", "sort_key"
            ).values_list(
                "component__name", "version", "released_at", "withdrawn_at", "withdrawn_reason", "withdrawn_by"
            )
        ],
        "rules": list(
            CompatibilityRule.objects.order_by("id").values_list(
                "job_facing_version__component__name",
                "job_facing_version__version",
                "lower_component__name",
                "min_version",
                "min_key",
                "max_version",
                "max_key",
                "note",
            )
        ),
    }


def _jobs_snapshot(pool: Pool, host_ids: list[int], now: dt.datetime) -> dict[str, Any]:
    """The services on the pool's hosts, their opt-out windows still ahead, the pool's reservations."""
    placements = list(
        ServicePlacement.objects.filter(host_id__in=host_ids)
        .order_by("service__name", "host__hostname")
        .values_list("service__name", "host__hostname", "running_jobs")
    )
    optouts = OptOutWindow.objects.filter(
        service__name__in={p[0] for p in placements}, cancelled_at__isnull=True, ends_at__gt=now
    ).order_by("starts_at", "id")
    reservations = CapacityReservation.objects.filter(pool=pool, cancelled_at__isnull=True, ends_at__gt=now)
    return {
        "placements": placements,
        "optouts": [
            [service, _iso(starts), _iso(ends), reason]
            for service, starts, ends, reason in optouts.values_list("service__name", "starts_at", "ends_at", "reason")
        ],
        "reservations": [
            [service, _iso(starts), _iso(ends), reason, kept]
            for service, starts, ends, reason, kept in reservations.order_by("starts_at", "id").values_list(
                "service__name", "starts_at", "ends_at", "reason", "min_hosts_in_service"
            )
        ],
    }


def _trains_snapshot(pool: Pool) -> dict[str, Any]:
    """The pool's trains (not emergency ones) and the upgrades they still have to apply."""
    from trains.models import LIVE_TRAIN_STATES, Train

    trains = Train.objects.filter(pool=pool, emergency=False, state__in=LIVE_TRAIN_STATES).order_by("name")
    return {
        "trains": [
            {
                "name": train.name,
                "cycle_slo_s": train.cycle_slo_s,
                "visit_estimate_s": train.visit_estimate_s,
                "visit_concurrency": train.visit_concurrency,
                "priority": train.priority,
                "visit_overhead_s": train.visit_overhead_s,
                "domain_order": list(train.stops.order_by("position").values_list("domain__name", flat=True)) or None,
                # How it stands live (LIVE_TRAIN_STATE): a stopped train makes no progress there, nor in the lane.
                "state": train.state,
                "state_reason": train.state_reason,
                "auto_resume_after_s": train.auto_resume_after_s,
                "recovered_since": _iso(train.recovered_since),
                "open_cycle": open_cycle_snapshot(train),  # the lane goes on from its place in the cycle
            }
            for train in trains
        ],
        "upgrades": upgrades_snapshot(pool),  # with their phase in force's progress (from_live_trains)
    }


def live_train_spec(train: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's train with its live state, defaulted for a snapshot taken before the state was."""
    return {**LIVE_TRAIN_STATE, **train}


def live_train_notes(snapshot: dict[str, Any], policy: str, days: float) -> list[str]:
    """What a forecast of this pool under `policy` must say about its trains stopped live: the trains
    policies play them as they are (a paused train stays paused, an autostopped one resumes only as the
    live tick would resume it); the others have no train and roll the pending upgrades all the same."""
    from simulation.policies import POLICY_CLASSES, TrainsPolicy
    from trains.models import STOPPED_TRAIN_STATES

    runs_trains = issubclass(POLICY_CLASSES.get(policy, object), TrainsPolicy)
    notes = []
    for train in map(live_train_spec, snapshot.get("trains") or []):
        if runs_trains and (cycle_note := open_cycle_note(train)):
            notes.append(cycle_note)
        state = train["state"]
        if state not in STOPPED_TRAIN_STATES:
            continue
        why = f" ({train['state_reason']})" if train["state_reason"] else ""
        said = f"train {train['name']} is {state} on the live fleet{why}"
        resume_s = train["auto_resume_after_s"]
        if not runs_trains:
            notes.append(f"{said}; this policy runs no train and rolls the pending upgrades all the same")
        elif state == "autostopped" and resume_s is not None:
            notes.append(
                f"{said}: the forecast plays it autostopped until the pool's buffers have been recovered for "
                f"{resume_s} s, when it resumes on its own as the live train would (the hosts out live are taken "
                "as back when the forecast starts)"
            )
        else:
            held = "it does not resume on its own" if state == "autostopped" else "it stays paused until resumed"
            span = f"{days:g} day{'' if days == 1 else 's'}"
            notes.append(
                f"{said}: the forecast plays it {state} for the whole forecast ({span}), as {held}; it starts no "
                "visit, and its pending upgrades reach no host through it"
            )
    return notes


def _runs_noted(runs: Runs, snapshots: list[dict[str, Any]], configs: list[SimulationConfig], days: float) -> Runs:
    """Each shard's pools with the notes on their stopped trains and what their lane ran with
    (`live_setting`; report.summarise gathers both)."""
    by_pool = {snapshot["pool"]["name"]: snapshot for snapshot in snapshots}
    settings = {s["pool"]["name"]: live_setting(s, c) for s, c in zip(snapshots, configs, strict=True)}
    for policy, shards in runs.items():
        for pool in (pool for shard in shards for pool in shard.get("pools") or []):
            snapshot = by_pool.get(str(pool.get("name")))
            if snapshot is not None:
                pool["setting"] = settings[snapshot["pool"]["name"]]
                upgrades = [
                    note(upgrade)
                    for upgrade in snapshot["upgrades"]
                    for note in (phase_in_force_note, carried_failures_note)
                ]
                pool["notes"] = live_train_notes(snapshot, policy, days) + [note for note in upgrades if note]
    return runs


def _decimal(value: Any) -> float | None:
    return None if value is None else float(value)


def snapshot_write(snapshot: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(snapshot, sort_keys=True))


def snapshot_read(config: SimulationConfig) -> dict[str, Any]:
    return json.loads(Path(config.live_snapshot).read_text())


def live_config(base: SimulationConfig, snapshot: dict[str, Any], path: Path, now: dt.datetime) -> SimulationConfig:
    """The configuration of one live pool's forecast: its size, its domains and buffers, its train's SLO."""
    hosts = len(snapshot["hosts"])
    per_domain: dict[str, int] = {}
    for _, domain, _, _ in snapshot["hosts"]:
        per_domain[domain] = per_domain.get(domain, 0) + 1
    domain_size = max(per_domain.values())
    pool = snapshot["pool"]
    planned = pool["planned_buffer_hosts"]
    if planned is None:
        planned = math.floor(hosts * (pool["planned_buffer_fraction"] or 0))
    failure = pool["failure_buffer_hosts"]
    failure_fraction = failure / hosts if failure is not None else (pool["failure_buffer_fraction"] or 0)
    train = (snapshot["trains"] or [None])[0]
    changes: dict[str, Any] = {
        "hosts": hosts,
        "pools": 1,
        "hosts_per_domain": domain_size,
        # The trains visit as many whole domains at once as the buffer holds (at least one, in waves
        # when the buffer is smaller); the lane's pool keeps the live buffer itself, in hosts.
        "planned_buffer_domains": max(1, planned // domain_size),
        "planned_buffer_size": planned,
        "failure_buffer_fraction": min(0.49, failure_fraction),
        "components": max(1, len(snapshot["components"])),
        "upgrades_at_start": 0,
        "live_snapshot": str(path),
        "start_at": now.isoformat(),
    }
    if train is not None:
        changes["cycle_slo_hours"] = train["cycle_slo_s"] / 3600
    return base.replace(**changes)


def live_workload(config: SimulationConfig) -> Workload:
    """The pool's pending upgrades, all arriving when time starts; hosts break as the seed draws them."""
    snapshot = snapshot_read(config)
    arrivals = []
    for upgrade in snapshot["upgrades"]:
        created, carried = upgrade_arrival(upgrade, config.start)
        if created is None:  # the lane cannot create it (phase_in_force_note says why)
            continue
        arrivals.append(
            Arrival(at=config.start, pool=0, component=upgrade["component"], version=upgrade["version"],
                    upgrade=created, carried=carried)
        )  # fmt: skip
    seconds = config.days * 86_400
    failures: list[Failure] = []
    rng = random.Random(f"{config.seed}:failures")
    rate = config.host_failures_per_day * len(snapshot["hosts"]) / 86_400
    at = rng.expovariate(rate) if rate else seconds
    while at < seconds:
        failures.append(
            Failure(
                at=config.start + dt.timedelta(seconds=at), pool=0, host_index=rng.randrange(len(snapshot["hosts"]))
            )
        )
        at += rng.expovariate(rate)
    return Workload(arrivals=arrivals, failures=failures)


def live_run_tag() -> str:
    """The tag of this run's scratch lanes: its process's id, so forecasts run at once never share (and
    drop) a lane. One process runs one forecast at a time."""
    return f"_live{os.getpid()}"


def _forecast_now() -> dt.datetime:
    """Whole seconds, rounded up: a window or reservation that began in the live second before the
    snapshot is already under way at the forecast's start (rounding down made it start a moment later)."""
    now = clock.now()
    return now.replace(microsecond=0) + dt.timedelta(seconds=1) if now.microsecond else now


def live_pool_config(
    base: SimulationConfig, snapshot: dict[str, Any], path: Path, now: dt.datetime
) -> SimulationConfig:
    """live_config, or LiveConfigError when the simulator cannot take it (SimulationConfig.errors())."""
    config = live_config(base.replace(**LIVE_FIXED), snapshot, path, now)
    problems = config.errors()
    if problems:
        raise LiveConfigError(snapshot["pool"]["name"], problems)
    return config


def live_forecast_check(base: SimulationConfig, pool_name: str) -> None:
    """Raise what live_forecast(base, pool_name) would raise before any lane starts (LiveSnapshotError,
    LiveConfigError), reading the live database only: a request for a forecast is refused up front,
    not by the worker after it took the advisor's one slot."""
    now = _forecast_now()
    for snapshot in live_snapshot(pool_name, now):
        live_pool_config(base, snapshot, Path(f"live-{snapshot['pool']['name']}.json"), now)


def live_jobs(configs: list[SimulationConfig]) -> list[Job]:
    """One shard per live pool and policy (each pool has its own size, so its own configuration)."""
    return [Job(policy=p, pools=(0,), config=c, key=p) for c in configs for p in c.policies]


def live_forecast(
    base: SimulationConfig,
    pool_name: str | None,
    *,
    lanes: int,
    tag: str | None = None,
    keep_databases: bool = False,
    say: Callable[[str], None] = print,
) -> LiveForecast:
    """Forecast the live pool (or every pool) from now over `base.days`, each of `base.policies`, in
    scratch lanes named with `tag` (default live_run_tag(): this run's own). Reads the live database
    once, writes nothing to it. Raises LiveSnapshotError (LiveConfigError for a pool the simulator
    cannot take) before any lane starts."""
    now = _forecast_now()
    snapshots = live_snapshot(pool_name, now)
    base = base.replace(**LIVE_FIXED)
    with tempfile.TemporaryDirectory(prefix="live-") as work:
        configs = []
        for snapshot in snapshots:
            path = Path(work) / f"live-{snapshot['pool']['name']}.json"
            snapshot_write(snapshot, path)
            configs.append(live_pool_config(base, snapshot, path, now))
        jobs = live_jobs(configs)
        lanes = max(1, min(lanes, len(jobs)))
        say(f"simulate: forecast of {len(configs)} live pools from {now:%Y-%m-%d %H:%M} UTC, "
            f"{base.days:g} days, policies {', '.join(base.policies)}, {lanes} lanes")  # fmt: skip
        tag = tag or live_run_tag()
        with lanes_claimed(tag):  # until the lanes are dropped: a run started meanwhile leaves them alone
            swept = scratch_databases_swept(LIVE_TAGS)
            if swept:
                say(f"simulate: dropped the lanes no forecast holds (killed or kept): {', '.join(swept)}")
            urls = scratch_databases(lanes, tag=tag)
            try:
                runs = _runs_noted(jobs_run(jobs, urls, Path(work), say=say), snapshots, configs, base.days)
            finally:
                if not keep_databases:
                    scratch_databases_drop(urls)
    fleet = configs[0].replace(hosts=sum(c.hosts for c in configs), pools=len(configs), live_snapshot="")
    return LiveForecast(now=now, config=fleet, runs=runs)


def _upgrades(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per pending upgrade: hours to full rollout (None: not within the forecast) and its reach."""
    reach = {(pool.get("name"), r[0], r[1]): r[3:] for pool in pools for r in pool.get("reach") or []}
    rows = []
    for pool in pools:
        for component, version, arrived, finished, outcome in pool.get("rollouts") or []:
            shares = reach.get((pool.get("name"), component, version)) or [None, None, None]
            full = None if arrived is None or finished is None else round(finished - arrived, 2)
            rows.append(
                {"pool": pool.get("name"), "component": component, "version": version, "full_rollout_hours": full,
                 "outcome": outcome, "reach_24h": shares[0], "reach_72h": shares[1], "reach_7d": shares[2]}
            )  # fmt: skip
    return rows


def live_forecast_measures(forecast: LiveForecast) -> dict[str, Any]:
    """The forecast as plain data: per policy the measures the report prints (report.summarise's totals
    row) and, per pending upgrade, its time to full rollout and reach."""
    summary = summarise(forecast.config, forecast.runs)
    config = forecast.config
    return {
        "start_at": forecast.now.isoformat(),
        "days": config.days,
        "hosts": config.hosts,
        # What the forecast assumed that the measures do not show (a train stopped live, played stopped).
        "notes": list(dict.fromkeys(note for policy in summary["policies"] for note in summary["notes"][policy])),
        "pools": sorted(
            {str(p.get("name")) for s in forecast.runs.values() for sh in s for p in sh.get("pools") or []}
        ),
        "policies": [
            {
                "policy": policy,
                "label": summary["labels"][policy],
                "notes": summary["notes"][policy],
                "measures": summary["totals"][policy],
                "upgrades": _upgrades([pool for shard in forecast.runs.get(policy) or [] for pool in shard["pools"]]),
            }
            for policy in summary["policies"]
        ],
    }
