"""Periodic clean-up: forget Idempotency-Key answers after their keeping time, delete expired tokens."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from knox.models import AuthToken

from opsplanner import clock
from opsplanner.models import IdempotencyRecord


def idempotency_records_purge(*, older_than: dt.timedelta | None = None) -> int:
    keep = older_than or dt.timedelta(hours=settings.IDEMPOTENCY_KEEP_HOURS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=clock.now() - keep).delete()
    return deleted


def expired_tokens_delete() -> int:
    """Expired API tokens are refused anyway; this keeps the table small."""
    deleted, _ = AuthToken.objects.filter(expiry__lt=clock.now()).delete()
    return deleted
