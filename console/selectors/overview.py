"""The fleet overview, one row per pool: capacity (the gauge), its trains (state, current visits,
cycle progress against the SLO), active reservations and recent alerts. A fixed number of queries
for any number of pools, so the page and its live row pushes cost the same for a bigger fleet."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import cast

from django.db.models import Count, Max, Q

from fleet.models import CapacityReservation, Pool
from fleet.selectors.capacity import PoolCapacity, pool_capacities
from opsplanner import clock
from opsplanner.models import Event
from trains.models import LIVE_TRAIN_STATES, Cycle, Train, TrainStop, Visit, VisitState

ALERT_WINDOW = dt.timedelta(hours=24)
GAUGE_WIDTH = 220


@dataclass
class TrainSummary:
    train: Train
    cycle: Cycle | None
    visits_done: int = 0
    stops: int = 0
    running_domains: list[str] = field(default_factory=list)

    @property
    def meets_slo(self) -> bool | None:
        if self.cycle is None or self.cycle.forecast_end_at is None:
            return None
        return self.cycle.forecast_end_at <= self.cycle.deadline_at

    @property
    def progress_percent(self) -> int:
        return round(100 * self.visits_done / self.stops) if self.stops else 0


@dataclass
class PoolOverview:
    capacity: PoolCapacity
    trains: list[TrainSummary] = field(default_factory=list)
    reserved_hosts: int = 0  # the largest active reservation: hosts that must stay in service
    alerts: int = 0
    last_alert: Event | None = None

    @property
    def pool(self) -> Pool:
        return self.capacity.pool

    def gauge(self) -> dict[str, float]:
        """Widths (px) of the gauge's segments and x of the floor and reservation lines."""
        total = max(self.capacity.total, 1)
        scale = GAUGE_WIDTH / total
        in_service = self.capacity.in_service * scale
        planned = self.capacity.planned_out * scale
        broken = self.capacity.failure_out * scale
        return {
            "width": GAUGE_WIDTH,
            "in_service": in_service,
            "planned_x": in_service,
            "planned": planned,
            "broken_x": in_service + planned,
            "broken": broken,
            "floor_x": min(GAUGE_WIDTH, self.capacity.buffers.floor * scale),
            "reserved_x": min(GAUGE_WIDTH, self.reserved_hosts * scale),
        }


def pool_overviews(*, pool_id: int | None = None) -> list[PoolOverview]:
    capacities = pool_capacities(pool_id=pool_id)
    rows = {c.pool.pk: PoolOverview(capacity=c) for c in capacities}
    if not rows:
        return []
    now = clock.now()
    ids = list(rows)
    _add_trains(rows, ids)
    reserved = (
        CapacityReservation.objects.filter(
            pool_id__in=ids, cancelled_at__isnull=True, starts_at__lte=now, ends_at__gt=now
        )
        .values("pool_id")
        .annotate(hosts=Max("min_hosts_in_service"))
    )
    for entry in reserved:
        rows[entry["pool_id"]].reserved_hosts = entry["hosts"]
    alerts = (
        Event.objects.filter(pool_id__in=ids, kind__startswith="alert.", created_at__gte=now - ALERT_WINDOW)
        .values("pool_id")
        .annotate(n=Count("id"), last=Max("id"))
    )
    last_ids: dict[int, int] = {}
    for alert in alerts:
        pool = cast(int, alert["pool_id"])  # not null: filtered on pool_id__in
        rows[pool].alerts = alert["n"]
        last_ids[alert["last"]] = pool
    for event in Event.objects.filter(pk__in=list(last_ids)):
        rows[last_ids[event.pk]].last_alert = event
    return list(rows.values())


def _add_trains(rows: dict[int, PoolOverview], ids: list[int]) -> None:
    trains = list(Train.objects.filter(pool_id__in=ids, state__in=LIVE_TRAIN_STATES).order_by("name"))
    if not trains:
        return
    train_ids = [t.pk for t in trains]
    cycles = {c.train_id: c for c in Cycle.objects.filter(train_id__in=train_ids, ended_at__isnull=True)}
    stops = dict(
        TrainStop.objects.filter(train_id__in=train_ids)
        .values("train_id")
        .annotate(n=Count("id"))
        .values_list("train_id", "n")
    )
    cycle_ids = [c.pk for c in cycles.values()]
    done = dict(
        Visit.objects.filter(cycle_id__in=cycle_ids)
        .values("cycle_id")
        .annotate(n=Count("id", filter=Q(state=VisitState.DONE)))
        .values_list("cycle_id", "n")
    )
    running: dict[int, list[str]] = defaultdict(list)
    for train_id, domain in Visit.objects.filter(cycle_id__in=cycle_ids, state=VisitState.RUNNING).values_list(
        "train_id", "domain__name"
    ):
        running[train_id].append(domain)
    for train in trains:
        cycle = cycles.get(train.pk)
        rows[train.pool_id].trains.append(
            TrainSummary(
                train=train,
                cycle=cycle,
                visits_done=done.get(cycle.pk, 0) if cycle else 0,
                stops=stops.get(train.pk, 0),
                running_domains=sorted(running.get(train.pk, [])),
            )
        )
