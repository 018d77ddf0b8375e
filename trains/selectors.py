"""Reading trains: the forecast of when each domain will next be visited, and whether the cycle
meets its SLO (data the API and the Gantt show)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db.models import Max

from opsplanner import clock
from trains.models import STOPPED_TRAIN_STATES, Cycle, Train, TrainState, TrainStop, Visit, VisitState

RECENT_VISITS = 10


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


def visit_seconds(train: Train) -> float:
    """Expected length of a visit that drains hosts: the mean of the recent ones, else the estimate."""
    recent = list(
        Visit.objects.filter(train=train, state=VisitState.DONE, started_at__isnull=False)
        .exclude(plan__hosts=[])
        .order_by("-ended_at")
        .values_list("started_at", "ended_at")[:RECENT_VISITS]
    )
    if not recent:
        return float(train.visit_estimate_s)
    return sum((end - start).total_seconds() for start, end in recent) / len(recent)


def train_forecast(
    train: Train, *, now: dt.datetime | None = None, cycle: Cycle | None = None, last_visits: bool = True
) -> TrainForecast:
    """The forecast of the open cycle (pass it as `cycle` if already read). Without `last_visits`
    the domains' last visit times are left out: the train tick needs only the cycle's end, and
    they are an aggregate over every visit the train ever made."""
    now = now or clock.now()
    if cycle is None:
        cycle = Cycle.objects.filter(train=train, ended_at__isnull=True).first()
    seconds = visit_seconds(train)
    last = (
        dict(
            Visit.objects.filter(train=train, state=VisitState.DONE)
            .values("domain_id")
            .annotate(at=Max("ended_at"))
            .values_list("domain_id", "at")
        )
        if last_visits
        else {}
    )
    visits = {v.domain_id: v for v in Visit.objects.filter(cycle=cycle).select_related("domain")} if cycle else {}
    stops = list(train.stops.select_related("domain").order_by("position"))
    return forecast_from_rows(train, cycle, seconds, last, visits, stops, now)


def forecast_from_rows(
    train: Train,
    cycle: Cycle | None,
    seconds: float,
    last: dict[int, dt.datetime],
    visits: dict[int, Visit],
    stops: list[TrainStop],
    now: dt.datetime,
) -> TrainForecast:
    """The lane arithmetic of the forecast on rows already read (pages read many trains' rows at once)."""
    forecast = TrainForecast(train=train, cycle=cycle, visit_seconds=seconds)
    stopped_for = (now - train.state_changed_at) if train.state in STOPPED_TRAIN_STATES else dt.timedelta(0)
    # Slots: `concurrency` lanes; a running visit holds its lane until its expected end.
    lanes = [now] * train.visit_concurrency
    running = sorted((v for v in visits.values() if v.state == VisitState.RUNNING), key=lambda v: v.started_at or now)
    for i, visit in enumerate(running[: len(lanes)]):
        lanes[i] = max(now, (visit.started_at or now) + dt.timedelta(seconds=seconds))
    step = dt.timedelta(seconds=seconds)
    for stop in stops:
        visit = visits.get(stop.domain_id)
        state = visit.state if visit else "not in a cycle"
        starts = ends = None
        if visit is not None and visit.state == VisitState.RUNNING:
            starts, ends = visit.started_at, max(now, (visit.started_at or now) + step)
        elif visit is not None and visit.state == VisitState.DONE:
            starts, ends = visit.started_at, visit.ended_at
        elif train.state not in (TrainState.FINISHED, TrainState.CANCELLED):
            lane = min(range(len(lanes)), key=lambda i: lanes[i])
            starts = lanes[lane]
            ends = starts + step
            lanes[lane] = ends
        forecast.domains.append(
            DomainForecast(
                domain_id=stop.domain_id,
                domain=stop.domain.name,
                position=stop.position,
                state=state,
                last_visited_at=last.get(stop.domain_id),
                starts_at=starts,
                ends_at=ends,
                skip_reason=visit.skip_reason if visit else "",
            )
        )
    if cycle is None:
        return forecast
    forecast.cycle_end = max([now, *(d.ends_at for d in forecast.domains if d.ends_at)])
    forecast.meets_slo = forecast.cycle_end <= cycle.deadline_at
    if not forecast.meets_slo:
        forecast.miss_cause = _miss_cause(train, visits.values(), seconds, stopped_for)
    return forecast


def _miss_cause(train: Train, visits: object, seconds: float, stopped_for: dt.timedelta) -> str:
    causes = []
    if train.state in STOPPED_TRAIN_STATES:
        causes.append(f"{train.state} for {stopped_for.total_seconds() / 3600:.1f} h ({train.state_reason})")
    skipped = [v for v in visits if v.skip_reason and v.state == VisitState.PLANNED]  # type: ignore[attr-defined]
    if skipped:
        causes.append(f"opt-outs hold {len(skipped)} domains: {skipped[0].skip_reason}")
    if seconds > train.visit_estimate_s:
        causes.append(f"visits take {seconds:.0f} s against {train.visit_estimate_s} s planned")
    return "; ".join(causes) or "the remaining visits do not fit before the deadline"
