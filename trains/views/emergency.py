"""The emergency train form (to be built: see issue 6)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from opsplanner.permissions import Action
from opsplanner.web import action_required, refuse


@action_required(Action.OPERATE)
def emergency_train_new(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The emergency train form is not built yet.", status=501)
