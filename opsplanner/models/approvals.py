"""Approvals: every decision that needs a human (emergency trains, re-onboarding, large operations)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from opsplanner import clock


class ApprovalKind(models.TextChoices):
    EMERGENCY_TRAIN = "emergency_train", "Emergency train"
    REONBOARD_UPGRADE = "reonboard_upgrade", "Re-onboard an offboarded upgrade"
    LARGE_OPERATION = "large_operation", "Large ad-hoc operation"
    SKIP_PHASE = "skip_phase", "Skip a held rollout phase"


class ApprovalState(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"


class Approval(models.Model):
    kind = models.CharField(max_length=32, choices=ApprovalKind.choices)
    subject_type = models.CharField(max_length=64, help_text="what is decided on, e.g. trains.train")
    subject_id = models.BigIntegerField()
    summary = models.JSONField(default=dict, blank=True, help_text="what approving would do: scope, hosts, buffers")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requester = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    state = models.CharField(max_length=16, choices=ApprovalState.choices, default=ApprovalState.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decider = models.CharField(max_length=150, blank=True)
    decision_reason = models.CharField(max_length=500, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # The two-person rule in the database: nobody decides their own request.
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | Q(requested_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="approval_not_self_decided",
                violation_error_message="The requester cannot decide their own request.",
            ),
            models.CheckConstraint(condition=Q(expires_at__gt=F("created_at")), name="approval_expires_after_creation"),
            models.CheckConstraint(condition=~Q(reason=""), name="approval_reason_given"),
            models.CheckConstraint(
                condition=Q(state=ApprovalState.PENDING) | Q(decided_at__isnull=False),
                name="approval_decision_has_time",
            ),
            models.UniqueConstraint(
                fields=["kind", "subject_type", "subject_id"],
                condition=Q(state="pending"),
                name="approval_one_pending_per_subject",
                violation_error_message="A request for this is already pending.",
            ),
        ]
        indexes = [models.Index(fields=["state", "expires_at"], name="approval_state_expiry_idx")]

    def __str__(self) -> str:
        return f"approval #{self.pk} ({self.kind}, {self.state})"
