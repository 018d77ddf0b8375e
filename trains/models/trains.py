"""Trains: the cycle that visits every maintenance domain of a pool, one visit at a time."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from fleet.models import MaintenanceDomain, Pool
from fleet.models.pools import NAME_VALIDATOR
from opsplanner import clock
from opsplanner.adapters import DRAINER_OVERRIDE_CHOICES, EXECUTOR_OVERRIDE_CHOICES, POOLS_ADAPTER
from trains.limits import MAX_TRAIN_PRIORITY

DEFAULT_TRAIN_PRIORITY = 200


class TrainState(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    AUTOSTOPPED = "autostopped", "Autostopped"
    FINISHED = "finished", "Finished"
    CANCELLED = "cancelled", "Cancelled"


class BudgetCode(models.TextChoices):
    """Why a train's visits cannot keep its cycle SLO (empty: they can)."""

    NONE = "", "Fits"
    UPGRADE_TOO_LONG = "upgrade_too_long", "An upgrade alone needs more than a visit's budget"


class Pace(models.TextChoices):
    """How a train moves on from domain to domain (docs: DESIGN.md, "pace")."""

    DOMAIN = "domain", "Domain-synchronous: the next domain starts when the visit's last host is back"
    SLIDING = "sliding", "Sliding: each host back lets a host of the next domain start"


STOPPED_TRAIN_STATES = frozenset({TrainState.PAUSED, TrainState.AUTOSTOPPED})
LIVE_TRAIN_STATES = frozenset({TrainState.RUNNING, TrainState.PAUSED, TrainState.AUTOSTOPPED})


class Train(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="trains")
    emergency = models.BooleanField(default=False, help_text="one urgent upgrade, approved by a second operator")
    upgrade = models.ForeignKey(
        "trains.Upgrade",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="emergency_trains",
        help_text="an emergency train's one upgrade",
    )
    state = models.CharField(max_length=20, choices=TrainState.choices, default=TrainState.RUNNING)
    state_reason = models.CharField(max_length=500, blank=True)
    state_changed_at = models.DateTimeField(default=clock.now)
    visit_concurrency = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="domains visited at once; 1 keeps all capacity but one domain up",
    )
    pace = models.CharField(
        max_length=8, choices=Pace.choices, default=Pace.DOMAIN,
        help_text="domain: whole domains at a time; sliding: hosts of the next domain start as hosts come back, "
        "never more than a visit's worth out",
    )  # fmt: skip
    cycle_slo_s = models.PositiveIntegerField(help_text="every domain is visited within this time")
    visit_estimate_s = models.PositiveIntegerField(
        default=3600, validators=[MinValueValidator(1)], help_text="expected length of one visit, for the forecast"
    )
    visit_overhead_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="drain, checks and return of one visit, besides the upgrades' own work (sizes the visits); "
        "empty: half the visit estimate",
    )
    budget_code = models.CharField(max_length=20, choices=BudgetCode.choices, blank=True, default=BudgetCode.NONE)
    budget_reason = models.CharField(max_length=500, blank=True, default="")
    priority = models.PositiveSmallIntegerField(
        default=DEFAULT_TRAIN_PRIORITY, validators=[MaxValueValidator(MAX_TRAIN_PRIORITY)]
    )
    executor = models.CharField(
        max_length=16, choices=EXECUTOR_OVERRIDE_CHOICES, blank=True, default=POOLS_ADAPTER,
        help_text="who runs the steps and checks; empty: the pool's executor",
    )  # fmt: skip
    drainer = models.CharField(
        max_length=16, choices=DRAINER_OVERRIDE_CHOICES, blank=True, default=POOLS_ADAPTER,
        help_text="who drains and returns the hosts; empty: the pool's drainer",
    )  # fmt: skip
    auto_resume_after_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="after an autostop, resume once the buffers have recovered for this long"
    )
    recovered_since = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["pool"],
                condition=Q(emergency=False),
                name="train_one_regular_per_pool",
                violation_error_message="This pool already has a train.",
            ),
            models.CheckConstraint(
                condition=Q(emergency=False) | Q(upgrade__isnull=False), name="train_emergency_has_upgrade"
            ),
            models.CheckConstraint(condition=Q(visit_concurrency__gte=1), name="train_visit_concurrency_positive"),
            models.CheckConstraint(
                condition=Q(pace__in=Pace.values),
                name="train_pace_known",
                violation_error_message="A train's pace is 'domain' or 'sliding'.",
            ),
            models.CheckConstraint(condition=Q(cycle_slo_s__gte=F("visit_estimate_s")), name="train_slo_fits_a_visit"),
            models.CheckConstraint(
                condition=Q(budget_code="", budget_reason="") | (~Q(budget_code="") & ~Q(budget_reason="")),
                name="train_budget_code_has_reason",
                violation_error_message="A budget overrun has a code and a reason (and only an overrun has them).",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class TrainStop(models.Model):
    """The train's domain order."""

    train = models.ForeignKey(Train, on_delete=models.CASCADE, related_name="stops")
    domain = models.ForeignKey(MaintenanceDomain, on_delete=models.PROTECT, related_name="+")
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["train_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["train", "position"], name="train_stop_position_unique"),
            models.UniqueConstraint(fields=["train", "domain"], name="train_stop_domain_once"),
        ]

    def __str__(self) -> str:
        return f"{self.train_id}@{self.position}: {self.domain_id}"


class Cycle(models.Model):
    """One pass over every domain of the train."""

    train = models.ForeignKey(Train, on_delete=models.CASCADE, related_name="cycles")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=clock.now)
    deadline_at = models.DateTimeField(help_text="started_at + the SLO")
    ended_at = models.DateTimeField(null=True, blank=True)
    forecast_end_at = models.DateTimeField(null=True, blank=True)
    miss_alerted_at = models.DateTimeField(null=True, blank=True)
    miss_cause = models.CharField(max_length=500, blank=True)
    # The seconds the per-upgrade forecast plays the cycle's visits to come at ({domain id: s}), as
    # of `played_key` (what they were played from: trains/services/cycle_played.py); the train's
    # forecast lasts its visits these, the train tick plays them again only when the key changes.
    played_s = models.JSONField(default=dict, blank=True, help_text="{domain id: seconds} of the visits to come")
    played_key = models.CharField(max_length=32, blank=True, help_text="what played_s was played from")

    class Meta:
        ordering = ["train_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["train", "number"], name="cycle_number_unique"),
            models.UniqueConstraint(
                fields=["train"], condition=Q(ended_at__isnull=True), name="cycle_one_open_per_train"
            ),
        ]

    def __str__(self) -> str:
        return f"cycle {self.number} of train {self.train_id}"


class VisitState(models.TextChoices):
    PLANNED = "planned", "Planned"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    CANCELLED = "cancelled", "Cancelled"


class Visit(models.Model):
    """One stop at one domain: drain, apply everything pending, verify, return. The plan (hosts and
    upgrades) is recorded when it starts; the timeline is in the events."""

    train = models.ForeignKey(Train, on_delete=models.CASCADE, related_name="visits")
    cycle = models.ForeignKey(Cycle, on_delete=models.CASCADE, related_name="visits")
    domain = models.ForeignKey(MaintenanceDomain, on_delete=models.PROTECT, related_name="visits")
    position = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=VisitState.choices, default=VisitState.PLANNED)
    plan = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    skips = models.PositiveIntegerField(default=0)
    skip_reason = models.CharField(max_length=300, blank=True)
    outcome = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["cycle_id", "position"]
        constraints = [
            # Exactly once per cycle.
            models.UniqueConstraint(fields=["cycle", "domain"], name="visit_once_per_cycle"),
            models.CheckConstraint(
                condition=Q(state=VisitState.PLANNED) | Q(started_at__isnull=False), name="visit_started_has_time"
            ),
        ]
        indexes = [models.Index(fields=["train", "state"], name="visit_train_state_idx")]

    def __str__(self) -> str:
        return f"visit {self.pk} of {self.domain_id} in cycle {self.cycle_id}"
