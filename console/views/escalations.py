"""Retry or release an escalated host (three repairs failed; it waits for a human), from its page.
A GET shows what the action does and asks for a reason; the POST calls the service, which starts a
new repair (retry) or the host's verification (release): never straight back to service."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from console.forms import ReasonForm
from console.selectors.operations_pages import escalated_host
from console.web import action_required
from opsplanner.permissions import Action
from opsplanner.services.escalations import RELEASE, RETRY, host_escalation_release, host_escalation_retry

DONE_WORDS = {RETRY: "repair retried", RELEASE: "released: it is verified before it returns to service"}
ACTIONS = {
    RETRY: (
        host_escalation_retry,
        "Retry the repair",
        "starts a new repair now, with three attempts again; the host is verified before it returns to service",
    ),
    RELEASE: (
        host_escalation_release,
        "Release: fixed by hand",
        "skips the repair and starts the host's pre-return "
        "verification; it returns to service only if every check passes, else it goes back to repair",
    ),
}


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def host_escalation_view(request: HttpRequest, hostname: str, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("No such action.")
    host = escalated_host(hostname=hostname)
    service, title, effect = ACTIONS[action]
    form = ReasonForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid() and host is not None:
        try:
            operation = service(host_id=host.pk, reason=form.cleaned_data["reason"], actor=request.user)
        except ValidationError as error:
            form.add_service_error(error)  # nothing written: one transaction
        else:
            messages.success(request, f"Host {hostname}: {DONE_WORDS[action]} as operation #{operation.pk}.")
            return redirect("operation-detail", pk=operation.pk)
    elif form.is_bound and host is None:
        form.add_error(None, f"Host {hostname} is not escalated (any more): nothing to {action}.")
    context = {"form": form, "host": host, "hostname": hostname, "action": action, "title": title, "effect": effect}
    status = 400 if form.is_bound else (200 if host is not None else 404)
    return render(request, "operations/escalation.html", context, status=status)
