"""Ad-hoc operations in the browser: the list, one operation's page, the submit form with its scope
preview, and cancelling. The same services as the API (operation_submit, operation_cancel); a
refusal is shown next to the field it is about and writes nothing (each service is one transaction)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.form_views import posted, service_form_page
from console.forms import OperationListFilter, OperationSubmitForm, ReasonForm, ScopePreviewForm
from console.selectors.operations_pages import (
    all_operations,
    operation_detail,
    operation_state,
    recent_operations,
)
from console.selectors.scope_preview import scope_preview
from console.web import action_required
from opsplanner.models import Operation, OperationState, TaskState
from opsplanner.permissions import Action
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit

FILTER_FIELDS = ("state", "kind", "source", "pool")


@action_required(Action.READ)
@require_GET
def operations_list(request: HttpRequest) -> HttpResponse:
    data = {key: request.GET.getlist(key) for key in FILTER_FIELDS if any(request.GET.getlist(key))}
    flat = {key: values if key in ("state", "kind", "source") else values[0] for key, values in data.items()}
    filters = OperationListFilter(flat, queryset=all_operations())
    rows = recent_operations(filters.qs) if filters.is_valid() else []
    context = {"filters": filters, "rows": rows, "values": flat}
    return render(request, "operations/list.html", context, status=400 if filters.errors else 200)


@action_required(Action.READ)
@require_GET
def operation_page(request: HttpRequest, pk: int) -> HttpResponse:
    return _render_detail(request, pk, cancel_form=ReasonForm())


def _render_detail(request: HttpRequest, pk: int, *, cancel_form: ReasonForm, status: int = 200) -> HttpResponse:
    task_state = request.GET.get("state", "")
    if task_state not in TaskState.values:
        task_state = ""
    detail = operation_detail(operation_id=pk, task_state=task_state, page=request.GET.get("page", "1"))
    if detail is None:
        raise Http404("No such operation.")
    context = {
        "detail": detail,
        "operation": detail.row.operation,
        "cancellable": detail.row.operation.state == OperationState.OPEN,
        "cancel_form": cancel_form,
        "task_states": TaskState.choices,
    }
    return render(request, "operations/detail.html", context, status=status)


@action_required(Action.OPERATE)
@require_http_methods(["GET", "POST"])
def operation_new(request: HttpRequest) -> HttpResponse:
    def submit(data: dict[str, Any]) -> Operation:
        return operation_submit(
            kind=data["kind"],
            scope=data["scope"],
            reason=data["reason"],
            component=data["component"],
            version=data["version"],
            priority=data["priority"],
            needs_drain=data["needs_drain"],
            gang=data["gang"],
            actor=request.user,
        )

    return service_form_page(
        request,
        OperationSubmitForm(posted(request)),
        "operations/new.html",
        write=submit,
        success=lambda operation: f"Operation #{operation.pk} submitted: {operation.scope}.",
        next_url=lambda operation: reverse("operation-detail", kwargs={"pk": operation.pk}),
    )


@action_required(Action.OPERATE)
@require_GET
def operation_scope_preview(request: HttpRequest) -> HttpResponse:
    """The preview partial for the scope typed so far (an HTMX request from the form's scope field)."""
    form = ScopePreviewForm(request.GET)
    context: dict[str, Any] = {"form": form, "preview": None}
    if form.is_valid() and form.cleaned_data["scope"]:
        context["preview"] = scope_preview(scope=form.cleaned_data["scope"], needs_drain=form.drains())
    return render(request, "operations/htmx/scope_preview.html", context)


@action_required(Action.OPERATE)
@require_POST
def operation_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    if operation_state(operation_id=pk) is None:
        raise Http404("No such operation.")
    form = ReasonForm(request.POST)
    if form.is_valid():
        try:
            cancelled = operation_cancel(operation_id=pk, reason=form.cleaned_data["reason"], actor=request.user)
        except ValidationError as error:
            form.add_service_error(error)
        else:
            messages.success(request, f"Operation #{pk}: {cancelled} pending tasks cancelled.")
            return redirect("operation-detail", pk=pk)
    return _render_detail(request, pk, cancel_form=form, status=400)
