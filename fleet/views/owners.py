"""Service owners' pages: the services a user may manage, when trains will next visit their hosts,
and the forms that register, edit and cancel opt-out windows and capacity reservations.

Views stay thin: the forms call fleet.services.owners, which decide and write the events. A service
(or a window of one) outside the user's scope is, to them, one that does not exist: 404, as the API
answers, with a page that says why."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from django.contrib import messages
from django.db.models import Count, Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from fleet.forms import CancelForm, OptOutWindowForm, ReservationForm
from fleet.models import CapacityReservation, Host, OptOutWindow, Service
from opsplanner import clock
from opsplanner.htmx import render_page
from opsplanner.permissions import Action, services_visible_to, user_can, user_roles
from opsplanner.roles import Role
from opsplanner.web import action_required, refuse
from trains.models import LIVE_TRAIN_STATES, Train, VisitState
from trains.selectors import DomainForecast, train_forecast

MANAGE = Action.MANAGE_OWN_SERVICE
FORM_PAGE = "fleet/owners/window_form.html"
FORM_PARTIAL = "fleet/htmx/window_form.html"
CANCEL_PAGE = "fleet/owners/cancel_form.html"
CANCEL_PARTIAL = "fleet/htmx/cancel_form.html"


class OutOfScope(Exception):
    """The object does not exist for this user; the message says why."""


def _scoped(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except OutOfScope as refusal:
            return refuse(request, str(refusal), status=404)

    return guarded


def _manageable_services(request: HttpRequest) -> QuerySet[Service]:
    return services_visible_to(request.user, Service.objects.all(), field="self")


def _service(request: HttpRequest, name: str) -> Service:
    service = _manageable_services(request).filter(name=name).first()
    if service is None or not user_can(request.user, MANAGE, service):
        if Role.OPERATOR in user_roles(request.user):
            raise OutOfScope(f"There is no service {name}.")
        raise OutOfScope(f"There is no service {name} among the services you own; you can manage only your own.")
    return service


def _window(request: HttpRequest, service: Service, pk: int) -> OptOutWindow:
    window = OptOutWindow.objects.filter(pk=pk, service=service).first()
    if window is None or not user_can(request.user, MANAGE, window):
        raise OutOfScope(f"Service {service.name} has no opt-out window #{pk}.")
    window.service = service
    return window


def _reservation(request: HttpRequest, service: Service, pk: int) -> CapacityReservation:
    reservation = CapacityReservation.objects.filter(pk=pk, service=service).select_related("pool").first()
    if reservation is None or not user_can(request.user, MANAGE, reservation):
        raise OutOfScope(f"Service {service.name} has no capacity reservation #{pk}.")
    reservation.service = service
    return reservation


def _done(request: HttpRequest, service: Service, message: str) -> HttpResponse:
    """After a write: back to the service page (a full navigation, also for an HTMX post)."""
    messages.success(request, message)
    url = reverse("fleet:service", args=[service.name])
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    return redirect(url)


def _posted(request: HttpRequest) -> Any:
    return request.POST if request.method == "POST" else None


# The list and the service page.


@action_required(MANAGE)
@require_GET
def my_services(request: HttpRequest) -> HttpResponse:
    now = clock.now()
    live_windows = OptOutWindow.objects.filter(cancelled_at__isnull=True, ends_at__gt=now).order_by("starts_at")
    live_reservations = (
        CapacityReservation.objects.filter(cancelled_at__isnull=True, ends_at__gt=now)
        .select_related("pool")
        .order_by("starts_at")
    )
    services = (
        _manageable_services(request)
        .annotate(n_hosts=Count("placements"))
        .prefetch_related(
            "owners",
            Prefetch("optout_windows", queryset=live_windows, to_attr="live_windows"),
            Prefetch("reservations", queryset=live_reservations, to_attr="live_reservations"),
        )
        .order_by("name")
    )
    is_operator = Role.OPERATOR in user_roles(request.user)
    return render(request, "fleet/owners/services.html", {"services": services, "now": now, "is_operator": is_operator})


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


def _overlapping(
    windows: list[OptOutWindow], starts: dt.datetime | None, ends: dt.datetime | None
) -> list[OptOutWindow]:
    if starts is None or ends is None:
        return []
    return [w for w in windows if w.cancelled_at is None and w.starts_at < ends and starts < w.ends_at]


@dataclass
class NextVisits:
    pools: list[ServicePool]
    current: list[DomainVisit]  # visits of the service's domains under way now
    following: DomainVisit | None  # the first one that has not started yet
    has_trains: bool


def _next_visits(service: Service, windows: list[OptOutWindow]) -> NextVisits:
    """The service's pools and domains, each with every live train's forecast for it."""
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
    upcoming: list[tuple[dt.datetime, DomainVisit]] = []
    current: list[DomainVisit] = []
    trains = Train.objects.filter(pool_id__in=pools, state__in=LIVE_TRAIN_STATES).select_related("pool")
    for train in trains.order_by("pool__name", "emergency", "name"):
        pools[train.pool_id].trains.append(train)
        for forecast in train_forecast(train).domains:
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


@action_required(MANAGE)
@_scoped
@require_GET
def service_page(request: HttpRequest, name: str) -> HttpResponse:
    service = _service(request, name)
    now = clock.now()
    # Live and upcoming ones; cancelled ones stay listed (greyed) until they would have ended.
    windows = list(OptOutWindow.objects.filter(service=service, ends_at__gt=now).order_by("starts_at", "pk"))
    reservations = list(
        CapacityReservation.objects.filter(service=service, ends_at__gt=now)
        .select_related("pool")
        .order_by("starts_at", "pk")
    )
    context = {
        "service": service,
        "now": now,
        "visits": _next_visits(service, windows),
        "windows": windows,
        "reservations": reservations,
    }
    return render(request, "fleet/owners/service.html", context)


# Opt-out windows.


def _form_page(request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    return render_page(request, FORM_PAGE, FORM_PARTIAL, context)


@action_required(MANAGE)
@_scoped
@require_http_methods(["GET", "POST"])
def optout_new(request: HttpRequest, name: str) -> HttpResponse:
    service = _service(request, name)
    form = OptOutWindowForm(_posted(request))
    if form.is_bound and form.is_valid() and (window := form.create(service=service, actor=request.user)):
        return _done(request, service, f"Opt-out window #{window.pk} registered.")
    context = {
        "service": service,
        "form": form,
        "title": f"Register an opt-out window for {service.name}",
        "explain": "Trains avoid draining the service's hosts during the window if they can; "
        "an emergency train does not.",
        "action": reverse("fleet:optout-new", args=[service.name]),
        "submit": "Register",
    }
    return _form_page(request, context)


@action_required(MANAGE)
@_scoped
@require_http_methods(["GET", "POST"])
def optout_edit(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    service = _service(request, name)
    window = _window(request, service, pk)
    form = OptOutWindowForm.for_window(window, _posted(request))
    if form.is_bound and form.is_valid() and form.update(window=window, actor=request.user):
        return _done(request, service, f"Opt-out window #{window.pk} saved.")
    context = {
        "service": service,
        "form": form,
        "subject": window,
        "title": f"Edit opt-out window #{window.pk} of {service.name}",
        "action": reverse("fleet:optout-edit", args=[service.name, window.pk]),
        "submit": "Save",
    }
    return _form_page(request, context)


@action_required(MANAGE)
@_scoped
@require_http_methods(["GET", "POST"])
def optout_cancel(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    service = _service(request, name)
    window = _window(request, service, pk)
    form = CancelForm(_posted(request))
    if form.is_bound and form.is_valid() and form.cancel_window(window=window, actor=request.user):
        return _done(request, service, f"Opt-out window #{window.pk} cancelled.")
    context = {
        "service": service,
        "form": form,
        "subject": window,
        "kind": "opt-out window",
        "action": reverse("fleet:optout-cancel", args=[service.name, window.pk]),
    }
    return render_page(request, CANCEL_PAGE, CANCEL_PARTIAL, context)


# Capacity reservations.


@action_required(MANAGE)
@_scoped
@require_http_methods(["GET", "POST"])
def reservation_new(request: HttpRequest, name: str) -> HttpResponse:
    service = _service(request, name)
    form = ReservationForm(_posted(request), service=service)
    if form.is_bound and form.is_valid() and (reservation := form.create(service=service, actor=request.user)):
        return _done(request, service, f"Capacity reservation #{reservation.pk} registered.")
    context = {
        "service": service,
        "form": form,
        "title": f"Reserve capacity for {service.name}",
        "explain": "During the window, maintenance keeps at least this many hosts of the pool in service.",
        "action": reverse("fleet:reservation-new", args=[service.name]),
        "submit": "Reserve",
    }
    return _form_page(request, context)


@action_required(MANAGE)
@_scoped
@require_http_methods(["GET", "POST"])
def reservation_edit(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    service = _service(request, name)
    reservation = _reservation(request, service, pk)
    form = ReservationForm.for_reservation(reservation, _posted(request))
    if form.is_bound and form.is_valid() and form.update(reservation=reservation, actor=request.user):
        return _done(request, service, f"Capacity reservation #{reservation.pk} saved.")
    context = {
        "service": service,
        "form": form,
        "subject": reservation,
        "title": f"Edit capacity reservation #{reservation.pk} of {service.name}",
        "explain": f"In pool {reservation.pool.name}; to reserve in another pool, register a new reservation.",
        "action": reverse("fleet:reservation-edit", args=[service.name, reservation.pk]),
        "submit": "Save",
    }
    return _form_page(request, context)


@action_required(MANAGE)
@_scoped
@require_http_methods(["GET", "POST"])
def reservation_cancel(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    service = _service(request, name)
    reservation = _reservation(request, service, pk)
    form = CancelForm(_posted(request))
    if form.is_bound and form.is_valid() and form.cancel_reservation(reservation=reservation, actor=request.user):
        return _done(request, service, f"Capacity reservation #{reservation.pk} cancelled.")
    context = {
        "service": service,
        "form": form,
        "subject": reservation,
        "kind": "capacity reservation",
        "action": reverse("fleet:reservation-cancel", args=[service.name, reservation.pk]),
    }
    return render_page(request, CANCEL_PAGE, CANCEL_PARTIAL, context)
