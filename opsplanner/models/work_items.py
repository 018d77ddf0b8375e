"""Work items: the rows executors and drainers claim and report on (data as interface)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from fleet.models import Host
from opsplanner import clock
from opsplanner.models.operations import Adapter, HostTask


class WorkKind(models.TextChoices):
    DRAIN = "drain", "Drain"
    EXECUTE = "execute", "Execute"
    VERIFY = "verify", "Verify"
    UNDRAIN = "undrain", "Return to service"


class VerifyClass(models.TextChoices):
    NONE = "", "-"
    HEALTH = "health", "Health check"
    BURN_IN = "burn_in", "GPU burn-in"
    COLLECTIVE = "collective", "Collective-communication test"


VERIFY_CLASSES = (VerifyClass.HEALTH, VerifyClass.BURN_IN, VerifyClass.COLLECTIVE)


class WorkState(models.TextChoices):
    WAITING = "waiting", "Waiting"
    READY = "ready", "Ready"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


FINISHED_WORK_STATES = frozenset({WorkState.DONE, WorkState.FAILED})

# The `result` of an item stopped before any executor claimed it: what it was to do never ran on the
# host, and why, as a code (opsplanner/services/rollback.py: installs_stop).
NOT_RUN_KEY = "not_run"


class NotRunCode(models.TextChoices):
    TARGET_WITHDRAWN = "target_withdrawn", "Its target was withdrawn before an executor claimed it"


def install_stopped_for_withdrawn_target() -> Q:
    """An install stopped before any executor claimed it as its target was withdrawn: failed with
    the stop's code and no attempt (an executor's own report saying so does not count). Its task
    ends not applied (tick/advance.py), and its operation closes cancelled (tick/closing.py)."""
    not_run = {f"result__{NOT_RUN_KEY}": NotRunCode.TARGET_WITHDRAWN}
    return Q(kind=WorkKind.EXECUTE, state=WorkState.FAILED, attempts=0, **not_run)


class WorkItem(models.Model):
    kind = models.CharField(max_length=16, choices=WorkKind.choices)
    verify_class = models.CharField(max_length=16, choices=VerifyClass.choices, blank=True, default="")
    # (host_task, host) references the task's (id, host) as one composite key (migration 0007,
    # triggers on SQLite): one check per new item instead of two, and the item's host is its task's.
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="work_items", db_constraint=False)
    # Indexed by work_item_once_per_task, which leads with it.
    host_task = models.ForeignKey(
        HostTask, on_delete=models.CASCADE, related_name="work_items", db_index=False, db_constraint=False
    )
    pool_id = models.BigIntegerField()
    adapter = models.CharField(max_length=16, choices=Adapter.choices)
    state = models.CharField(max_length=16, choices=WorkState.choices, default=WorkState.READY)
    params = models.JSONField(default=dict, blank=True, help_text="what to do: operation kind, target version")
    attempts = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    claimed_by = models.CharField(max_length=150, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True, help_text="heartbeat before this or lose it")
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="fail the item if not finished by then")
    due_at = models.DateTimeField(null=True, blank=True, help_text="simulated adapters finish the item then")
    report_key = models.CharField(max_length=128, blank=True, default="", help_text="idempotency key of the report")
    result = models.JSONField(default=dict, blank=True)
    outcome_reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=clock.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True, help_text="when the tick acted on the outcome")

    class Meta:
        constraints = [
            # One item per task, kind and verification class: a tick that runs twice cannot double it.
            models.UniqueConstraint(fields=["host_task", "kind", "verify_class"], name="work_item_once_per_task"),
            models.CheckConstraint(condition=Q(state__in=WorkState.values), name="work_item_state_valid"),
            models.CheckConstraint(
                condition=~Q(state__in=["done", "failed"]) | Q(finished_at__isnull=False),
                name="work_item_finished_has_time",
            ),
        ]
        indexes = [
            models.Index(
                fields=["adapter", "kind", "pool_id", "id"], name="work_item_ready_idx", condition=Q(state="ready")
            ),
            models.Index(fields=["pool_id", "lease_expires_at"], name="work_item_running_idx",
                         condition=Q(state="running")),
            models.Index(fields=["pool_id", "deadline_at"], name="work_item_open_deadline_idx",
                         condition=Q(state__in=["waiting", "ready", "running"])),
            models.Index(fields=["pool_id", "id"], name="work_item_unconsumed_idx",
                         condition=Q(state__in=["done", "failed"], consumed_at__isnull=True)),
        ]  # fmt: skip

    def __str__(self) -> str:
        suffix = f"/{self.verify_class}" if self.verify_class else ""
        return f"{self.kind}{suffix} #{self.pk} on host {self.host_id} ({self.state})"
