"""The live Gantt (to be built)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from opsplanner.live_pages import live_page
from opsplanner.permissions import Action
from opsplanner.web import action_required, refuse


@action_required(Action.READ)
def gantt_page(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The Gantt is not built yet.", status=501)


@live_page("gantt")
def gantt_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    return ""
