"""The approvals queue (to be built: see issue 6)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from opsplanner.live_pages import live_page
from opsplanner.permissions import Action
from opsplanner.web import action_required, refuse


@action_required(Action.APPROVE)
def approvals_queue(request: HttpRequest) -> HttpResponse:
    return refuse(request, "The approvals queue is not built yet.", status=501)


@action_required(Action.APPROVE)
def approval_decide_view(request: HttpRequest, pk: int) -> HttpResponse:
    return refuse(request, "Deciding from the page is not built yet.", status=501)


@live_page("approvals")
def approvals_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    return ""
