"""Service owners' pages (to be built: see issue 6)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from opsplanner.permissions import Action
from opsplanner.web import action_required, refuse


@action_required(Action.MANAGE_OWN_SERVICE)
def my_services(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The service owners' pages are not built yet.", status=501)
