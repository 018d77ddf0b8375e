"""Reads for the service owners' pages: the services a user may manage with their live windows and
reservations, one service's windows and reservations, and when live trains will next visit the
domains where the service has hosts."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Prefetch, QuerySet

from fleet.models import CapacityReservation, Host, OptOutWindow, Service
from opsplanner.permissions import services_visible_to
from trains.models import LIVE_TRAIN_STATES, Train, VisitState
from trains.selectors import DomainForecast
from trains.selectors_web import trains_forecasts


def manageable_services(user: Any) -> QuerySet[Service]:
    """The services the user may see as an owner (every one for an operator)."""
    return services_visible_to(user, Service.objects.all(), field="self")


def manageable_service(user: Any, name: str) -> Service | None:
    return manageable_services(user).filter(name=name).first()


def services_listed(user: Any, now: dt.datetime) -> QuerySet[Service]:
    """The user's services by name, with their number of placements, owners, and live (not
    cancelled, not ended) opt-out windows and reservations, soonest first."""
    live_windows = OptOutWindow.objects.filter(cancelled_at__isnull=True, ends_at__gt=now).order_by("starts_at")
    live_reservations = (
        CapacityReservation.objects.filter(cancelled_at__isnull=True, ends_at__gt=now)
        .select_related("pool")
        .order_by("starts_at")
    )
    return (
        manageable_services(user)
        .annotate(n_hosts=Count("placements"))
        .prefetch_related(
            "owners",
            Prefetch("optout_windows", queryset=live_windows, to_attr="live_windows"),
            Prefetch("reservations", queryset=live_reservations, to_attr="live_reservations"),
        )
        .order_by("name")
    )


def service_window(service: Service, pk: int) -> OptOutWindow | None:
    window = OptOutWindow.objects.filter(pk=pk, service=service).first()
    if window is not None:
        window.service = service
    return window


def service_reservation(service: Service, pk: int) -> CapacityReservation | None:
    reservation = CapacityReservation.objects.filter(pk=pk, service=service).select_related("pool").first()
    if reservation is not None:
        reservation.service = service
    return reservation


def service_windows(service: Service, now: dt.datetime) -> list[OptOutWindow]:
    """Live and upcoming ones; cancelled ones stay listed (greyed) until they would have ended."""
    return list(OptOutWindow.objects.filter(service=service, ends_at__gt=now).order_by("starts_at", "pk"))


def service_reservations(service: Service, now: dt.datetime) -> list[CapacityReservation]:
    return list(
        CapacityReservation.objects.filter(service=service, ends_at__gt=now)
        .select_related("pool")
        .order_by("starts_at", "pk")
    )


@dataclass
class DomainVisit:
    """One train's forecast for one domain where the service has hosts."""

    train: Train
    forecast: DomainForecast
    overlapping: list[OptOutWindow]

    @property
    def in_progress(self) -> bool:
        return self.forecast.state == VisitState.RUNNING

    @property
    def done(self) -> bool:
        return self.forecast.state == VisitState.DONE


@dataclass
class ServiceDomain:
    domain_id: int
    name: str
    n_hosts: int
    visits: list[DomainVisit] = field(default_factory=list)


@dataclass
class ServicePool:
    pool_id: int
    name: str
    domains: list[ServiceDomain] = field(default_factory=list)
    trains: list[Train] = field(default_factory=list)


@dataclass
class NextVisits:
    pools: list[ServicePool]
    current: list[DomainVisit]  # visits of the service's domains under way now
    following: DomainVisit | None  # the first one that has not started yet
    has_trains: bool


def _overlapping(
    windows: list[OptOutWindow], starts: dt.datetime | None, ends: dt.datetime | None
) -> list[OptOutWindow]:
    if starts is None or ends is None:
        return []
    return [w for w in windows if w.cancelled_at is None and w.starts_at < ends and starts < w.ends_at]


def _service_domains(service: Service) -> tuple[dict[int, ServicePool], dict[int, ServiceDomain]]:
    """The pools and domains where the service has hosts, with its number of hosts in each (one query)."""
    rows = (
        Host.objects.filter(placements__service=service)
        .values("pool_id", "pool__name", "domain_id", "domain__name", "domain__position")
        .annotate(n_hosts=Count("id", distinct=True))
        .order_by("pool__name", "domain__position", "domain__name")
    )
    pools: dict[int, ServicePool] = {}
    domains: dict[int, ServiceDomain] = {}
    for row in rows:
        pool = pools.setdefault(row["pool_id"], ServicePool(pool_id=row["pool_id"], name=row["pool__name"]))
        domain = ServiceDomain(domain_id=row["domain_id"], name=row["domain__name"], n_hosts=row["n_hosts"])
        pool.domains.append(domain)
        domains[domain.domain_id] = domain
    return pools, domains


def service_next_visits(service: Service, windows: list[OptOutWindow]) -> NextVisits:
    """The service's pools and domains, each with every live train's forecast for it, and the
    windows each forecast visit overlaps."""
    pools, domains = _service_domains(service)
    upcoming: list[tuple[dt.datetime, DomainVisit]] = []
    current: list[DomainVisit] = []
    trains = list(
        Train.objects.filter(pool_id__in=pools, state__in=LIVE_TRAIN_STATES)
        .select_related("pool")
        .order_by("pool__name", "emergency", "name")
    )
    forecasts = trains_forecasts(trains)
    for train in trains:
        pools[train.pool_id].trains.append(train)
        for forecast in forecasts[train.pk].domains:
            domain = domains.get(forecast.domain_id)
            if domain is None:
                continue  # a domain without the service's hosts
            visit = DomainVisit(train, forecast, _overlapping(windows, forecast.starts_at, forecast.ends_at))
            domain.visits.append(visit)
            if visit.in_progress:
                current.append(visit)
            elif not visit.done and forecast.starts_at is not None:
                upcoming.append((forecast.starts_at, visit))
    following = min(upcoming, key=lambda pair: pair[0])[1] if upcoming else None
    has_trains = any(pool.trains for pool in pools.values())
    return NextVisits(list(pools.values()), current, following, has_trains)
