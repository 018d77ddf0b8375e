"""The shape of a page whose form writes through one service: a GET shows the form; a valid POST
calls the service and redirects with a message; a refusal (a ValidationError: the service, one
transaction, wrote nothing) is shown next to the field it is about, with the form again (400)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render

Written = TypeVar("Written")


class ServiceErrorForm(Protocol):
    """A bound-or-not Django form that can show a service's refusal next to its fields."""

    is_bound: bool
    cleaned_data: dict[str, Any]

    def is_valid(self) -> bool: ...

    def add_service_error(self, error: ValidationError) -> None: ...


def posted(request: HttpRequest) -> QueryDict | None:
    """The data to bind a form to: the POST's, or none for a GET (an unbound form)."""
    return request.POST if request.method == "POST" else None


def service_form_page(
    request: HttpRequest,
    form: ServiceErrorForm,
    template: str,
    *,
    write: Callable[[dict[str, Any]], Written],
    success: Callable[[Written], str],
    next_url: Callable[[Written], str],
    page_context: Callable[[], dict[str, Any]] = dict,
) -> HttpResponse:
    """`write` gets the cleaned data; after it, `success` says what was done and `next_url` is where
    to go. `page_context` adds to the form's context, and is read only when the form is shown."""
    if form.is_bound and form.is_valid():
        try:
            written = write(form.cleaned_data)
        except ValidationError as error:
            form.add_service_error(error)
        else:
            messages.success(request, success(written))
            return redirect(next_url(written))
    context = {"form": form, **page_context()}
    # Shown again after a POST means refused: 400, so nothing mistakes it for a success.
    return render(request, template, context, status=400 if form.is_bound else 200)
