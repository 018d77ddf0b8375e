"""Reading trains: the forecast of when each domain will next be visited, and whether the cycle
meets its SLO (data the API and the Gantt show)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from django.db.models import Count, Min, Q

from fleet.models import Host, HostState
from opsplanner.prepared import IDS, PreparedQuery
from trains.models import STOPPED_TRAIN_STATES, Cycle, Train, TrainState, TrainStop, Visit, VisitState
from trains.services.budget import Correction


@dataclass
class DomainForecast:
    domain_id: int
    domain: str
    position: int
    state: str
    last_visited_at: dt.datetime | None
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    skip_reason: str = ""


@dataclass
class TrainForecast:
    train: Train
    cycle: Cycle | None
    visit_seconds: float
    domains: list[DomainForecast] = field(default_factory=list)
    cycle_end: dt.datetime | None = None
    meets_slo: bool = True
    miss_cause: str = ""
    last_cycle_number: int = 0  # the open cycle's, else the last one's (0: none yet)
    # Recent visits' real length against their planned cost (budget.measured_correction).
    correction: Correction = field(default_factory=Correction)

    @property
    def factor(self) -> float:
        return self.correction.factor


def train_forecast(train: Train, *, now: dt.datetime | None = None, last_visits: bool = True) -> TrainForecast:
    """The forecast of one train's open cycle: the set-based `trains_forecasts` for a list of one
    (the one definition of how a forecast is read; five queries, six with sliding visits that kept no
    host time, one fewer without `last_visits`)."""
    from trains.selectors_web import trains_forecasts  # it builds on this module's rows arithmetic

    return trains_forecasts([train], now=now, last_visits=last_visits)[train.pk]


def forecast_from_rows(
    train: Train,
    cycle: Cycle | None,
    seconds: float,
    last: dict[int, dt.datetime],
    visits: dict[int, Visit],
    stops: list[TrainStop],
    now: dt.datetime,
) -> TrainForecast:
    """The forecast on rows already read (pages read many trains' rows at once): its domains in the
    train's order, timed by `forecast_times`."""
    forecast = TrainForecast(train=train, cycle=cycle, visit_seconds=seconds)
    for stop in stops:
        visit = visits.get(stop.domain_id)
        forecast.domains.append(
            DomainForecast(
                domain_id=stop.domain_id,
                domain=stop.domain.name,
                position=stop.position,
                state=visit.state if visit else "not in a cycle",
                last_visited_at=last.get(stop.domain_id),
                starts_at=None,
                ends_at=None,
                skip_reason=visit.skip_reason if visit else "",
            )
        )
    forecast_times(forecast, visits, now)
    return forecast


def forecast_times(forecast: TrainForecast, visits: dict[int, Visit], now: dt.datetime) -> None:
    """The lane arithmetic (no query): a running visit until `running_visit_end`, each visit to come
    what the per-upgrade forecast played it at when its cycle's inputs last changed
    (`Cycle.played_s`, stored by the train tick: trains/services/cycle_played.py), else the train's
    typical visit; then the cycle's forecast end, and whether it meets its deadline and why not."""
    train, cycle, seconds = forecast.train, forecast.cycle, forecast.visit_seconds
    played = cycle.played_s if cycle is not None else {}
    # Slots: `concurrency` lanes; a running visit holds its lane until its expected end.
    lanes = [now] * train.visit_concurrency
    running = sorted((v for v in visits.values() if v.state == VisitState.RUNNING), key=lambda v: v.started_at or now)
    for i, running_visit in enumerate(running[: len(lanes)]):
        lanes[i] = running_visit_end(running_visit, seconds, now)
    for domain in forecast.domains:
        visit = visits.get(domain.domain_id)
        domain.starts_at = domain.ends_at = None
        if visit is not None and visit.state == VisitState.RUNNING:
            domain.starts_at, domain.ends_at = visit.started_at, running_visit_end(visit, seconds, now)
        elif visit is not None and visit.state == VisitState.DONE:
            domain.starts_at, domain.ends_at = visit.started_at, visit.ended_at
        elif train.state not in (TrainState.FINISHED, TrainState.CANCELLED):
            lane = min(range(len(lanes)), key=lambda i: lanes[i])
            domain.starts_at = lanes[lane]
            domain.ends_at = lanes[lane] = lanes[lane] + dt.timedelta(
                seconds=played.get(str(domain.domain_id), seconds)
            )
    if cycle is None:
        return
    stopped_for = (now - train.state_changed_at) if train.state in STOPPED_TRAIN_STATES else dt.timedelta(0)
    forecast.cycle_end = max([now, *(d.ends_at for d in forecast.domains if d.ends_at)])
    forecast.meets_slo = forecast.cycle_end <= cycle.deadline_at
    forecast.miss_cause = ""
    if not forecast.meets_slo:
        overruns = _overruns(forecast, visits.values(), now)
        forecast.miss_cause = _miss_cause(train, visits.values(), seconds, stopped_for, overruns)


# An overdue visit (past its expected length) runs on for at least this share of that length more.
OVERDUE_MIN_SHARE = 0.1


def running_visit_end(visit: Visit, typical_s: float, now: dt.datetime) -> dt.datetime:
    """When a running visit's hosts are expected back; the one rule of the train's forecast and the
    per-upgrade forecast. Its expected length is its plan's estimate (what its work costs), else the
    train's typical visit (`typical_s`). Past it (overdue), it is expected to run on for as long
    again as it has overrun, and at least OVERDUE_MIN_SHARE of its expected length: never "now",
    which hid the overrun (the visits after it then looked as if they could start at once, and
    `alert.cycle_will_miss` came only at the deadline). So the forecast end of an overrunning
    visit's cycle moves ahead faster than the clock and crosses the deadline before it does."""
    expected_s, ends = _expected_end(visit, typical_s, now)
    if ends > now:
        return ends
    return now + max(now - ends, dt.timedelta(seconds=OVERDUE_MIN_SHARE * expected_s))


def _expected_end(visit: Visit, typical_s: float, now: dt.datetime) -> tuple[float, dt.datetime]:
    """A running visit's expected length (its plan's estimate, else the typical visit) and end by it."""
    expected_s = float((visit.plan or {}).get("estimate_s") or 0) or typical_s
    return expected_s, (visit.started_at or now) + dt.timedelta(seconds=expected_s)


def _overruns(forecast: TrainForecast, visits: Iterable[Visit], now: dt.datetime) -> list[str]:
    """The running visits past their expected end (running_visit_end's overdue ones), said for a miss."""
    names = {d.domain_id: d.domain for d in forecast.domains}
    said = []
    for visit in visits:
        if visit.state != VisitState.RUNNING:
            continue
        expected_s, ends = _expected_end(visit, forecast.visit_seconds, now)
        if ends < now:
            over_min = (now - ends).total_seconds() / 60
            said.append(
                f"the visit of {names.get(visit.domain_id, visit.domain_id)} runs {over_min:.0f} min past its "
                f"expected {expected_s / 60:.0f} min, and is forecast to run as long again"
            )
    return said


def _miss_cause(train: Train, visits: object, seconds: float, stopped_for: dt.timedelta, overruns: list[str]) -> str:
    causes = list(overruns)
    if train.state in STOPPED_TRAIN_STATES:
        causes.append(f"{train.state} for {stopped_for.total_seconds() / 3600:.1f} h ({train.state_reason})")
    skipped = [v for v in visits if v.skip_reason and v.state == VisitState.PLANNED]  # type: ignore[attr-defined]
    if skipped:
        causes.append(f"opt-outs hold {len(skipped)} domains: {skipped[0].skip_reason}")
    if seconds > train.visit_estimate_s:
        causes.append(f"visits take {seconds:.0f} s against {train.visit_estimate_s} s planned")
    return "; ".join(causes) or "the remaining visits do not fit before the deadline"


# Out broken, on the way back: a failed host has its repair queued (or is escalated when it is
# cancelled), a host in repair returns to service or, after MAX_REPAIR_ATTEMPTS, is escalated.
BROKEN_STATES = sorted([HostState.FAILED, HostState.REPAIR])


class DomainHosts(NamedTuple):
    """A domain of a pool as its live hosts make it: how many, when the first of them came, how many
    of them wait for a human (escalated: no visit takes them until they return), and how many are
    out broken (failed or in repair: no visit takes them until their repair returns them)."""

    pool_id: int
    domain_id: int
    position: int
    name: str
    hosts: int
    first_host_at: dt.datetime
    escalated: int
    broken: int = 0


# Every per-upgrade forecast reads it, and the train tick's played cycle (services/cycle_played.py): compiled once.
_DOMAIN_HOSTS = PreparedQuery(
    lambda *, ids: (
        Host.objects.filter(pool_id__any=ids)
        .values_list("pool_id", "domain_id", "domain__position", "domain__name")
        .annotate(
            n=Count("id"),
            first=Min("created_at"),
            escalated=Count("id", filter=Q(state=HostState.ESCALATED)),
            broken=Count("id", filter=Q(state__in=BROKEN_STATES)),
        )
        .order_by()
    ),
    ids=IDS,
)


def pools_domain_hosts(pool_ids: Collection[int]) -> list[DomainHosts]:
    """Every domain of these pools with live hosts (one query)."""
    return [DomainHosts(*row) for row in _DOMAIN_HOSTS.rows(ids=sorted(pool_ids))]


def stops_to_add(train: Train, stop_ids: Collection[int], domains: Iterable[DomainHosts]) -> list[int]:
    """Invariant 6, every domain of the pool visited: the domains of the train's pool (`domains`) that
    are not among its stops and whose hosts all came after the train was created (a rack onboarded,
    or one empty then), in the order they become its last stops as its next cycle opens. A domain
    that had hosts then and is not a stop was left out by the operator's order; an emergency train
    keeps the domains it was approved for. The one rule: the cycle adds these, the forecast plays them."""
    if train.emergency:
        return []
    fresh = [
        d
        for d in domains
        if d.pool_id == train.pool_id and d.domain_id not in stop_ids and d.first_host_at > train.created_at
    ]
    return [d.domain_id for d in sorted(fresh, key=lambda d: (d.position, d.name))]
