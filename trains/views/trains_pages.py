"""The trains and upgrades pages: each train's cycle, per-domain forecast and skips, with pause and
resume for operators; each upgrade's phases with their successes and failures, offboarded upgrades
with the reason and a re-onboard request for operators.

Each train and upgrade is an <article> holding two regions: its status (`id="train-<pk>"`,
`id="upgrade-<pk>"`), which the live websocket replaces whenever its pool changes, and its
actions (the forms), which a pool's push never touches, so it cannot wipe a reason being typed
(a resync replaces the whole list; hx-preserve keeps the typed reason then). Which form shows
follows the status's data-state (static/css/trains.css). Partials take everything from their
context: the live renderer has no request."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from console.htmx import render_page
from console.live_pages import live_page
from console.web import action_required, no_null_characters
from opsplanner.live import APPROVALS_GROUP
from opsplanner.permissions import Action, user_can
from trains.models import Train, Upgrade, UpgradeState
from trains.selectors_web import (
    TrainRow,
    UpgradeRow,
    train_events,
    train_rows,
    trains_shown,
    upgrade_events,
    upgrade_rows,
    upgrades_shown,
)
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.trains import train_pause, train_resume

UPGRADE_FILTERS = [UpgradeState.OFFBOARDED, UpgradeState.ACTIVE, UpgradeState.COMPLETED, UpgradeState.CANCELLED]


def _can(user: Any) -> dict[str, bool]:
    """The `can` the context processor gives pages (all of it: base.html's navigation reads it too),
    for partials rendered without a request."""
    return {action.value: user_can(user, action) for action in Action}


def _next_url(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        return target
    return default


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _form_response(request: HttpRequest, kind: str, context: dict[str, Any]) -> HttpResponse:
    """An HTMX form's answer: the status (the form's target), and out of band the actions (the
    reason box emptied after a success) and the notice. 200 even for a refusal: HTMX swaps only
    successful responses, and the notice says what happened."""
    status = render_to_string(f"trains/htmx/{kind}_status.html", context)
    actions = render_to_string(f"trains/htmx/{kind}_actions.html", {**context, "oob": True}, request=request)
    notice = render_to_string("trains/htmx/notice.html", {**context, "oob": True}, request=request)
    return HttpResponse(status + actions + notice)


# --- trains -----------------------------------------------------------------------------------------
def _trains_context(user: Any, rows: list[TrainRow], next_url: str) -> dict[str, Any]:
    return {"rows": rows, "can": _can(user), "next": next_url}


@action_required(Action.READ)
@require_GET
def trains_list(request: HttpRequest) -> HttpResponse:
    context = _trains_context(request.user, train_rows(trains_shown()), reverse("trains:list"))
    return render_page(request, "trains/trains_list.html", "trains/htmx/trains_list.html", context)


@action_required(Action.READ)
@require_GET
def train_detail(request: HttpRequest, pk: int) -> HttpResponse:
    train = get_object_or_404(Train.objects.select_related("pool"), pk=pk)
    context = _train_detail_context(request.user, train)
    return render_page(request, "trains/train_detail.html", "trains/htmx/train_detail.html", context)


def _train_detail_context(user: Any, train: Train) -> dict[str, Any]:
    rows = train_rows(trains_shown(train_id=train.pk))
    return {
        **_trains_context(user, rows, reverse("trains:detail", args=[train.pk])),
        "row": rows[0],
        "events": train_events(train),
        "detail": True,
        "live_params": json.dumps({"train": train.pk}),
    }


def _train_transition(request: HttpRequest, pk: int, change: Callable[..., Train], action: str) -> HttpResponse:
    """Pause or resume with a reason; a refusal changes nothing and says why. HTMX gets the train's
    status and its actions with the notice; a plain form is redirected back with a message."""
    train = get_object_or_404(Train, pk=pk)
    reason = request.POST.get("reason", "")
    try:
        no_null_characters(reason)
        train = change(train_id=train.pk, reason=reason, actor=request.user)
    except ValidationError as error:
        level, text = "error", f"Nothing changed: {' '.join(error.messages)}"
    else:
        level, text = "success", f"Train {train.name} {action}d: {train.state_reason}"
    if not getattr(request, "htmx", False):
        messages.add_message(request, messages.ERROR if level == "error" else messages.SUCCESS, text)
        return redirect(_next_url(request, reverse("trains:detail", args=[train.pk])))
    row = train_rows(trains_shown(train_id=train.pk))[0]
    context = {
        **_trains_context(request.user, [row], _next_url(request, reverse("trains:list"))),
        "row": row,
        "detail": request.POST.get("detail") == "1",  # the detail page shows the forecast apart
        "notice": {"level": level, "text": text},
        # A refused reason stays in its box to be corrected; an accepted one is cleared.
        "reason": reason,
        "failed": action if level == "error" else "",
        "oob": False,
    }
    return _form_response(request, "train", context)


@action_required(Action.OPERATE)
@require_POST
def train_pause_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _train_transition(request, pk, train_pause, "pause")


@action_required(Action.OPERATE)
@require_POST
def train_resume_view(request: HttpRequest, pk: int) -> HttpResponse:
    return _train_transition(request, pk, train_resume, "resume")


# --- upgrades ---------------------------------------------------------------------------------------
def _upgrades_context(user: Any, rows: list[UpgradeRow], next_url: str) -> dict[str, Any]:
    return {"rows": rows, "can": _can(user), "next": next_url}


@action_required(Action.READ)
@require_GET
def upgrades_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "")
    if state not in UPGRADE_FILTERS:
        state = ""
    rows = upgrade_rows(upgrades_shown(state=state))
    context = {
        **_upgrades_context(request.user, rows, request.get_full_path()),
        "state": state,
        "states": [(s.value, s.label) for s in UPGRADE_FILTERS],
        # Autoescaped into <body data-live-params="…">; the live renderer reads the same params.
        "live_params": json.dumps({"view": "upgrades", **({"state": state} if state else {})}),
    }
    return render_page(request, "trains/upgrades_list.html", "trains/htmx/upgrades_list.html", context)


@action_required(Action.READ)
@require_GET
def upgrade_detail(request: HttpRequest, pk: int) -> HttpResponse:
    upgrade = get_object_or_404(Upgrade, pk=pk)
    context = _upgrade_detail_context(request.user, upgrade)
    return render_page(request, "trains/upgrade_detail.html", "trains/htmx/upgrade_detail.html", context)


def _upgrade_detail_context(user: Any, upgrade: Upgrade) -> dict[str, Any]:
    rows = upgrade_rows(upgrades_shown(upgrade_id=upgrade.pk))
    return {
        **_upgrades_context(user, rows, reverse("trains:upgrade-detail", args=[upgrade.pk])),
        "row": rows[0],
        "events": upgrade_events(upgrade),
        "detail": True,
        "live_params": json.dumps({"upgrade": upgrade.pk}),
    }


@action_required(Action.OPERATE)
@require_POST
def upgrade_reonboard_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Ask a second operator to re-onboard an offboarded upgrade; a refusal changes nothing and says why."""
    upgrade = get_object_or_404(Upgrade, pk=pk)
    reason = request.POST.get("reason", "")
    try:
        no_null_characters(reason)
        approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason=reason, actor=request.user)
    except ValidationError as error:
        level, text = "error", f"Nothing was requested: {' '.join(error.messages)}"
    except IntegrityError:
        # Another operator asked at the same moment; their request stands.
        level, text = "error", "Nothing was requested: a request to re-onboard it is already pending."
    else:
        level = "success"
        text = f"Re-onboarding of upgrade #{upgrade.pk} requested (approval #{approval.pk}); a second operator decides."
    if not getattr(request, "htmx", False):
        messages.add_message(request, messages.ERROR if level == "error" else messages.SUCCESS, text)
        return redirect(_next_url(request, reverse("trains:upgrade-detail", args=[upgrade.pk])))
    row = upgrade_rows(upgrades_shown(upgrade_id=upgrade.pk))[0]
    context = {
        **_upgrades_context(request.user, [row], _next_url(request, reverse("trains:upgrades"))),
        "row": row,
        "notice": {"level": level, "text": text},
        "reason": reason if level == "error" else "",
        "oob": False,
    }
    return _form_response(request, "upgrade", context)


# --- live -------------------------------------------------------------------------------------------
def _statuses(template: str, rows: list[Any], context: dict[str, Any]) -> str:
    return "".join(render_to_string(template, {**context, "row": row, "oob": True}) for row in rows)


def _live_trains(user: Any, group: str | None, pool_id: int | None, train_id: int | None) -> str:
    if train_id is not None:
        train = Train.objects.filter(pk=train_id).only("pool_id").first()
        if train is None or (pool_id is not None and train.pool_id != pool_id):
            return ""
        context = _train_detail_context(user, train)
        status = render_to_string("trains/htmx/train_status.html", {**context, "oob": True})
        forecast = render_to_string("trains/htmx/train_forecast.html", context)
        events = render_to_string("trains/htmx/events.html", context)
        return (
            f'{status}<div id="train-{train.pk}-forecast" hx-swap-oob="innerHTML">{forecast}</div>'
            f'<div id="train-{train.pk}-events" hx-swap-oob="innerHTML">{events}</div>'
        )
    rows = train_rows(trains_shown(pool_id=pool_id))
    context = _trains_context(user, rows, reverse("trains:list"))
    if group is None:
        # A resync: the whole list, trains started while the socket was closed included.
        html = render_to_string("trains/htmx/trains_list.html", context)
        return f'<div id="trains-list" hx-swap-oob="innerHTML">{html}</div>'
    return _statuses("trains/htmx/train_status.html", rows, context)


def _live_upgrades(user: Any, group: str | None, pool_id: int | None, params: dict[str, str]) -> str:
    upgrade_id = _int(params.get("upgrade", ""))
    if upgrade_id is not None:
        rows = upgrade_rows(upgrades_shown(upgrade_id=upgrade_id))
        if not rows or (pool_id is not None and rows[0].upgrade.pool_id != pool_id):
            return ""
        context = _upgrade_detail_context(user, rows[0].upgrade)
        status = render_to_string("trains/htmx/upgrade_status.html", {**context, "oob": True})
        events = render_to_string("trains/htmx/events.html", context)
        return f'{status}<div id="upgrade-{upgrade_id}-events" hx-swap-oob="innerHTML">{events}</div>'
    state = params.get("state", "")
    state = state if state in UPGRADE_FILTERS else ""
    if group == APPROVALS_GROUP:
        # A re-onboarding asked or decided: only offboarded upgrades show that.
        if state not in ("", UpgradeState.OFFBOARDED):
            return ""
        state = UpgradeState.OFFBOARDED
    rows = upgrade_rows(upgrades_shown(pool_id=pool_id, state=state))
    next_url = reverse("trains:upgrades") + (f"?state={state}" if state else "")
    context = _upgrades_context(user, rows, next_url)
    if group is None:
        html = render_to_string("trains/htmx/upgrades_list.html", context)
        return f'<div id="upgrades-list" hx-swap-oob="innerHTML">{html}</div>'
    return _statuses("trains/htmx/upgrade_status.html", rows, context)


@live_page("trains")
def trains_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    """The trains and upgrades pages' fragments. params say which page: {} the trains,
    {"train": pk} one train, {"view": "upgrades", "state": s} the upgrades, {"upgrade": pk} one.
    A resync (group None) sends everything; a pool's change sends that pool's trains or upgrades."""
    if not user_can(user, Action.READ):
        return ""
    pool_id = None
    if group is not None:
        if group.startswith("pool-"):
            pool_id = _int(group.removeprefix("pool-"))
            if pool_id is None:
                return ""
        elif group != APPROVALS_GROUP:
            return ""
    upgrades_page = params.get("view") == "upgrades" or "upgrade" in params
    if not upgrades_page:
        if group == APPROVALS_GROUP:
            return ""  # the trains pages show no approvals
        return _live_trains(user, group, pool_id, _int(params.get("train", "")) if "train" in params else None)
    return _live_upgrades(user, group, pool_id, params)
