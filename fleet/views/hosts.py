"""The host page: versions, compatibility, services, who holds it, its tasks, its Gantt row, its events."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from console.gantt.params import gantt_params
from console.gantt.rows import gantt_rows
from console.gantt.svg import render_svg
from console.htmx import render_page
from console.live_pages import live_page
from console.web import action_required
from fleet.models import Host, InstalledVersion, ServicePlacement
from fleet.selectors.compatibility import host_incompatibilities
from opsplanner.models import OPEN_TASK_STATES, Event, HostTask, Lease, WorkItem
from opsplanner.permissions import Action

RECENT_EVENTS = 50
RECENT_ITEMS = 12


def _host_context(host: Host, window: dict[str, str]) -> dict[str, Any]:
    """What changes while the page is open: state, holder, open tasks, the Gantt row, the events."""
    host.refresh_from_db(fields=["state", "state_changed_at"])
    params, form = gantt_params(window, host=host.pk)
    gantt = gantt_rows(params) if params is not None else None
    return {
        "host": host,
        "lease": Lease.objects.filter(host=host, active=True).select_related("operation", "host_task").first(),
        "open_tasks": HostTask.objects.filter(host=host, state__in=OPEN_TASK_STATES)
        .select_related("operation")
        .order_by("-priority", "created_at"),
        "gantt": gantt,
        "gantt_form": form,
        "gantt_svg": mark_safe(render_svg(gantt)) if gantt else "",
        "events": Event.objects.filter(host_id=host.pk).order_by("-id")[:RECENT_EVENTS],
        # Which adapter has each item, and what a failed one printed (its report's steps).
        "work_items": WorkItem.objects.filter(host_id=host.pk).order_by("-id")[:RECENT_ITEMS],
    }


@action_required(Action.READ)
def host_page(request: HttpRequest, hostname: str) -> HttpResponse:
    host = get_object_or_404(Host.objects.select_related("pool", "domain"), hostname=hostname)
    window = {key: request.GET[key] for key in ("start", "end") if key in request.GET}
    context = _host_context(host, window)
    context.update(
        window=window,
        live_params=json.dumps({"host": str(host.pk), **window}),
        versions=InstalledVersion.objects.filter(host=host)
        .select_related("component", "version", "previous_version")
        .order_by("component__layer", "component__name"),
        incompatibilities=host_incompatibilities([host.pk]).get(host.pk, []),
        placements=ServicePlacement.objects.filter(host=host).select_related("service").order_by("service__name"),
    )
    return render_page(request, "fleet/host.html", "fleet/htmx/host_live.html", context)


@live_page("host")
def host_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    """The live part of the host page, when the host's pool changed (or on a resync)."""
    try:
        host = Host.objects.select_related("pool", "domain").get(pk=int(params.get("host", "")))
    except (ValueError, Host.DoesNotExist):
        return ""
    if group is not None and group != f"pool-{host.pool_id}":
        return ""
    window: dict[str, str] = {key: params[key] for key in ("start", "end") if key in params}
    html = render_to_string("fleet/htmx/host_live.html", _host_context(host, window))
    return f'<div id="host-live" hx-swap-oob="innerHTML">{html}</div>'
