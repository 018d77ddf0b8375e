"""`GET /metrics`: Prometheus metrics, for a scraper with the metrics token or a logged-in reader.

A scraper sends `Authorization: Bearer <METRICS_TOKEN>`; a person who may see the fleet overview
(`Action.READ`) may read it with their browser session. Anyone else gets 401 or 403 and a short
plain-text reason, never a number.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from console.metrics import CONTENT_TYPE, collect, render
from opsplanner.permissions import Action, user_can


def _refused(reason: str, status: int) -> HttpResponse:
    response = HttpResponse(reason + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    response["Cache-Control"] = "no-store"
    return response


def _token_matches(token: str) -> bool:
    expected: str = getattr(settings, "METRICS_TOKEN", "") or ""
    # compare_digest takes as long whatever prefix matches; bytes, so any characters are accepted.
    return bool(expected) and bool(token) and hmac.compare_digest(token.encode(), expected.encode())


def refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the metrics, else the 401/403 answer that says why."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        if _token_matches(token.strip()):
            return None
        return _refused("invalid metrics token", 401)
    if request.user.is_authenticated:
        if user_can(request.user, Action.READ):
            return None
        return _refused("your role may not read metrics", 403)
    return _refused("authentication required: send Authorization: Bearer <METRICS_TOKEN>, or log in", 401)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refused = refusal(request)
    if refused is not None:
        return refused
    response = HttpResponse(render(collect()), content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
