"""The emergency train form: one operator requests, a second one approves on the approvals page."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from console.web import action_required
from opsplanner.permissions import Action
from trains.forms import EmergencyTrainForm
from trains.services.emergency import emergency_train_request


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def emergency_train_new(request: HttpRequest) -> HttpResponse:
    form = EmergencyTrainForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            train = emergency_train_request(
                pool=data["pool"],
                component=data["component"],
                version=data["version"],
                reason=data["reason"],
                scope=data["scope"],
                domains_at_once=data["domains_at_once"],
                visit_estimate_s=data["visit_estimate_s"],
                actor=request.user,
            )
        except ValidationError as error:
            # The service wrote nothing (one transaction); say why next to the field concerned.
            form.add_service_error(error)
        else:
            messages.success(
                request,
                f"Emergency train {train.name} requested for pool {train.pool.name}: "
                "it waits for a second operator to approve it.",
            )
            return redirect("approvals")
    context = {"form": form, **EmergencyTrainForm.catalogue()}
    return render(request, "trains/emergency_form.html", context, status=400 if form.is_bound else 200)
