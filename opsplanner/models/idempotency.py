"""The first answer to a POST that carried an Idempotency-Key, so that a retry gets it back."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from opsplanner import clock


class IdempotencyRecord(models.Model):
    """Written in the same transaction as what the request created: either both exist or neither."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=128)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=300)
    request_hash = models.CharField(max_length=64, help_text="sha256 of the request body")
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_once_per_user")]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created_idx")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}]"
