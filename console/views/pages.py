"""Top-level pages and the health endpoints."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from console.htmx import render_page
from console.live_pages import live_page, live_renderer
from console.selectors.overview import pool_overviews
from console.web import action_required
from opsplanner.models import Approval, ApprovalState
from opsplanner.permissions import Action, user_can
from opsplanner.selectors.health import database_reachable, worker_health


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if not user_can(request.user, Action.READ):
        # Executors use the API only; they get a page that says so rather than a fleet.
        return render(request, "opsplanner/no_pages.html", status=403)
    return render_page(
        request,
        "opsplanner/home.html",
        "opsplanner/htmx/fleet_overview.html",
        {"overviews": pool_overviews(), "workers": worker_health()},
    )


@live_page("overview")
def overview_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    """The overview's fragments: the whole table on a resync, one pool's row when it changed."""
    if group is None:
        html = render_to_string(
            "opsplanner/htmx/fleet_overview.html", {"overviews": pool_overviews(), "workers": worker_health()}
        )
        return f'<div id="fleet-overview" hx-swap-oob="innerHTML">{html}</div>'
    if not group.startswith("pool-"):
        return ""
    return pool_row_html(int(group.removeprefix("pool-")))


def pool_row_html(pool_id: int) -> str:
    """One pool's overview row as an out-of-band swap ("" when the pool is gone)."""
    rows = pool_overviews(pool_id=pool_id)
    return render_to_string("opsplanner/htmx/pool_row.html", {"row": rows[0], "oob": True}) if rows else ""


@action_required(Action.READ)
@require_GET
def live_fragments(request: HttpRequest) -> HttpResponse:
    """What the live socket would push, for pages without one (the embedded default has no
    cross-process channel layer): the page's resync fragments, polled by live.js."""
    page = request.GET.get("page", "")
    try:
        params = json.loads(request.GET.get("params") or "{}")
    except ValueError:
        params = None
    if not isinstance(params, dict):
        return HttpResponse("params must be a JSON object", status=400, content_type="text/plain")
    renderer = live_renderer(page, request.user)
    if renderer is None:
        return HttpResponse(f"there is no live page {page!r} you may watch", status=404, content_type="text/plain")
    html = renderer(user=request.user, group=None, params={str(k): str(v) for k, v in params.items()})
    if user_can(request.user, Action.APPROVE):
        pending = Approval.objects.filter(state=ApprovalState.PENDING).count()
        html += render_to_string("opsplanner/htmx/approvals_badge.html", {"pending": pending, "oob": True})
    return HttpResponse(html)


@require_GET
def health_web(request: HttpRequest) -> JsonResponse:
    """200 when this web process can reach its database, 503 otherwise."""
    ok = database_reachable()
    return JsonResponse({"status": "ok" if ok else "unavailable", "database": ok}, status=200 if ok else 503)


@require_GET
def health_workers(request: HttpRequest) -> JsonResponse:
    """200 when at least one worker stamped a heartbeat recently, 503 otherwise."""
    health = worker_health()
    return JsonResponse(
        {
            "status": "ok" if health.healthy else "unavailable",
            "live_workers": health.live_workers,
            "stale_workers": health.stale_workers,
            "newest_heartbeat": health.newest_heartbeat.isoformat() if health.newest_heartbeat else None,
        },
        status=200 if health.healthy else 503,
    )
