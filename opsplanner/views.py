"""Top-level pages and the health endpoints."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from fleet.selectors.capacity import pool_capacities
from opsplanner.htmx import render_page
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
        {"capacities": pool_capacities(), "workers": worker_health()},
    )


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
