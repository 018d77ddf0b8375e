"""The operators' forms for trains and upgrades: create a train, change its SLO, concurrency and
domain order, create an upgrade with its phases and failure policy, replan an upgrade (priority,
deadline, pace), offboard an upgrade.

Each is a plain Django form posted to its own page; it calls the same service the API calls, so a
refusal is the service's ValidationError, shown next to the field it is about (what concerns no
field above the form), with nothing written. A success redirects to the train's or upgrade's page,
which says what happened."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.web import action_required
from opsplanner.permissions import Action
from trains.forms import OffboardForm, ReplanForm, TrainEditForm, TrainForm, UpgradeForm
from trains.models import Train, Upgrade
from trains.selectors_web import (
    domain_suggestions,
    train_domain_order,
    train_get,
    upgrade_get,
    upgrade_rows,
    version_choices,
)


def _posted(request: HttpRequest) -> Any:
    return request.POST if request.method == "POST" else None


def _form_page(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """The form again: 400 when it was posted and refused, so nothing mistakes it for a success."""
    return render(request, template, context, status=400 if context["form"].is_bound else 200)


def _train(pk: int) -> Train:
    train = train_get(pk)
    if train is None:
        raise Http404("There is no such train.")
    return train


def _upgrade(pk: int) -> Upgrade:
    upgrade = upgrade_get(pk)
    if upgrade is None:
        raise Http404("There is no such upgrade.")
    return upgrade


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def train_new(request: HttpRequest) -> HttpResponse:
    form = TrainForm(_posted(request))
    if form.is_bound and form.is_valid() and (train := form.create(actor=request.user)):
        messages.success(request, f"Train {train.name} created for pool {train.pool.name}.")
        return redirect("trains:detail", train.pk)
    context = {"form": form, "title": "New train", "action": reverse("trains:train-new"), "submit": "Create train"}
    return _form_page(request, "trains/train_form.html", context)


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def train_edit(request: HttpRequest, pk: int) -> HttpResponse:
    train = _train(pk)
    form = TrainEditForm.for_train(train, train_domain_order(train), _posted(request))
    if form.is_bound and form.is_valid() and form.update(train_id=train.pk, actor=request.user):
        messages.success(request, f"Train {train.name} saved; the changes apply from its next cycle.")
        return redirect("trains:detail", train.pk)
    context = {
        "form": form,
        "train": train,
        "title": f"Edit train {train.name}",
        "action": reverse("trains:train-edit", args=[train.pk]),
        "submit": "Save",
    }
    return _form_page(request, "trains/train_form.html", context)


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def upgrade_new(request: HttpRequest) -> HttpResponse:
    form = UpgradeForm(_posted(request), versions=version_choices())
    if form.is_bound and form.is_valid() and (upgrade := form.create(actor=request.user)):
        messages.success(request, f"Upgrade #{upgrade.pk} created: {upgrade.component_version} on {upgrade.scope}.")
        return redirect("trains:upgrade-detail", upgrade.pk)
    context = {"form": form, "domains": domain_suggestions()}
    return _form_page(request, "trains/upgrade_form.html", context)


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def upgrade_replan_view(request: HttpRequest, pk: int) -> HttpResponse:
    upgrade = _upgrade(pk)
    form = ReplanForm.for_upgrade(upgrade, _posted(request))
    if form.is_bound and form.is_valid() and form.replan(actor=request.user):
        if form.changes_something:  # still refused above if the upgrade can no longer be replanned
            messages.success(request, f"Upgrade #{upgrade.pk} replanned; the changes apply from its next visit.")
        else:
            messages.info(request, f"Nothing changed: upgrade #{upgrade.pk} keeps its plan.")
        return redirect("trains:upgrade-detail", upgrade.pk)
    context = {"form": form, "row": upgrade_rows([upgrade])[0]}  # a refusal wrote nothing
    return _form_page(request, "trains/upgrade_replan.html", context)


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def upgrade_offboard_view(request: HttpRequest, pk: int) -> HttpResponse:
    upgrade = _upgrade(pk)
    form = OffboardForm(_posted(request))
    if form.is_bound and form.is_valid() and form.offboard(upgrade=upgrade, actor=request.user):
        messages.success(
            request,
            f"Upgrade #{upgrade.pk} offboarded: its pending work is cancelled and {upgrade.component_version} "
            "is withdrawn; re-onboarding needs an approval.",
        )
        return redirect("trains:upgrade-detail", upgrade.pk)
    # Read again: a refusal rolled back whatever the service had changed on the object.
    context = {"form": form, "row": upgrade_rows([_upgrade(pk)])[0]}
    return _form_page(request, "trains/upgrade_offboard.html", context)
