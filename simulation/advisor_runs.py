"""Advisor runs, queued and audited, each simulated by a worker in scratch databases (never the live one):
- domain size: which maintenance-domain size suits a pool; the pool's trains are simulated with each
  candidate size and the advice stored. The same flow as `manage.py simulate --advise`.
- live forecast: what-if on the live fleet; one live pool is copied and its next days forecast under each
  policy, the measures stored. The same flow as `manage.py simulate --from-live --pool P` (from_live.py);
  the live database is only read, apart from the run's own row and events.

A run is queued → running → done or failed; every transition is a guarded update with an event.
At most MAX_ACTIVE_RUNS are queued or running at once: each holds a worker process and a few
scratch databases while it runs.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import functools
import logging
import math
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q

from opsplanner import clock
from opsplanner.events import Actor, actor_fields, actor_user, event_record
from opsplanner.models import AdvisorRun, AdvisorRunState
from opsplanner.models.advisor import ACTIVE_ADVISOR_STATES, AdvisorRunKind
from simulation.advisor import AdvisorRequest, advice
from simulation.config import POLICIES, SimulationConfig
from simulation.from_live import (
    LiveConfigError,
    LiveSnapshotError,
    live_forecast,
    live_forecast_check,
    live_forecast_measures,
    live_pool_refusal,
)
from simulation.runner import (
    default_lanes,
    jobs_run,
    scratch_databases,
    scratch_databases_drop,
    scratch_databases_drop_tagged,
)

log = logging.getLogger(__name__)

MAX_POOL_HOSTS = 20_000
MAX_ACTIVE_RUNS = 1  # each run holds a worker process for minutes; the ticks need the others
MAX_CYCLE_SLO_HOURS = 720.0  # 30 days: the simulated time (and the run's duration) grows with it
MAX_COST = 1e12
MAX_FORECAST_DAYS = 30
LIVE_FORECAST_POLICIES = ("trains", "trains-sliding", "rolling")  # the train paces and rolling, by default
# A run queued or running this long was lost (a worker killed mid-run, a task never delivered): it is
# marked failed when the next run is requested, so it does not hold a slot for ever.
ABANDONED_AFTER = dt.timedelta(hours=12)
WORKER_ACTOR = "advisor"
_LEASE_LOCK_SPACE = 0x4F50_4152  # the first key of the runs' advisory locks (the second is the run's id)
# The simulated hardware a request may set; the rest of SimulationConfig is the advisor's to choose.
HARDWARE_KNOBS: dict[str, type] = {
    "drain_minutes": float,
    "execute_minutes": float,
    "verify_minutes": float,
    "undrain_minutes": float,
    "host_failures_per_day": float,
    "upgrade_failure_rate": float,
    "verify_failure_rate": float,
    "optout_windows_per_week": float,
    "job_hosts_min": int,
    "job_hosts_max": int,
}
# SimulationConfig problems that depend on the domain size; AdvisorRequest checks them per size.
_PER_SIZE_FIELDS = {"hosts_per_domain", "planned_buffer_domains", "cycle_slo_hours", "days", "pools"}


def hardware_defaults() -> dict[str, Any]:
    defaults = SimulationConfig()
    return {name: getattr(defaults, name) for name in HARDWARE_KNOBS}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def advisor_request_from_params(params: Mapping[str, Any]) -> AdvisorRequest:
    """The simulation request a run's params describe (params as advisor_run_request stored them)."""
    config = SimulationConfig(
        hosts=params["pool_hosts"],
        pools=1,
        policies=("trains",),
        cycle_slo_hours=params["cycle_slo_hours"],
        seed=params["seed"],
        **{name: params[name] for name in HARDWARE_KNOBS},
    )
    return AdvisorRequest(
        config=config,
        sizes=tuple(params["sizes"]),
        interruption_cost=params["interruption_cost"],
        capacity_hour_cost=params["capacity_hour_cost"],
    )


def advisor_params_validate(
    *,
    pool_hosts: int,
    sizes: list[int],
    interruption_cost: float,
    capacity_hour_cost: float,
    cycle_slo_hours: float,
    seed: int,
    hardware: Mapping[str, float] | None,
) -> dict[str, Any]:
    """The params to store, or a ValidationError keyed by the request's field names."""
    problems: dict[str, str] = {}
    if not _is_whole(pool_hosts) or not 1 <= pool_hosts <= MAX_POOL_HOSTS:
        problems["pool_hosts"] = f"The pool must have 1 to {MAX_POOL_HOSTS:,} hosts."
    if not isinstance(sizes, list | tuple) or not all(_is_whole(size) and size >= 1 for size in sizes):
        problems["sizes"] = "Give the domain sizes as whole numbers of hosts, 1 or more, e.g. 16, 40, 80."
    if not _is_number(cycle_slo_hours) or not 0.1 <= cycle_slo_hours <= MAX_CYCLE_SLO_HOURS:
        problems["cycle_slo_hours"] = f"The cycle SLO must be 0.1 to {MAX_CYCLE_SLO_HOURS:g} hours."
    if not _is_whole(seed) or seed < 0:
        problems["seed"] = "The seed must be a whole number, 0 or more."
    for name, value in (("interruption_cost", interruption_cost), ("capacity_hour_cost", capacity_hour_cost)):
        if not _is_number(value) or not 0 <= value <= MAX_COST:
            problems[name] = f"The {name.replace('_', ' ')} must be a number from 0 to {MAX_COST:g}."
    knobs = hardware_defaults()
    for name, value in (hardware or {}).items():
        kind = HARDWARE_KNOBS.get(name)
        if kind is None:
            problems[name] = f"{name!r} is not a setting of the simulated hardware."
        elif not (_is_whole(value) if kind is int else _is_number(value)):
            problems[name] = f"{name.replace('_', ' ')} must be a {'whole ' if kind is int else ''}number."
        else:
            knobs[name] = kind(value)
    if problems:
        raise ValidationError(problems)
    params: dict[str, Any] = {
        "pool_hosts": pool_hosts,
        "sizes": sorted(sizes),
        "interruption_cost": float(interruption_cost),
        "capacity_hour_cost": float(capacity_hour_cost),
        "cycle_slo_hours": float(cycle_slo_hours),
        "seed": seed,
        **knobs,
    }
    request = advisor_request_from_params(params)
    # The pool and the hardware first (any size): a problem there is the request's, not a size's.
    base = request.config.replace(hosts_per_domain=1).errors()
    for name, message in base.items():
        if name not in _PER_SIZE_FIELDS:
            problems["pool_hosts" if name == "hosts" else name] = message
    if not problems:
        size_messages = []
        for name, message in request.errors().items():
            if name.startswith("size "):
                size_messages.append(f"{name.capitalize()}: {message}")
            else:
                problems[name] = message
        if size_messages and "sizes" not in problems:
            problems["sizes"] = " ".join(size_messages)
    if problems:
        raise ValidationError(problems)
    return params


def _lock_requests() -> None:
    """Requests one at a time, so two at once cannot both see a free slot (SQLite writes one at a time)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('opsplanner.advisor_run_request'))")


def _abandoned_fail(now: dt.datetime) -> None:
    """Fail runs that have been queued or running for too long: their worker is gone. A killed
    worker also left its scratch databases behind: they are dropped once the failure commits."""
    cutoff = now - ABANDONED_AFTER
    lost = Q(state=AdvisorRunState.QUEUED, created_at__lt=cutoff) | Q(
        state=AdvisorRunState.RUNNING, started_at__lt=cutoff
    )
    for run in AdvisorRun.objects.filter(lost):
        reason = f"abandoned: no result {ABANDONED_AFTER.total_seconds() / 3600:g} h after it was {run.state}"
        if AdvisorRun.objects.filter(pk=run.pk, state=run.state).update(
            state=AdvisorRunState.FAILED, failure_reason=reason, finished_at=now
        ):
            run.refresh_from_db()
            event_record(kind="advisor_run.failed", subject=run, actor=WORKER_ACTOR, reason=reason)
            if run.started_at is not None:
                transaction.on_commit(functools.partial(_leftovers_drop, run.pk), robust=True)


def _leftovers_drop(run_id: int) -> None:
    """Drop the scratch databases a lost worker left behind (the run abandoned, or taken over)."""
    dropped = scratch_databases_drop_tagged(f"_advisor{run_id}")
    if dropped:
        log.warning("advisor run %s lost its worker; dropped its scratch databases %s", run_id, ", ".join(dropped))


def _enqueue(run_id: int) -> None:
    from simulation.tasks import advisor_run

    advisor_run.delay(run_id)


def _queue(*, kind: AdvisorRunKind, params: dict[str, Any], reason: str, actor: Actor) -> AdvisorRun:
    """Save a queued run (in the caller's transaction) unless MAX_ACTIVE_RUNS are active; a worker gets it
    after the commit. Runs lost for ABANDONED_AFTER are failed first, so they do not hold a slot."""
    _lock_requests()
    now = clock.now()
    _abandoned_fail(now)
    active = list(
        AdvisorRun.objects.filter(state__in=ACTIVE_ADVISOR_STATES).order_by("created_at", "id").values_list("pk")
    )
    if len(active) >= MAX_ACTIVE_RUNS:
        numbers = ", ".join(f"#{pk}" for (pk,) in active)
        raise ValidationError(
            f"{len(active)} advisor runs are already queued or running ({numbers}); "
            f"try again when run #{active[0][0]} finishes.",
            code="conflict",
        )
    _, label = actor_fields(actor)
    run = AdvisorRun(kind=kind, params=params, requested_by=actor_user(actor), requester=label, created_at=now)
    run.full_clean()
    run.save()
    event_record(kind="advisor_run.requested", subject=run, actor=actor, reason=reason, data={"kind": kind, **params})
    run_id = run.pk
    transaction.on_commit(lambda: _enqueue(run_id), robust=True)
    return run


@transaction.atomic
def advisor_run_request(
    *,
    pool_hosts: int,
    sizes: list[int],
    interruption_cost: float,
    capacity_hour_cost: float,
    cycle_slo_hours: float = 72,
    seed: int = 1,
    hardware: Mapping[str, float] | None = None,
    actor: Actor,
) -> AdvisorRun:
    """Queue a sweep of `sizes` for a pool of `pool_hosts`; a worker runs it after the commit.

    `hardware` overrides the simulated hardware (HARDWARE_KNOBS). Refused, writing nothing: invalid
    input (by field), and MAX_ACTIVE_RUNS runs already queued or running (code conflict)."""
    params = advisor_params_validate(
        pool_hosts=pool_hosts,
        sizes=sizes,
        interruption_cost=interruption_cost,
        capacity_hour_cost=capacity_hour_cost,
        cycle_slo_hours=cycle_slo_hours,
        seed=seed,
        hardware=hardware,
    )
    return _queue(
        kind=AdvisorRunKind.DOMAIN_SIZE,
        params=params,
        reason=f"domain sizes {', '.join(map(str, params['sizes']))} for a pool of {pool_hosts} hosts",
        actor=actor,
    )


def live_forecast_params_validate(*, pool: str, days: int, policies: list[str] | None, seed: int) -> dict[str, Any]:
    """The params to store, or a ValidationError keyed by the request's field names."""
    problems: dict[str, str] = {}
    if not isinstance(pool, str) or not pool.strip():
        problems["pool"] = "Name the live pool to forecast."
    else:
        refusal = live_pool_refusal(pool.strip(), max_hosts=MAX_POOL_HOSTS)
        if refusal:
            problems["pool"] = refusal[0].upper() + refusal[1:] + "."
    if not _is_whole(days) or not 1 <= days <= MAX_FORECAST_DAYS:
        problems["days"] = f"Forecast 1 to {MAX_FORECAST_DAYS} days, in whole days."
    chosen = list(LIVE_FORECAST_POLICIES if policies is None else policies)
    unknown = [str(p) for p in chosen if p not in POLICIES]
    if unknown:
        problems["policies"] = (
            f"Unknown policy {', '.join(map(repr, unknown))}; the policies are {', '.join(POLICIES)}."
        )
    elif not chosen:
        problems["policies"] = f"Choose at least one policy of {', '.join(POLICIES)}."
    elif len(set(chosen)) != len(chosen):
        problems["policies"] = "Give each policy once."
    if not _is_whole(seed):
        problems["seed"] = "The seed must be a whole number."
    if problems:
        raise ValidationError(problems)
    params = {"pool": pool.strip(), "days": days, "policies": [p for p in POLICIES if p in chosen], "seed": seed}
    _live_forecast_check(params)
    return params


def _live_base(params: Mapping[str, Any]) -> SimulationConfig:
    """The configuration a live forecast run starts from (the pool's own shape is added by from_live)."""
    return SimulationConfig(
        pools=1, days=float(params["days"]), policies=tuple(params["policies"]), seed=params["seed"]
    )


def _live_forecast_check(params: Mapping[str, Any]) -> None:
    """Refuse, by field, what the worker's forecast would refuse (the same check: live_forecast_check):
    a seed out of range, a pool whose shape the simulator cannot take."""
    try:
        live_forecast_check(_live_base(params), params["pool"])
    except LiveConfigError as error:
        problems: dict[str, str] = {}
        for name, message in error.problems.items():
            field = name if name in ("seed", "days", "policies") else "pool"
            text = message if field != "pool" else f"Pool {error.pool!r} cannot be forecast: {message}"
            problems[field] = " ".join(filter(None, [problems.get(field), text[0].upper() + text[1:]]))
        raise ValidationError(problems) from None
    except LiveSnapshotError as error:  # the pool changed since the cheap check above
        raise ValidationError({"pool": f"{str(error)[0].upper()}{str(error)[1:]}."}) from None


@transaction.atomic
def advisor_live_forecast_request(
    *, pool: str, days: int, policies: list[str] | None = None, seed: int = 1, actor: Actor
) -> AdvisorRun:
    """Queue a forecast of the live `pool` over the next `days` under each of `policies` (default
    LIVE_FORECAST_POLICIES); a worker runs it after the commit. Refused, writing nothing: invalid input
    (by field: no such pool, a pool without hosts, days out of range, an unknown policy), and
    MAX_ACTIVE_RUNS runs already queued or running (code conflict)."""
    params = live_forecast_params_validate(pool=pool, days=days, policies=policies, seed=seed)
    reason = f"live forecast of pool {params['pool']} over {days} days: {', '.join(params['policies'])}"
    return _queue(kind=AdvisorRunKind.LIVE_FORECAST, params=params, reason=reason, actor=actor)


def _finish(run_id: int, *, state: AdvisorRunState, result: dict[str, Any] | None = None, reason: str = "") -> None:
    with transaction.atomic():
        changed = AdvisorRun.objects.filter(pk=run_id, state=AdvisorRunState.RUNNING).update(
            state=state, result=result, failure_reason=reason[:2000], finished_at=clock.now()
        )
        if changed != 1:  # failed as abandoned meanwhile: its slot was given away, keep that verdict
            log.warning("advisor run %s finished but was no longer running; outcome %s dropped", run_id, state)
            return
        run = AdvisorRun.objects.get(pk=run_id)
        data = {"recommended": result.get("recommended")} if result and "recommended" in result else {}
        event_record(kind=f"advisor_run.{state}", subject=run, actor=WORKER_ACTOR, reason=reason, data=data)


def _sweep(run_id: int, request: AdvisorRequest) -> dict[str, Any]:
    jobs = request.jobs()
    results: dict[str, list[dict[str, Any]]] = {}
    if jobs:  # sizes that cannot meet the SLO on paper are not simulated; advice() says so
        urls = scratch_databases(max(1, min(default_lanes(), len(jobs))), tag=f"_advisor{run_id}")
        try:
            with tempfile.TemporaryDirectory(prefix=f"advisor{run_id}-") as work:
                results = jobs_run(jobs, urls, Path(work), say=log.info)
        finally:
            scratch_databases_drop(urls)
    return advice(request, results)


def _live(run_id: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """The live pool forecast, its measures per policy (from_live.py; reads the live database only)."""
    base = _live_base(params)
    lanes = max(1, min(default_lanes(), len(base.policies)))
    forecast = live_forecast(base, params["pool"], lanes=lanes, tag=f"_advisor{run_id}", say=log.info)
    return {"pool": params["pool"], **live_forecast_measures(forecast)}


def _work(run: AdvisorRun) -> dict[str, Any]:
    if run.kind == AdvisorRunKind.LIVE_FORECAST:
        return _live(run.pk, run.params)
    return _sweep(run.pk, advisor_request_from_params(run.params))


@contextmanager
def _run_lease(run_id: int) -> Iterator[bool]:
    """Hold the run's lease while it runs; yields whether this worker got it. The lease is what tells a
    redelivered task whether the worker running the run is still there: a PostgreSQL session advisory
    lock on a connection of its own (a file lock under SQLite, one machine), which dies with the
    process holding it, so a killed worker frees its run at once and a live one keeps it."""
    if connection.vendor == "postgresql":
        with psycopg.connect(**connection.get_connection_params(), autocommit=True) as lease:
            # A worker whose machine vanished sends no FIN: probe it, so the lock goes within about a
            # minute (not the OS's two hours), before the broker delivers the run's message again.
            for setting, value in (("idle", 30), ("interval", 10), ("count", 3)):
                lease.execute(f"SET tcp_keepalives_{setting} = {value}")
            cursor = lease.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LEASE_LOCK_SPACE, run_id])
            held = bool(cursor.fetchone()[0])  # type: ignore[index]
            yield held  # closing the connection releases the lock
        return
    path = Path(settings.VAR_DIR) / "advisor" / f"run-{run_id}.lease"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lease_file:
        try:
            fcntl.flock(lease_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file releases the lock


def advisor_runs_recover() -> list[int]:
    """Hand again to a worker each run that is running while nobody holds its lease: its whole worker
    process died (a machine lost, a kill -9 of the main process), and the broker would deliver its
    message again only after its visibility timeout (an hour on Redis). The beat asks every minute;
    the redelivery takes the run over (_start). Harmless twice: a second message finds the lease held
    or the run over. The ids handed again."""
    lost = []
    for run_id in AdvisorRun.objects.filter(state=AdvisorRunState.RUNNING).order_by("id").values_list("pk", flat=True):
        with _run_lease(run_id) as free:
            if free:
                lost.append(run_id)
    for run_id in lost:  # after the leases are let go, or the worker that takes a run over would find it held
        log.warning("advisor run %s is running with no worker holding it; handed to a worker again", run_id)
        _enqueue(run_id)
    return lost


def _start(run_id: int) -> AdvisorRun | None:
    """Mark the run running (the caller holds its lease); None if it is over. A run already running
    whose lease was free lost its worker (killed mid-run, its message delivered again): it is taken
    over and run again from the start, after dropping what the lost worker left behind."""
    now = clock.now()
    with transaction.atomic():
        if AdvisorRun.objects.filter(pk=run_id, state=AdvisorRunState.QUEUED).update(
            state=AdvisorRunState.RUNNING, started_at=now
        ):
            run = AdvisorRun.objects.get(pk=run_id)
            event_record(kind="advisor_run.started", subject=run, actor=WORKER_ACTOR)
            return run
        lost = AdvisorRun.objects.filter(pk=run_id, state=AdvisorRunState.RUNNING).first()
        if lost is None:
            return None
        reason = f"its worker was lost mid-run (started {lost.started_at:%Y-%m-%d %H:%M:%S} UTC); run again"
        AdvisorRun.objects.filter(pk=run_id, state=AdvisorRunState.RUNNING).update(started_at=now)
        lost.refresh_from_db()
        event_record(kind="advisor_run.restarted", subject=lost, actor=WORKER_ACTOR, reason=reason)
    log.warning("advisor run %s: %s", run_id, reason)
    _leftovers_drop(run_id)
    return lost


def advisor_run_execute(*, run_id: int) -> None:
    """Run a queued run to done or failed, holding its lease (_run_lease) throughout, so the same run
    never runs twice at once. A run another live worker holds, or one that is over, is left alone (a
    duplicate delivery); a running run whose worker is gone is taken over (a redelivery after a crash).
    The sweep runs outside any transaction: it creates databases."""
    with _run_lease(run_id) as held:
        if not held:
            return
        run = _start(run_id)
        if run is None:
            return
        try:
            result = _work(run)
        except Exception as error:
            log.exception("advisor run %s failed", run_id)
            _finish(run_id, state=AdvisorRunState.FAILED, reason=f"{type(error).__name__}: {error}")
            return
        _finish(run_id, state=AdvisorRunState.DONE, result=result)
