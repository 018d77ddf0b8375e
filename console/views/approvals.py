"""The approvals queue: pending requests with what approving them would do, decided by a second operator.

The queue partial is rendered both for a request (the page, HTMX swaps, polling) and without one
(pushed over the live websocket), so it takes everything from its context: whose requests are
whose, the time, and a CSRF token only when there is a request (HTMX sends the body's header)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_POST

from console.htmx import render_page
from console.live_pages import live_page
from console.web import action_required, no_null_characters
from opsplanner import clock
from opsplanner.live import APPROVALS_GROUP
from opsplanner.models import Approval, ApprovalKind, ApprovalState
from opsplanner.permissions import Action, user_can
from opsplanner.services.approvals import approval_decide

PAGE = "opsplanner/approvals.html"
PARTIAL = "opsplanner/htmx/approvals_queue.html"
PENDING_SHOWN = 100
RECENTLY_DECIDED = 20
DECISIONS = {"approve": True, "reject": False}
# What approving does, per kind, so the decider knows what they are agreeing to.
EFFECTS: dict[str, str] = {
    ApprovalKind.EMERGENCY_TRAIN: "starts the emergency train: it ignores opt-out windows and may take hosts "
    "out of service beyond the planned buffer, down to the pool's hard floor",
    ApprovalKind.REONBOARD_UPGRADE: "puts the offboarded upgrade back in its phase and un-withdraws its version",
    ApprovalKind.LARGE_OPERATION: "lets the operation start",
    ApprovalKind.SKIP_PHASE: "graduates the upgrade's held phase without its evidence: the rollout widens to the "
    "next phase at once",
}
# Summary keys the services write, in reading order: (key, label, how to say the value).
SUMMARY_LINES = (
    ("target", "Installs", "{}"),
    ("pool", "Pool", "{}"),
    ("train", "Train", "{}"),
    ("scope", "Scope", "{}"),
    ("hosts", "Hosts", "{} hosts"),
    ("domains", "Domains", "{} domains"),
    ("domains_at_once", "At once", "{} domains at a time"),
    ("hard_floor", "Hard floor", "never fewer than {} hosts in service (the buffers may be used up)"),
    ("in_service", "In service now", "{} hosts"),
    ("upgrade", "Upgrade", "#{}"),
    ("offboarded", "Offboarded because", "{}"),
)


@dataclass(frozen=True)
class PendingRow:
    approval: Approval
    details: list[tuple[str, str]]
    effect: str
    mine: bool  # the viewer asked for it: no buttons (two-person rule)
    expired: bool  # past its time but not yet swept by the scheduler: nobody can approve it


def summary_details(summary: object) -> list[tuple[str, str]]:
    """The request's summary as labelled lines: the known keys first, anything else after, as written."""
    if not isinstance(summary, dict):
        return [("Summary", json.dumps(summary))] if summary else []
    rest = dict(summary)
    details = []
    for key, label, form in SUMMARY_LINES:
        value = rest.pop(key, None)
        if value not in (None, ""):
            details.append((label, form.format(value)))
    for key, value in sorted(rest.items()):
        details.append((key.replace("_", " ").capitalize(), value if isinstance(value, str) else json.dumps(value)))
    return details


def queue_context(user: Any) -> dict[str, Any]:
    """What the queue partial shows to this user, read from the database now."""
    now = clock.now()
    user_id = getattr(user, "pk", None)
    pending = Approval.objects.filter(state=ApprovalState.PENDING).order_by("created_at", "id")
    rows = [
        PendingRow(
            approval=approval,
            details=summary_details(approval.summary),
            effect=EFFECTS.get(approval.kind, ""),
            mine=user_id is not None and approval.requested_by_id == user_id,
            expired=approval.expires_at <= now,
        )
        for approval in pending[:PENDING_SHOWN]
    ]
    decided = Approval.objects.exclude(state=ApprovalState.PENDING).order_by("-decided_at", "-id")[:RECENTLY_DECIDED]
    return {
        "pending": rows,
        "pending_total": pending.count() if len(rows) == PENDING_SHOWN else len(rows),
        "decided": list(decided),
        "now": now,
    }


@action_required(Action.APPROVE)
@require_GET
def approvals_queue(request: HttpRequest) -> HttpResponse:
    return render_page(request, PAGE, PARTIAL, queue_context(request.user))


@action_required(Action.APPROVE)
@require_POST
def approval_decide_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve or reject with a reason. A refusal (own request, expired, already decided, no reason)
    changes nothing and says why; HTMX gets the queue back, a plain form a redirect to the page."""
    decision = request.POST.get("decision", "")
    if decision not in DECISIONS:
        level, text = "error", "Nothing was decided: choose approve or reject."
    else:
        reason = request.POST.get("reason", "")
        try:
            no_null_characters(reason)
            approval = approval_decide(approval_id=pk, approve=DECISIONS[decision], reason=reason, actor=request.user)
        except ValidationError as error:
            level, text = "error", f"Nothing was decided: {' '.join(error.messages)}"
        else:
            level = "success"
            text = f"You {approval.state} request #{approval.pk} ({approval.get_kind_display().lower()})."
    if getattr(request, "htmx", False):
        # 200 even for a refusal: HTMX swaps only successful responses, and the notice says what happened.
        context = {**queue_context(request.user), "notice": {"level": level, "text": text}, "notice_oob": True}
        return render(request, PARTIAL, context)
    messages.add_message(request, messages.ERROR if level == "error" else messages.SUCCESS, text)
    return redirect("approvals")


@live_page("approvals", action=Action.APPROVE)
def approvals_live(*, user: Any, group: str | None, params: dict[str, str]) -> str:
    """The whole queue, for this user, on a resync and whenever an approval changed; only for approvers."""
    if group not in (None, APPROVALS_GROUP) or not user_can(user, Action.APPROVE):
        return ""
    html = render_to_string(PARTIAL, queue_context(user))
    return f'<div id="approvals-queue" hx-swap-oob="innerHTML">{html}</div>'
