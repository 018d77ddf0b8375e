"""The live Gantt page: domains (expandable to hosts) over a time window, with zoom, pan and filters."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.utils.safestring import mark_safe

from console.gantt.params import MAX_SPAN, MIN_SPAN, GanttParams, gantt_params
from console.gantt.rows import Gantt, gantt_rows
from console.gantt.svg import render_live_rows, render_svg
from console.htmx import render_page
from console.live_pages import live_page
from console.web import action_required
from fleet.models import Component
from opsplanner.permissions import Action
from trains.models import Train


def _links(params: GanttParams, now: Any) -> dict[str, str]:
    """Zoom and pan as plain links (each a full page, so the live socket follows the new window)."""
    span, middle = params.span, params.start + params.span / 2

    def window(start: Any, end: Any) -> str:
        return "?" + urlencode(params.query(start=start, end=end))

    half = max(span / 2, MIN_SPAN)
    double = min(span * 2, MAX_SPAN)
    return {
        "earlier": window(params.start - span / 2, params.end - span / 2),
        "later": window(params.start + span / 2, params.end + span / 2),
        "zoom_in": window(middle - half / 2, middle + half / 2),
        "zoom_out": window(middle - double / 2, middle + double / 2),
        "now": window(now - span / 3, now + span * 2 / 3),
    }


def gantt_context(gantt: Gantt) -> dict[str, Any]:
    return {
        "gantt": gantt,
        "svg": mark_safe(render_svg(gantt)),
        "links": _links(gantt.params, gantt.now),
    }


@action_required(Action.READ)
def gantt_page(request: HttpRequest) -> HttpResponse:
    params, form = gantt_params(request.GET.dict())
    context: dict[str, Any] = {
        "form": form,
        "trains": Train.objects.order_by("name").only("id", "name"),
        "components": Component.objects.order_by("name").values_list("name", flat=True),
    }
    if params is None:
        context["pools"] = []
        return render_page(request, "opsplanner/gantt.html", "opsplanner/htmx/gantt_chart.html", context, status=400)
    gantt = gantt_rows(params)
    context.update(gantt_context(gantt), pools=gantt.pools, live_params=json.dumps(params.query()))
    return render_page(request, "opsplanner/gantt.html", "opsplanner/htmx/gantt_chart.html", context)


@live_page("gantt")
def gantt_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    """A resync redraws the chart; a change in a pool redraws that pool's rows in place."""
    gantt_params_, _ = gantt_params(params)
    if gantt_params_ is None:
        return ""
    if group is None:
        gantt = gantt_rows(gantt_params_)
        return f'<div id="gantt-chart" hx-swap-oob="innerHTML">{render_svg(gantt)}</div>'
    if not group.startswith("pool-"):
        return ""
    pool_id = int(group.removeprefix("pool-"))
    gantt = gantt_rows(gantt_params_, pool_ids={pool_id})
    if gantt.pool is not None and gantt.pool.pk != pool_id:
        return ""
    return render_live_rows(gantt)
