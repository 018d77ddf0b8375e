"""Service owners' pages: the services a user may manage, when trains will next visit their hosts,
and the forms that register, edit and cancel opt-out windows and capacity reservations.

Views stay thin: the forms call fleet.services.owners, which decide and write the events. A service
(or a window of one) outside the user's scope is, to them, one that does not exist: 404, as the API
answers, with a page that says why."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import HttpResponseClientRedirect

from console.htmx import render_page
from console.web import action_required, refuse
from fleet.forms import CancelForm, OptOutWindowForm, ReservationForm
from fleet.models import CapacityReservation, OptOutWindow, Service
from fleet.selectors.owners import (
    manageable_service,
    service_next_visits,
    service_reservation,
    service_reservations,
    service_window,
    service_windows,
    services_listed,
)
from opsplanner import clock
from opsplanner.permissions import Action, user_can, user_roles
from opsplanner.roles import Role

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


def _service(request: HttpRequest, name: str) -> Service:
    service = manageable_service(request.user, name)
    if service is None or not user_can(request.user, MANAGE, service):
        if Role.OPERATOR in user_roles(request.user):
            raise OutOfScope(f"There is no service {name}.")
        raise OutOfScope(f"There is no service {name} among the services you own; you can manage only your own.")
    return service


def _window(request: HttpRequest, service: Service, pk: int) -> OptOutWindow:
    window = service_window(service, pk)
    if window is None or not user_can(request.user, MANAGE, window):
        raise OutOfScope(f"Service {service.name} has no opt-out window #{pk}.")
    return window


def _reservation(request: HttpRequest, service: Service, pk: int) -> CapacityReservation:
    reservation = service_reservation(service, pk)
    if reservation is None or not user_can(request.user, MANAGE, reservation):
        raise OutOfScope(f"Service {service.name} has no capacity reservation #{pk}.")
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
    services = services_listed(request.user, now)
    is_operator = Role.OPERATOR in user_roles(request.user)
    return render(request, "fleet/owners/services.html", {"services": services, "now": now, "is_operator": is_operator})


@action_required(MANAGE)
@_scoped
@require_GET
def service_page(request: HttpRequest, name: str) -> HttpResponse:
    service = _service(request, name)
    now = clock.now()
    windows = service_windows(service, now)
    context = {
        "service": service,
        "now": now,
        "visits": service_next_visits(service, windows),
        "windows": windows,
        "reservations": service_reservations(service, now),
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
