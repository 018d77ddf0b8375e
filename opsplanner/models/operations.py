"""Operations (one unit of disruptive work over a set of hosts) and their per-host tasks."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from fleet.models import ComponentVersion, Host
from opsplanner import clock
from opsplanner.adapters import (
    DRAINER_OVERRIDE_CHOICES,
    EXECUTOR_OVERRIDE_CHOICES,
    POOLS_ADAPTER,
    Adapter,
)

__all__ = ["Adapter"]  # re-exported: opsplanner.models.Adapter is how most callers name it


class OperationKind(models.TextChoices):
    UPGRADE = "upgrade", "Upgrade"
    REBOOT = "reboot", "Reboot"
    VERIFICATION = "verification", "Verification"
    REPAIR = "repair", "Repair"


# What an operator may submit (the API's intent, the console's forms, `submit_operation`): repairs
# are the repair flow's own.
OPERATOR_KINDS: tuple[str, ...] = tuple(k for k in OperationKind.values if k != OperationKind.REPAIR)


class OperationSource(models.TextChoices):
    TRAIN = "train", "Maintenance train"
    AD_HOC = "ad_hoc", "Ad hoc"
    EMERGENCY = "emergency", "Emergency"
    REPAIR = "repair", "Repair flow"


class OperationState(models.TextChoices):
    OPEN = "open", "Open"
    COMPLETED = "completed", "Completed"
    CANCELLED = "cancelled", "Cancelled"


MAX_PRIORITY = 1000
REPAIR_PRIORITY = MAX_PRIORITY


class Operation(models.Model):
    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    component_version = models.ForeignKey(
        ComponentVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="operations",
        help_text="the target version, for upgrades",
    )  # fmt: skip
    scope = models.CharField(max_length=500, help_text="as submitted: a host list or a selector")
    priority = models.PositiveSmallIntegerField(
        default=100, validators=[MinValueValidator(0), MaxValueValidator(MAX_PRIORITY)], help_text="higher goes first"
    )
    source = models.CharField(max_length=16, choices=OperationSource.choices, default=OperationSource.AD_HOC)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requester = models.CharField(max_length=150, help_text="username or the system part that asked")
    reason = models.CharField(max_length=500)
    needs_drain = models.BooleanField(default=True)
    gang = models.BooleanField(default=False, help_text="all hosts are held at once, or none")
    estimated_duration_s = models.PositiveIntegerField(default=1800)
    executor = models.CharField(
        max_length=16, choices=EXECUTOR_OVERRIDE_CHOICES, blank=True, default=POOLS_ADAPTER,
        help_text="who runs the steps and checks; empty: the pool's executor",
    )  # fmt: skip
    drainer = models.CharField(
        max_length=16, choices=DRAINER_OVERRIDE_CHOICES, blank=True, default=POOLS_ADAPTER,
        help_text="who drains and returns the hosts; empty: the pool's drainer",
    )  # fmt: skip
    max_attempts = models.PositiveSmallIntegerField(default=3, validators=[MinValueValidator(1), MaxValueValidator(10)])
    drain_timeout_s = models.PositiveIntegerField(default=3600, validators=[MinValueValidator(1)])
    state = models.CharField(max_length=16, choices=OperationState.choices, default=OperationState.OPEN)
    hold_reason = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="while set, its pending tasks are not admitted (a stopped train, an approval awaited)",
    )
    override_buffers = models.BooleanField(
        default=False,
        help_text="an approved emergency: may use the whole room down to the pool's hard floor",
    )
    or_newer = models.BooleanField(
        default=False,
        help_text="its target or a newer release will do (a train's upgrade, regular or emergency); "
        "otherwise an older target is a deliberate downgrade",
    )
    resubmission_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="resubmissions",
        help_text="the ad-hoc operation whose superseded work this one asks for again, the version that "
        "superseded it withdrawn (opsplanner.services.resubmission)",
    )  # fmt: skip
    created_at = models.DateTimeField(default=clock.now)
    cancelled_at = models.DateTimeField(
        null=True, blank=True, help_text="when it was cancelled; tasks then under way finish, and it closes cancelled"
    )
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "-priority", "created_at"], name="operation_open_order_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(priority__lte=MAX_PRIORITY), name="operation_priority_range"),
            models.CheckConstraint(
                condition=~Q(kind=OperationKind.UPGRADE) | Q(component_version__isnull=False),
                name="operation_upgrade_has_target",
                violation_error_message="An upgrade needs a target version.",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="operation_reason_given"),
            models.CheckConstraint(
                condition=Q(override_buffers=False) | Q(source=OperationSource.EMERGENCY),
                name="operation_override_only_for_emergencies",
                violation_error_message="Only an approved emergency may override the buffers.",
            ),
        ]

    def __str__(self) -> str:
        target = f" to {self.component_version}" if self.component_version_id else ""
        return f"#{self.pk} {self.kind}{target}"


class TaskState(models.TextChoices):
    PENDING = "pending", "Pending"
    ADMITTED = "admitted", "Admitted"
    DRAINING = "draining", "Draining"
    RUNNING = "running", "Running"
    VERIFYING = "verifying", "Verifying"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    HANDED_OVER = "handed_over", "Handed over"


class FailureCode(models.TextChoices):
    """Why a task ended without its work done: what policy reads (failure_reason is for people)."""

    DRAIN_FAILED = "drain_failed", "Drain failed"
    EXECUTE_FAILED = "execute_failed", "Execution failed"
    UNKNOWN_VERSION = "unknown_version", "Executor reported a version not in the catalogue"
    CHECK_FAILED = "check_failed", "Verification failed"
    NOT_RETURNABLE = "not_returnable", "Pre-return gate refused"
    # The gate refused the host only for running a withdrawn version: a version another upgrade of
    # the drain installed before it was withdrawn (its upgrade offboarded), not this task's doing.
    RUNS_WITHDRAWN = "runs_withdrawn", "Pre-return gate refused: runs a withdrawn version"
    RETURN_FAILED = "return_failed", "Return to service failed"
    CANCELLED = "cancelled", "Cancelled"
    # Not applied because a newer version of the same component was pending for, or already applied
    # in the drain of, the same host: the host gets that one directly. A cancelled task's code (the
    # task did nothing), but nobody cancelled its operation, which completes when its tasks finish.
    SUPERSEDED = "superseded", "Superseded by a newer version"
    # A train's task left for the train's next cycle: its host's drain failed and the host went to
    # repair (or to a human). Run now, it would drain the repaired host a second time in the cycle;
    # the next cycle's visit takes the host again, as the host is still below the target.
    DEFERRED = "deferred", "Deferred to the next cycle"


# The codes a cancelled task may have; a failed task has any other (in a stable order for migrations).
CANCELLED_CODES = [FailureCode.CANCELLED, FailureCode.SUPERSEDED, FailureCode.DEFERRED]
FAILED_CODES = [code for code in FailureCode.values if code not in CANCELLED_CODES]

TERMINAL_TASK_STATES = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED, TaskState.HANDED_OVER})
ACTIVE_TASK_STATES = frozenset({TaskState.ADMITTED, TaskState.DRAINING, TaskState.RUNNING, TaskState.VERIFYING})
# Tasks an operation still waits for: it is closed when none is left.
OPEN_TASK_STATES = ACTIVE_TASK_STATES | {TaskState.PENDING}
# The states in which the tasks of a drain are read by its key (host_task_drain_idx), as a sorted list:
# the index's condition, which a query's state filter must imply for PostgreSQL to use it.
DRAIN_READ_STATES = sorted({TaskState.FAILED, TaskState.HANDED_OVER, TaskState.VERIFYING})


class WaitingCode(models.TextChoices):
    """Why a pending task was not admitted, as a code the UI and API can filter on."""

    NONE = "", "Not waiting"
    PLANNED_BUFFER = "planned_buffer", "Planned buffer full"
    FLOOR = "floor", "Capacity floor"
    RESERVATION = "reservation", "Capacity reservation"
    HOST_HELD = "host_held", "Host held by another operation"
    QUEUED = "queued", "Queued behind higher-priority work"
    HOST_STATE = "host_state", "Host not in service"
    OPTOUT = "optout", "Opt-out window"
    GANG = "gang", "Gang cannot be taken whole"
    INCOMPATIBLE = "incompatible", "Target version incompatible"
    HELD = "held", "Operation held"
    NEWER_PENDING = "newer_pending", "A newer version is pending for the host"


class HostTask(models.Model):
    # No single-column indexes: (operation, host) and (host, state) below lead with these columns,
    # and every index is one more write per state change.
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="tasks", db_index=False)
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="tasks", db_index=False)
    pool_id = models.BigIntegerField(help_text="the host's pool, copied so each pool's tick reads only its rows")
    priority = models.PositiveSmallIntegerField(help_text="the operation's, copied for the admission order")
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.PENDING)
    drain_key = models.BigIntegerField(
        null=True, blank=True, help_text="the task that drained the host; shared by tasks handed over in that drain"
    )
    waiting_code = models.CharField(max_length=16, choices=WaitingCode.choices, blank=True, default="")
    waiting_reason = models.CharField(max_length=300, blank=True, default="")
    failure_reason = models.CharField(max_length=500, blank=True, default="")
    failure_code = models.CharField(max_length=16, choices=FailureCode.choices, blank=True, default="")
    created_at = models.DateTimeField(default=clock.now)
    admitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(default=clock.now)
    drain_returned_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="handed over: when its drain brought the host back to service (its work then counts as a success)",
    )
    # Only for a downgrade asked from above (rare): null for every other task, so the foreign key
    # costs an insert nothing and its partial index below holds only those.
    downgrade_from = models.ForeignKey(
        ComponentVersion,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        help_text="an upgrade asked while its host ran a version of the component above the target: that version "
        "(tick/supersede.py: the host coming down part way since does not supersede it); null otherwise",
    )

    class Meta:
        ordering = ["-priority", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["operation", "host"], name="host_task_once_per_operation"),
            # What leases and work items reference: their (task, host) must be a task and its host.
            models.UniqueConstraint(fields=["id", "host"], name="host_task_id_host_key"),
            models.CheckConstraint(condition=Q(state__in=TaskState.values), name="host_task_state_valid"),
            models.CheckConstraint(
                condition=Q(state=TaskState.FAILED, failure_code__in=FAILED_CODES)
                | Q(state=TaskState.CANCELLED, failure_code__in=CANCELLED_CODES)
                | (~Q(state__in=[TaskState.FAILED, TaskState.CANCELLED]) & Q(failure_code="")),
                name="host_task_failure_code_fits_state",
                violation_error_message=(
                    "A failed task has the code of its failure, a cancelled task the code cancelled, "
                    "superseded or deferred, and no other task has a failure code."
                ),
            ),
        ]
        indexes = [
            models.Index(
                fields=["pool_id", "-priority", "created_at", "id"],
                name="host_task_pending_order_idx",
                condition=Q(state="pending"),
            ),
            models.Index(fields=["host", "state"], name="host_task_host_state_idx"),
            models.Index(fields=["pool_id", "state"], name="host_task_pool_state_idx"),
            models.Index(fields=["operation", "state"], name="host_task_operation_state_idx"),
            # The open tasks, without the history: "the hosts a train has out", "any open task" and
            # the like scanned every task ever made (a seq scan growing with the table, every tick).
            models.Index(
                fields=["operation", "host"],
                name="host_task_open_idx",
                condition=Q(state__in=sorted(OPEN_TASK_STATES)),
            ),
            # The tasks of given drains the pre-return gate, the handover and the repair read (every
            # verified host asks): without it, a seq scan of every task ever made.
            models.Index(fields=["drain_key"], name="host_task_drain_idx", condition=Q(state__in=DRAIN_READ_STATES)),
            # What deleting a version asks (PROTECT): without it, a seq scan of every task ever made.
            models.Index(
                fields=["downgrade_from"],
                name="host_task_downgrade_from_idx",
                condition=Q(downgrade_from__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"task #{self.pk} of operation #{self.operation_id} on host {self.host_id}"
