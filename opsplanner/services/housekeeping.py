"""Periodic clean-up: forget Idempotency-Key answers after their keeping time, delete expired tokens,
and cancel the resubmissions a tick's cancel left to after its commit should that follow-up be lost."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef
from knox.models import AuthToken

from opsplanner import clock
from opsplanner.models import Event, IdempotencyRecord, Operation, OperationState
from opsplanner.services.operation_cancel import CANCEL_DEFERRED, resubmissions_left_cancel
from opsplanner.services.tick.context import SUBJECT_OPERATION


def idempotency_records_purge(*, older_than: dt.timedelta | None = None) -> int:
    keep = older_than or dt.timedelta(hours=settings.IDEMPOTENCY_KEEP_HOURS)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=clock.now() - keep).delete()
    return deleted


def expired_tokens_delete() -> int:
    """Expired API tokens are refused anyway; this keeps the table small."""
    deleted, _ = AuthToken.objects.filter(expiry__lt=clock.now()).delete()
    return deleted


def resubmissions_left_sweep() -> int:
    """Cancel the open resubmissions a tick's cancel left (`resubmissions_left_cancel`): it leaves
    those with tasks in another pool to a follow-up after its commit, which a crash or a broker outage
    between the commit and the enqueue would lose. Only those its `operation.cancel_deferred` names:
    an original closed cancelled otherwise (an install of it stopped: tick/closing.py) left nothing
    to anyone, and the follow-up's reason would be false. One that changed while it took the pools'
    locks is left to the next sweep. How many tasks were cancelled."""
    deferred = Event.objects.filter(kind=CANCEL_DEFERRED, subject_type=SUBJECT_OPERATION, subject_id=OuterRef("pk"))
    originals = (
        Operation.objects.filter(
            Exists(deferred),
            state=OperationState.OPEN,
            cancelled_at__isnull=True,
            resubmission_of__cancelled_at__isnull=False,
        )
        .order_by("resubmission_of_id")
        .values_list("resubmission_of_id", flat=True)
        .distinct()
    )
    cancelled = 0
    for operation_id in list(originals):
        try:
            cancelled += resubmissions_left_cancel(operation_id=operation_id)
        except ValidationError:  # its family changed meanwhile: the next sweep reads it again
            continue
    return cancelled
