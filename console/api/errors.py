"""One error shape for every refusal: {"detail": ..., "code": ..., "errors": {field: [messages]}}.

Services raise Django's ValidationError; its code says which status fits: "conflict" and "expired"
(a transition from the wrong state, a report with another key) are 409, "not_found" 404,
"permission" and "self_approval" 403, anything else 400 with the field messages.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

CODE_STATUS = {
    "conflict": status.HTTP_409_CONFLICT,
    "expired": status.HTTP_409_CONFLICT,
    "not_found": status.HTTP_404_NOT_FOUND,
    "permission": status.HTTP_403_FORBIDDEN,
    "self_approval": status.HTTP_403_FORBIDDEN,
}
NON_FIELD = "non_field_errors"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "This conflicts with the current state."
    default_code = "conflict"


def _messages(error: DjangoValidationError) -> tuple[dict[str, list[str]], list[str]]:
    """Field messages and the codes of every message."""
    fields: dict[str, list[str]] = {}
    codes: list[str] = []
    if hasattr(error, "error_dict"):
        for field, errors in error.error_dict.items():
            name = NON_FIELD if field == "__all__" else field
            for item in errors:
                fields.setdefault(name, []).extend(item.messages)
                codes.append(item.code or "invalid")
    else:
        for item in error.error_list:
            fields.setdefault(NON_FIELD, []).extend(item.messages)
            codes.append(item.code or "invalid")
    return fields, codes


def _summary(fields: dict[str, list[str]]) -> str:
    parts = [
        f"{name}: {' '.join(messages)}" if name != NON_FIELD else " ".join(messages)
        for name, messages in fields.items()
    ]
    return "; ".join(parts) or "Invalid request."


def django_validation_response(error: DjangoValidationError) -> Response:
    fields, codes = _messages(error)
    code = next((c for c in codes if c in CODE_STATUS), "invalid")
    http_status = CODE_STATUS.get(code, status.HTTP_400_BAD_REQUEST)
    body: dict[str, Any] = {"detail": _summary(fields), "code": code}
    if http_status == status.HTTP_400_BAD_REQUEST:
        body["errors"] = fields
    return Response(body, status=http_status)


def _flatten(detail: Any) -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            if isinstance(value, dict):
                for sub, messages in _flatten(value).items():
                    out[f"{key}.{sub}" if sub != NON_FIELD else key] = messages
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                for index, item in enumerate(value):
                    for sub, messages in _flatten(item).items():
                        out[f"{key}[{index}].{sub}"] = messages
            else:
                out[str(key)] = [str(m) for m in (value if isinstance(value, list) else [value])]
        return out
    if isinstance(detail, list):
        return {NON_FIELD: [str(m) for m in detail]}
    return {NON_FIELD: [str(detail)]}


BUSY_RETRY_AFTER_S = 2


def _no_connection_came_free(exc: Exception) -> bool:
    """The web process's connection pool had none free within its timeout (an overload, not a fault)."""
    try:
        from psycopg_pool import PoolTimeout
    except ImportError:  # no pool on this installation (SQLite, the embedded default)
        return False
    return isinstance(exc, OperationalError) and isinstance(exc.__cause__, PoolTimeout)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if _no_connection_came_free(exc):
        return Response(
            {
                "detail": "The server is busy: no database connection came free in time; retry shortly.",
                "code": "busy",
            },
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(BUSY_RETRY_AFTER_S)},
        )
    if isinstance(exc, DjangoValidationError):
        return django_validation_response(exc)
    if isinstance(exc, IntegrityError):
        # A constraint caught what the checks before it did not (usually a race): a conflict, not a crash.
        return Response(
            {
                "detail": "This conflicts with a change made at the same time; read the current state and retry.",
                "code": "conflict",
            },
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        response.data = {"detail": _summary(fields), "code": "invalid", "errors": fields}
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        response.data = {"detail": str(exc.detail), "code": codes if isinstance(codes, str) else "error"}
        if response.status_code == status.HTTP_400_BAD_REQUEST:  # e.g. a body that is not JSON
            response.data["errors"] = {NON_FIELD: [str(exc.detail)]}
    return response
