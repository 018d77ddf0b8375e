"""The emergency train form: one operator requests, a second one approves on the approvals page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.form_views import posted, service_form_page
from console.web import action_required
from opsplanner.permissions import Action
from trains.forms import EmergencyTrainForm
from trains.models import Train
from trains.services.emergency import emergency_train_request


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def emergency_train_new(request: HttpRequest) -> HttpResponse:
    def request_train(data: dict[str, Any]) -> Train:
        return emergency_train_request(
            pool=data["pool"],
            component=data["component"],
            version=data["version"],
            reason=data["reason"],
            scope=data["scope"],
            domains_at_once=data["domains_at_once"],
            visit_estimate_s=data["visit_estimate_s"],
            actor=request.user,
        )

    return service_form_page(
        request,
        EmergencyTrainForm(posted(request)),
        "trains/emergency_form.html",
        write=request_train,
        success=lambda train: (
            f"Emergency train {train.name} requested for pool {train.pool.name}: "
            "it waits for a second operator to approve it."
        ),
        next_url=lambda _: reverse("approvals"),
        page_context=EmergencyTrainForm.catalogue,
    )
