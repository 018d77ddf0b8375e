"""Trains and upgrades pages (to be built: see issue 6)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from opsplanner.live_pages import live_page
from opsplanner.permissions import Action
from opsplanner.web import action_required, refuse


@action_required(Action.READ)
def trains_list(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The trains page is not built yet.", status=501)


@action_required(Action.READ)
def upgrades_list(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The upgrades page is not built yet.", status=501)


@live_page("trains")
def trains_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    return ""
