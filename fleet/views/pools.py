"""Inventory pages (read-only until the dashboard issue adds the live views)."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from console.web import action_required
from fleet.filters import HostFilter
from fleet.models import Host, HostState, Pool
from opsplanner.permissions import Action

HOSTS_PER_PAGE = 100


@action_required(Action.READ)  # not only logged in: executors get no fleet pages
@require_GET
def pool_hosts(request: HttpRequest, name: str) -> HttpResponse:
    pool = get_object_or_404(Pool, name=name)
    hosts = Host.objects.filter(pool=pool).select_related("domain").order_by("domain__position", "hostname")
    # The same FilterSet as GET /api/hosts/: an unknown state is ignored here rather than refused.
    state = request.GET.get("state", "")
    if state not in HostState.values:
        state = ""
    hosts = HostFilter({"state": [state]} if state else {}, queryset=hosts).qs
    page = Paginator(hosts, HOSTS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "fleet/pool_hosts.html",
        {"pool": pool, "page": page, "state": state, "states": HostState.choices},
    )
