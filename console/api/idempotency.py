"""`Idempotency-Key` on POSTs that create or change something: a retry returns the first answer.

The record is written in the same transaction as the work, so a crash leaves either both or
neither. Two requests racing with one key: the second blocks on the unique index (or on the rows
the first one locked) until the first commits, then rolls its own work back and answers with the
first one's response, whatever its own work made of the first one's (a conflict, a refusal).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from opsplanner.models import IdempotencyRecord

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 128


def check_key(key: str) -> None:
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise serializers.ValidationError({HEADER: f"Give an {HEADER} of 1 to {MAX_KEY_LENGTH} printable characters."})


def _request_hash(request: Any) -> str:
    # The query is part of the request: `?dry_run=true` and the real create are two requests.
    body = json.dumps(request.data, sort_keys=True, default=str) if request.data else ""
    return hashlib.sha256(f"{request.method} {request.get_full_path()}\n{body}".encode()).hexdigest()


def _replay(record: IdempotencyRecord, request_hash: str) -> Response:
    if record.request_hash != request_hash:
        return Response(
            {
                "detail": f"{HEADER} {record.key!r} was already used for a different request "
                f"({record.method} {record.path}); use a new key for a new request.",
                "code": "idempotency_key_reused",
            },
            status=status.HTTP_409_CONFLICT,
        )
    response = Response(record.response, status=record.status_code)
    response["Idempotent-Replayed"] = "true"
    return response


class _Abort(Exception):
    """Internal control flow: roll back the work of a request that did not succeed."""

    def __init__(self, response: Response) -> None:
        self.response = response


def idempotent(view_method: Callable[..., Response]) -> Callable[..., Response]:
    """Run the view in one transaction; with an Idempotency-Key, store or replay its answer."""

    @functools.wraps(view_method)
    def wrapper(self: Any, request: Any, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get(HEADER, "")
        if not key:
            with transaction.atomic():
                return view_method(self, request, *args, **kwargs)
        check_key(key)
        request_hash = _request_hash(request)
        existing = IdempotencyRecord.objects.filter(user=request.user, key=key).first()
        if existing is not None:
            return _replay(existing, request_hash)
        try:
            with transaction.atomic():
                response = view_method(self, request, *args, **kwargs)
                if not 200 <= response.status_code < 300:
                    raise _Abort(response)
                body = json.loads(JSONRenderer().render(response.data) or b"null")
                IdempotencyRecord.objects.create(
                    user=request.user,
                    key=key,
                    method=request.method,
                    path=request.get_full_path()[:300],
                    request_hash=request_hash,
                    status_code=response.status_code,
                    response=body,
                )
                return response
        except _Abort as abort:
            winner = IdempotencyRecord.objects.filter(user=request.user, key=key).first()
            return abort.response if winner is None else _replay(winner, request_hash)
        except (IntegrityError, ValidationError, APIException):
            # A request with this key committed while this one ran (a retry of a slow first attempt):
            # this one's conflict or refusal comes from the first one's work; answer as the first did.
            winner = IdempotencyRecord.objects.filter(user=request.user, key=key).first()
            if winner is None:
                raise
            return _replay(winner, request_hash)

    return wrapper
