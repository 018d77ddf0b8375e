"""Pools (capacity for one workload class, with its buffers) and their maintenance domains."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from opsplanner import clock
from opsplanner.adapters import DRAINER_CHOICES, EXECUTOR_CHOICES, Adapter

NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use lowercase letters, digits and dashes (up to 63 characters), starting with a letter or digit.",
)


class WorkloadClass(models.TextChoices):
    AI_TRAINING = "ai_training", "AI training"
    AI_INFERENCE = "ai_inference", "AI inference"
    WEB = "web", "Web"
    STORAGE = "storage", "Storage"
    OTHER = "other", "Other"


@dataclass(frozen=True)
class BufferSize:
    """A pool's buffers in hosts for a given total, and the in-service floor they imply."""

    total: int
    planned: int
    failure: int

    @property
    def floor(self) -> int:
        return max(self.total - self.planned - self.failure, 0)


def _one_of(count_field: str, fraction_field: str) -> Q:
    return Q(**{f"{count_field}__isnull": False, f"{fraction_field}__isnull": True}) | Q(
        **{f"{count_field}__isnull": True, f"{fraction_field}__isnull": False}
    )


_FRACTION_VALIDATORS = [MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("0.9999"))]


class Pool(models.Model):
    """Capacity serving one workload class. Each buffer is a host count or a fraction of the pool."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    workload_class = models.CharField(max_length=32, choices=WorkloadClass.choices)
    description = models.TextField(blank=True)
    planned_buffer_hosts = models.PositiveIntegerField(
        null=True, blank=True, help_text="hosts that may be out for planned work (or use the fraction)"
    )
    planned_buffer_fraction = models.DecimalField(
        max_digits=5, decimal_places=4, null=True, blank=True, validators=_FRACTION_VALIDATORS
    )
    failure_buffer_hosts = models.PositiveIntegerField(
        null=True, blank=True, help_text="hosts that may be out broken (or use the fraction)"
    )
    failure_buffer_fraction = models.DecimalField(
        max_digits=5, decimal_places=4, null=True, blank=True, validators=_FRACTION_VALIDATORS
    )
    hard_floor_hosts = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="hosts that stay in service even for an approved emergency (default: the normal floor)",
    )
    executor = models.CharField(
        max_length=16, choices=EXECUTOR_CHOICES, default=Adapter.SIMULATED, db_default=Adapter.SIMULATED.value,
        help_text="who runs the steps and checks on this pool's hosts, unless an operation or train says otherwise",
    )  # fmt: skip
    drainer = models.CharField(
        max_length=16, choices=DRAINER_CHOICES, default=Adapter.SIMULATED, db_default=Adapter.SIMULATED.value,
        help_text="who drains and returns this pool's hosts, unless an operation or train says otherwise",
    )  # fmt: skip
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=_one_of("planned_buffer_hosts", "planned_buffer_fraction"),
                name="pool_planned_buffer_count_xor_fraction",
                violation_error_message="Give the planned buffer as a host count or a fraction, not both.",
            ),
            models.CheckConstraint(
                condition=_one_of("failure_buffer_hosts", "failure_buffer_fraction"),
                name="pool_failure_buffer_count_xor_fraction",
                violation_error_message="Give the failure buffer as a host count or a fraction, not both.",
            ),
            models.CheckConstraint(
                condition=Q(planned_buffer_fraction__isnull=True)
                | Q(planned_buffer_fraction__gte=0, planned_buffer_fraction__lt=1),
                name="pool_planned_fraction_range",
                violation_error_message="The planned buffer fraction must be at least 0 and below 1.",
            ),
            models.CheckConstraint(
                condition=Q(failure_buffer_fraction__isnull=True)
                | Q(failure_buffer_fraction__gte=0, failure_buffer_fraction__lt=1),
                name="pool_failure_fraction_range",
                violation_error_message="The failure buffer fraction must be at least 0 and below 1.",
            ),
            models.CheckConstraint(
                condition=Q(planned_buffer_fraction__isnull=True)
                | Q(failure_buffer_fraction__isnull=True)
                | Q(planned_buffer_fraction__lt=1 - models.F("failure_buffer_fraction")),
                name="pool_buffers_leave_capacity",
                violation_error_message="The planned and failure buffers together must be below the whole pool.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, str] = {}
        for kind in ("planned", "failure"):
            count = getattr(self, f"{kind}_buffer_hosts")
            fraction = getattr(self, f"{kind}_buffer_fraction")
            if (count is None) == (fraction is None):
                errors[f"{kind}_buffer_hosts"] = (
                    f"Give the {kind} buffer as a host count or as a fraction of the pool (exactly one)."
                )
        if errors:
            raise ValidationError(errors)

    def buffers_for(self, total_hosts: int) -> BufferSize:
        """Buffers in hosts for a pool of total_hosts. Fractions round down: never more out than asked."""

        def size(count: int | None, fraction: Decimal | None) -> int:
            if count is not None:
                return min(count, total_hosts)
            return math.floor(Decimal(total_hosts) * (fraction or Decimal(0)))

        return BufferSize(
            total=total_hosts,
            planned=size(self.planned_buffer_hosts, self.planned_buffer_fraction),
            failure=size(self.failure_buffer_hosts, self.failure_buffer_fraction),
        )


class DomainKind(models.TextChoices):
    RACK = "rack", "Rack"
    ROW = "row", "Row"
    FRACTION = "fraction", "Fixed fraction"


class MaintenanceDomain(models.Model):
    """The slice of a pool drained in one go (a rack, a row, a fixed fraction)."""

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="domains")
    name = models.CharField(max_length=63, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=16, choices=DomainKind.choices, default=DomainKind.RACK)
    position = models.PositiveIntegerField(default=0, help_text="default order of visits in the pool")
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["pool_id", "position", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "name"],
                name="domain_unique_name_in_pool",
                violation_error_message="This pool already has a domain with that name.",
            ),
            # The target of the hosts' composite foreign key (domain, pool).
            models.UniqueConstraint(fields=["id", "pool"], name="domain_id_pool_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.pool.name}/{self.name}" if self.pool_id else self.name
