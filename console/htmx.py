"""One helper decides between the full page and the partial an HTMX request asks for."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def render_page(
    request: HttpRequest, page: str, partial: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """`page` extends base.html and includes `partial`; an HTMX request (not a boosted navigation)
    gets the partial alone, so a region refreshes without reloading the page."""
    htmx = getattr(request, "htmx", None)
    wants_partial = bool(htmx) and not htmx.boosted  # type: ignore[union-attr]
    return render(request, partial if wants_partial else page, context, status=status)
