"""Leases: the exclusive hold of one host task on one host. The partial unique index is the rule."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.models import Host
from opsplanner import clock
from opsplanner.models.operations import HostTask, Operation


class Lease(models.Model):
    # (host_task, host) references the task's (id, host) as one composite key (migration 0007,
    # triggers on SQLite): one check per new lease instead of two, and the database itself makes
    # the lease's host its task's host. A migration that rebuilds this table on SQLite must suspend
    # and restore it (opsplanner.dbconstraints).
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="leases", db_constraint=False)
    host_task = models.ForeignKey(HostTask, on_delete=models.PROTECT, related_name="leases", db_constraint=False)
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="leases")
    pool_id = models.BigIntegerField()
    active = models.BooleanField(default=True)
    acquired_at = models.DateTimeField(default=clock.now)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            # Invariant 1, in the database: at most one active lease per host, whoever writes.
            models.UniqueConstraint(fields=["host"], condition=Q(active=True), name="lease_one_active_per_host"),
            models.UniqueConstraint(fields=["host_task"], condition=Q(active=True), name="lease_one_active_per_task"),
            models.CheckConstraint(
                condition=Q(active=True, released_at__isnull=True) | Q(active=False, released_at__isnull=False),
                name="lease_released_iff_inactive",
            ),
        ]
        indexes = [models.Index(fields=["pool_id"], condition=Q(active=True), name="lease_active_pool_idx")]

    def __str__(self) -> str:
        return f"lease of host {self.host_id} by task {self.host_task_id}{'' if self.active else ' (released)'}"
