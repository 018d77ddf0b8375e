"""Approvals: a request, then a decision by a different operator before it expires.

What an approval unlocks lives with its subject: the app that owns the subject registers a handler
per kind (trains registers emergency trains and re-onboarding). The handler runs inside the
decision's transaction, so an approval and its effect commit together or not at all.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from opsplanner import clock
from opsplanner.events import Actor, actor_fields, actor_user, event_record
from opsplanner.models import Approval, ApprovalKind, ApprovalState
from opsplanner.roles import Role

DEFAULT_EXPIRY = dt.timedelta(hours=24)
SUBJECT = "opsplanner.approval"

# kind -> handler(approval=..., outcome=ApprovalState, actor=...), registered by the subject's app.
ApprovalHandler = Callable[..., None]
_HANDLERS: dict[str, ApprovalHandler] = {}


def approval_handler_register(*, kind: str, handler: ApprovalHandler) -> None:
    _HANDLERS[kind] = handler


def user_is_operator(user: Any) -> bool:
    return bool(
        isinstance(user, AbstractBaseUser)
        and user.is_active
        and (getattr(user, "is_superuser", False) or user.groups.filter(name=Role.OPERATOR).exists())  # type: ignore[attr-defined]
    )


def approval_request(
    *,
    kind: str,
    subject_type: str,
    subject_id: int,
    reason: str,
    actor: Actor,
    summary: dict[str, Any] | None = None,
    expires_in: dt.timedelta = DEFAULT_EXPIRY,
) -> Approval:
    """Record a request; called inside the transaction that creates what it is about."""
    if kind not in ApprovalKind.values:
        raise ValidationError({"kind": f"{kind!r} is not a kind of approval."})
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say why this is needed."})
    if expires_in <= dt.timedelta(0):
        raise ValidationError({"expires_in": "An approval must expire in the future."})
    _, label = actor_fields(actor)
    now = clock.now()
    approval = Approval(
        kind=kind,
        subject_type=subject_type,
        subject_id=subject_id,
        summary=summary or {},
        requested_by=actor_user(actor),
        requester=label,
        reason=reason.strip()[:500],
        created_at=now,
        expires_at=now + expires_in,
    )
    approval.full_clean()
    approval.save()
    event_record(kind="approval.requested", subject=approval, actor=actor, reason=approval.reason, data=summary)
    return approval


@transaction.atomic
def approval_decide(*, approval_id: int, approve: bool, reason: str, actor: Actor) -> Approval:
    """Approve or reject a pending request. Refused: self-decision, non-operators, expired requests,
    a decision already taken; each refusal says why and changes nothing."""
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Give a reason for the decision."})
    approval = Approval.objects.select_for_update().filter(pk=approval_id).first()
    if approval is None:
        raise ValidationError({"approval": f"There is no approval #{approval_id}."}, code="not_found")
    if not user_is_operator(actor):
        raise ValidationError("Only an operator can decide an approval.", code="permission")
    user = actor_user(actor)
    if approval.requested_by_id is not None and user is not None and approval.requested_by_id == user.pk:
        raise ValidationError(
            "You requested this; a different operator must decide it (two-person rule).", code="self_approval"
        )
    if approval.state != ApprovalState.PENDING:
        raise ValidationError(f"Approval #{approval.pk} is already {approval.state}.", code="conflict")
    now = clock.now()
    if approval.expires_at <= now:
        _expire(approval, now)
        raise ValidationError(
            f"Approval #{approval.pk} expired at {approval.expires_at:%Y-%m-%d %H:%M} UTC; request it again.",
            code="expired",
        )
    outcome = ApprovalState.APPROVED if approve else ApprovalState.REJECTED
    _, label = actor_fields(actor)
    changed = Approval.objects.filter(pk=approval.pk, state=ApprovalState.PENDING).update(
        state=outcome, decided_by=user, decider=label, decision_reason=reason.strip()[:500], decided_at=now
    )
    if changed != 1:
        raise ValidationError(f"Approval #{approval.pk} was decided meanwhile.", code="conflict")
    approval.refresh_from_db()
    event_record(kind=f"approval.{outcome}", subject=approval, actor=actor, reason=approval.decision_reason)
    _apply(approval, outcome, actor)
    return approval


def approvals_expire() -> int:
    """Expire pending requests past their time (what they would have unlocked stays locked)."""
    now = clock.now()
    expired = 0
    for approval_id in Approval.objects.filter(state=ApprovalState.PENDING, expires_at__lte=now).values_list(
        "id", flat=True
    ):
        with transaction.atomic():
            approval = Approval.objects.select_for_update(skip_locked=True).filter(pk=approval_id).first()
            if approval is not None and approval.state == ApprovalState.PENDING:
                _expire(approval, now)
                expired += 1
    return expired


def _expire(approval: Approval, now: dt.datetime) -> None:
    if Approval.objects.filter(pk=approval.pk, state=ApprovalState.PENDING).update(
        state=ApprovalState.EXPIRED, decided_at=now
    ):
        approval.state = ApprovalState.EXPIRED
        event_record(
            kind="approval.expired",
            subject=approval,
            actor="scheduler",
            reason=f"nobody decided before {approval.expires_at:%Y-%m-%d %H:%M} UTC",
        )
        _apply(approval, ApprovalState.EXPIRED, "scheduler")


def _apply(approval: Approval, outcome: str, actor: Actor) -> None:
    handler = _HANDLERS.get(approval.kind)
    if handler is not None:
        handler(approval=approval, outcome=outcome, actor=actor)
