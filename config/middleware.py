"""Request and response guards: refuse oversized requests before anything reads them (DRF parses
JSON from the stream, which Django's DATA_UPLOAD_MAX_MEMORY_SIZE check on request.body does not
cover); put the Content-Security-Policy on every response."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class RequestSizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse({"detail": "Content-Length is not a number.", "code": "invalid"}, status=400)
        if limit is not None and length > limit:
            return JsonResponse(
                {"detail": f"The request body is {length} bytes; the limit is {limit}.", "code": "too_large"},
                status=413,
            )
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """settings.CONTENT_SECURITY_POLICY on every response that does not set its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy: str = settings.CONTENT_SECURITY_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response
