"""Upgrades: a component going to a target version over a scope, in rollout phases, with a failure
policy. Trains apply them; the planner offboards one that fails too often."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from fleet.models import ComponentVersion, MaintenanceDomain, Pool
from opsplanner import clock
from opsplanner.models import Operation
from trains.limits import MAX_UPGRADE_PRIORITY

DEFAULT_UPGRADE_PRIORITY = 100


class UpgradeState(models.TextChoices):
    ACTIVE = "active", "Active"
    OFFBOARDED = "offboarded", "Offboarded"
    COMPLETED = "completed", "Completed"
    CANCELLED = "cancelled", "Cancelled"


class Upgrade(models.Model):
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="upgrades")
    component_version = models.ForeignKey(ComponentVersion, on_delete=models.PROTECT, related_name="upgrades")
    scope = models.CharField(max_length=500, help_text="a selector inside the pool; the whole pool by default")
    reason = models.CharField(max_length=500)
    state = models.CharField(max_length=16, choices=UpgradeState.choices, default=UpgradeState.ACTIVE)
    state_reason = models.CharField(max_length=500, blank=True)
    emergency = models.BooleanField(default=False)
    current_phase = models.PositiveSmallIntegerField(default=0, help_text="position of the phase in force")
    max_failures = models.PositiveIntegerField(
        default=2, help_text="offboard when more hosts than this fail within one phase"
    )
    max_failure_rate = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(1)],
        help_text="offboard when more than this share of a phase's finished hosts failed",
    )
    failure_rate_min_hosts = models.PositiveIntegerField(default=5, help_text="hosts finished before the rate counts")
    multi_cycle = models.BooleanField(default=False, help_text="applied to a bounded number of hosts per visit")
    priority = models.PositiveSmallIntegerField(
        default=DEFAULT_UPGRADE_PRIORITY,
        validators=[MaxValueValidator(MAX_UPGRADE_PRIORITY)],
        help_text="higher goes first when a visit cannot take every pending upgrade",
    )
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="every host by then; ahead of upgrades of the same priority without one"
    )
    # The deadline alerts in force: when the last was raised and the fixes they advised (their
    # causes), in order; cleared when the forecast meets the deadline again or a replan changes the
    # plan (trains/services/upgrade_forecast.py alerts again for a cause not alerted yet).
    deadline_alerted_at = models.DateTimeField(
        null=True, blank=True, help_text="when the forecast last said, for a new cause, the deadline cannot be met"
    )
    deadline_alert_fixes = models.JSONField(
        default=list, blank=True, help_text="the fixes the alerts in force advised, in order; empty: none in force"
    )
    # Its promise: the first forecast its train gave it (trains/services/upgrade_forecast.py), kept
    # to be held against when every host ran it. Made at most once; no time: beyond the horizon.
    promise_made_at = models.DateTimeField(null=True, blank=True, help_text="when its first forecast was made")
    promised_cycle = models.PositiveIntegerField(
        null=True, blank=True, help_text="the cycle its first forecast said every host has it by"
    )
    promised_at = models.DateTimeField(null=True, blank=True, help_text="around when, by its first forecast")
    duration_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="expected time to apply it on one host; empty: the default estimate, corrected by measured visits",
    )
    hosts_per_visit = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requester = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=clock.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(multi_cycle=False) | Q(hosts_per_visit__isnull=False),
                name="upgrade_multi_cycle_has_bound",
                violation_error_message="A multi-cycle upgrade needs a number of hosts per visit.",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="upgrade_reason_given"),
            models.CheckConstraint(
                condition=Q(promised_at__isnull=True, promised_cycle__isnull=True)
                | Q(promised_at__isnull=False, promised_cycle__isnull=False, promise_made_at__isnull=False),
                name="upgrade_promise_whole",
                violation_error_message="A promise has its cycle, its time and when it was made.",
            ),
        ]

    def __str__(self) -> str:
        return f"upgrade #{self.pk}: {self.component_version} on {self.scope}"


class PhaseSelection(models.TextChoices):
    FIXED = "fixed", "Only its own scope"
    ANY = "any", "Any hosts of the pool that still need it"


class PhaseHoldCode(models.TextChoices):
    TOO_FEW_HOSTS = "too_few_hosts", "Too few hosts to show the evidence"


class UpgradePhase(models.Model):
    """A rollout phase: the hosts of one domain (a canary), or the first N% of the scope. Phases
    widen: each covers what the earlier ones did. A phase before the last graduates only when
    min_successes hosts succeeded in it and soak_s has passed since: no evidence, no wider rollout.
    When its scope has too few hosts that still need the upgrade, an `any` phase picks hosts of the
    pool (picked_hosts); a `fixed` one holds (held_code, held_reason) until an approved skip."""

    upgrade = models.ForeignKey(Upgrade, on_delete=models.CASCADE, related_name="phases")
    position = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=63)
    domain = models.ForeignKey(MaintenanceDomain, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    percent = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    min_successes = models.PositiveIntegerField(default=1)
    soak_s = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    successes_reached_at = models.DateTimeField(null=True, blank=True)
    graduated_at = models.DateTimeField(null=True, blank=True)
    selection = models.CharField(
        max_length=8,
        choices=PhaseSelection.choices,
        default=PhaseSelection.FIXED,
        help_text="where the phase finds its hosts when its own scope has too few that still need the upgrade",
    )
    picked_hosts = models.JSONField(
        default=list, blank=True, help_text="ids of the hosts of the pool an 'any' phase took beyond its own scope"
    )
    # A what-if lane's copy of a live phase in force (simulation/from_live_trains.py) carries the hosts
    # the live phase had counted for and against its failure policy (CarriedHost rows), from tasks
    # the lane does not copy; the tick counts them with its own (phase_failures, phase_rate_successes).
    # False on the live fleet: the tick reads this column and counts the phase's own tasks alone.
    carries_live_hosts = models.BooleanField(
        default=False, help_text="whether the phase counts hosts its live copy had counted (a what-if lane's)"
    )
    held_code = models.CharField(max_length=32, choices=PhaseHoldCode.choices, blank=True)
    held_reason = models.CharField(max_length=500, blank=True)
    held_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["upgrade_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["upgrade", "position"], name="upgrade_phase_position_unique"),
            models.CheckConstraint(
                condition=Q(domain__isnull=True, percent__isnull=False) | Q(domain__isnull=False, percent__isnull=True),
                name="upgrade_phase_domain_xor_percent",
                violation_error_message="A phase is one domain or a percentage of the scope.",
            ),
            models.CheckConstraint(
                condition=Q(percent__isnull=True) | Q(percent__gte=1, percent__lte=100), name="upgrade_phase_percent"
            ),
            models.CheckConstraint(
                condition=Q(selection__in=PhaseSelection.values),
                name="upgrade_phase_selection_known",
                violation_error_message="A phase selects its hosts 'fixed' (its own scope) or 'any' (from the pool).",
            ),
            models.CheckConstraint(
                condition=Q(held_code="", held_at__isnull=True) | (~Q(held_code="") & Q(held_at__isnull=False)),
                name="upgrade_phase_hold_has_time",
                violation_error_message="A held phase records when its hold started (and only a held one).",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} (phase {self.position} of upgrade {self.upgrade_id})"


class CarriedHost(models.Model):
    """A host a what-if lane's phase carries from the live phase in force it copies (carries_live_hosts):
    one the live tick counted as failed against the phase's policy, or as a success its failure rate
    counts. The tick counts it with the hosts of the phase's own tasks, each host once, as the live
    tick counts them: one that fails again in the lane is one failure, one that failed live stays
    failed. `host_id` is the lane's host of the same name; None for a host no longer in the pool
    (counted, never taken again). Not a foreign key: nothing on the live fleet refers to it."""

    phase = models.ForeignKey(UpgradePhase, on_delete=models.CASCADE, related_name="carried_hosts")
    host_id = models.BigIntegerField(null=True, blank=True)
    failed = models.BooleanField(help_text="counted against the policy live (else a success its failure rate counted)")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["phase", "host_id"], name="carried_host_once_per_phase"),
        ]

    def __str__(self) -> str:
        return f"host {self.host_id} {'failed' if self.failed else 'succeeded'} in phase {self.phase_id} (carried)"


class VisitOperation(models.Model):
    """Which operation a visit created for which upgrade (the upgrade's successes and failures)."""

    visit = models.ForeignKey("trains.Visit", on_delete=models.CASCADE, related_name="operations")
    upgrade = models.ForeignKey(Upgrade, on_delete=models.CASCADE, related_name="visit_operations")
    operation = models.OneToOneField(Operation, on_delete=models.PROTECT, related_name="visit_link")
    phase = models.PositiveSmallIntegerField()
    # Re-submitted for a host repaired in the visit's drain (trains/services/catch_up.py): it counts
    # for the upgrade's phase, but the visit does not wait for it.
    catch_up = models.BooleanField(default=False)

    # A domain-paced visit has one operation per upgrade; a sliding one one per upgrade and batch of
    # hosts it releases (each host of the visit is released once), and one per upgrade it catches up.
    class Meta:
        indexes = [models.Index(fields=["visit", "upgrade"], name="visit_operation_visit_upgrade")]

    def __str__(self) -> str:
        return f"visit {self.visit_id} -> operation {self.operation_id}"
