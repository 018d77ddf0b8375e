"""The event log: every transition and decision, newest first, filtered with the API's FilterSet."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from console.filters import EventFilter
from console.htmx import render_page
from console.live_pages import live_page
from console.web import action_required
from fleet.models import Pool
from opsplanner.models import Event
from opsplanner.permissions import Action

PAGE_SIZE = 100
FILTER_FIELDS = ("kind", "pool", "host", "operation", "train", "since", "until", "subject_type", "subject_id")


def _event_page(values: dict[str, str]) -> dict[str, Any]:
    """One page of events for these filters (keyset: `before` an event id), or the filter's errors."""
    filters = EventFilter({k: v for k, v in values.items() if k in FILTER_FIELDS and v}, queryset=Event.objects.all())
    context: dict[str, Any] = {"filters": filters, "values": values, "events": [], "older": None}
    if not filters.is_valid():
        return context
    events = filters.qs.order_by("-id")
    before = values.get("before", "")
    if before:
        if not (before.isascii() and before.isdigit()):  # isdigit alone admits "²", which int() refuses
            filters.errors["before"] = ["Before takes an event id (a whole number)."]
            return context
        events = events.filter(id__lt=int(before))
    rows = list(events[: PAGE_SIZE + 1])
    context["events"] = rows[:PAGE_SIZE]
    if len(rows) > PAGE_SIZE:
        query = {k: v for k, v in values.items() if k in FILTER_FIELDS and v}
        query["before"] = str(rows[PAGE_SIZE - 1].pk)
        context["older"] = urlencode(query)
    return context


@action_required(Action.READ)
def event_log(request: HttpRequest) -> HttpResponse:
    values = {key: request.GET.get(key, "").strip() for key in (*FILTER_FIELDS, "before")}
    context = _event_page(values)
    context.update(
        pools=Pool.objects.order_by("name").values_list("id", "name"),
        live_params=json.dumps({k: v for k, v in values.items() if v}),
    )
    status = 400 if context["filters"].errors else 200
    return render_page(request, "opsplanner/events.html", "opsplanner/htmx/event_rows.html", context, status=status)


@live_page("events")
def events_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    """The newest page follows new events; an older page (`before`) stays as it is."""
    if params.get("before"):
        return ""
    pool = params.get("pool", "")
    if group is not None and pool and group != f"pool-{pool}":
        return ""
    context = _event_page({key: params.get(key, "") for key in FILTER_FIELDS})
    if context["filters"].errors:
        return ""
    html = render_to_string("opsplanner/htmx/event_rows.html", context)
    return f'<div id="event-rows" hx-swap-oob="innerHTML">{html}</div>'
