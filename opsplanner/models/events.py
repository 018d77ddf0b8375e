"""Events: the immutable record of every state change (who, what, when, why).

The audit log, the Gantt and the live updates all read this table. Subjects are referenced by id,
not by foreign key, so history outlives the rows it describes and never blocks a delete.
"""

from __future__ import annotations

from django.db import models

from opsplanner import clock

# The kinds written for every host task, host and work item transition: by far most of the table.
# They are found by subject, host, pool or time; only the rarer kinds get a (kind, time) index, so
# the tick's thousands of events a second skip it.
HIGH_VOLUME_KINDS = (
    "task.state_changed",
    "host.state_changed",
    "lease.granted",
    "lease.released",
    "work_item.done",
    "work_item.failed",
    "work_item.retaken",
    "host.version_installed",
)


class Event(models.Model):
    # Time ranges alone are served by a BRIN index on PostgreSQL (migration 0006): events arrive in
    # time order, and a B-tree here was one more write per event for a filter lists rarely use alone.
    created_at = models.DateTimeField(default=clock.now)
    kind = models.CharField(max_length=64, help_text="dotted name, e.g. host.state_changed")
    actor_id = models.BigIntegerField(null=True, blank=True, help_text="user id, empty for the system")
    actor = models.CharField(max_length=150, help_text="username, or the system part that acted")
    subject_type = models.CharField(max_length=64)
    subject_id = models.BigIntegerField(null=True, blank=True)
    pool_id = models.BigIntegerField(null=True, blank=True)
    host_id = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["subject_type", "subject_id"], name="event_subject_idx"),
            models.Index(fields=["pool_id", "created_at"], name="event_pool_time_idx"),
            models.Index(fields=["host_id", "created_at"], name="event_host_time_idx"),
            models.Index(
                fields=["kind", "created_at"],
                name="event_rare_kind_time_idx",
                condition=~models.Q(kind__in=HIGH_VOLUME_KINDS),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=~models.Q(kind=""), name="event_kind_not_empty"),
            models.CheckConstraint(condition=~models.Q(actor=""), name="event_actor_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.kind} {self.subject_type}#{self.subject_id}"
