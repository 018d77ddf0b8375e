"""The event log (to be built)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from opsplanner.permissions import Action
from opsplanner.web import action_required, refuse


@action_required(Action.READ)
def event_log(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The event log is not built yet.", status=501)
