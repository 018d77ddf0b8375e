"""Hosts and their lifecycle states."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from fleet.models.pools import MaintenanceDomain, Pool
from opsplanner import clock

HOSTNAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$",
    "Use a lowercase DNS name: letters, digits, dashes and dots.",
)


class HostState(models.TextChoices):
    """A host's lifecycle: in service, out for planned work, or out broken.

    in_service → draining → maintenance → verifying → returning → in_service for planned work;
    any out state → failed → repair → in_service (or escalated, which needs a human).
    """

    IN_SERVICE = "in_service", "In service"
    DRAINING = "draining", "Draining"
    MAINTENANCE = "maintenance", "In maintenance"
    VERIFYING = "verifying", "Verifying"
    RETURNING = "returning", "Returning to service"
    FAILED = "failed", "Failed"
    REPAIR = "repair", "In repair"
    ESCALATED = "escalated", "Escalated to a human"


# Which states count against which buffer: the capacity floor is computed from these two sets.
PLANNED_OUT_STATES = frozenset({HostState.DRAINING, HostState.MAINTENANCE, HostState.VERIFYING, HostState.RETURNING})
FAILURE_OUT_STATES = frozenset({HostState.FAILED, HostState.REPAIR, HostState.ESCALATED})

# Allowed host state transitions; services refuse anything else.
HOST_TRANSITIONS: dict[str, frozenset[str]] = {
    HostState.IN_SERVICE: frozenset({HostState.DRAINING, HostState.FAILED}),
    HostState.DRAINING: frozenset({HostState.MAINTENANCE, HostState.RETURNING, HostState.FAILED}),
    HostState.MAINTENANCE: frozenset({HostState.VERIFYING, HostState.FAILED}),
    HostState.VERIFYING: frozenset({HostState.MAINTENANCE, HostState.RETURNING, HostState.FAILED}),
    HostState.RETURNING: frozenset({HostState.IN_SERVICE, HostState.FAILED}),
    HostState.FAILED: frozenset({HostState.REPAIR, HostState.ESCALATED}),
    # A repaired host is verified and returned while still counted as broken (failure buffer).
    HostState.REPAIR: frozenset({HostState.IN_SERVICE, HostState.FAILED, HostState.ESCALATED}),
    HostState.ESCALATED: frozenset({HostState.REPAIR}),
}


class Host(models.Model):
    hostname = models.CharField(max_length=253, unique=True, validators=[HOSTNAME_VALIDATOR])
    # Indexed by (pool, state, id) and (domain, state) below: every index is one more write per state change.
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="hosts", db_index=False)
    domain = models.ForeignKey(MaintenanceDomain, on_delete=models.PROTECT, related_name="hosts", db_index=False)
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.IN_SERVICE)
    state_changed_at = models.DateTimeField(default=clock.now)
    sku = models.CharField("hardware SKU", max_length=64)
    gpu_count = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(64)])
    created_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["hostname"]
        indexes = [
            # (pool, state) counts for the buffers; the id serves the API's cursor order within them.
            models.Index(fields=["pool", "state", "id"], name="host_pool_state_id_idx"),
            models.Index(fields=["domain", "state"], name="host_domain_state_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=HostState.values),
                name="host_state_valid",
                violation_error_message="Unknown host state.",
            ),
            models.CheckConstraint(
                condition=Q(gpu_count__lte=64),
                name="host_gpu_count_range",
                violation_error_message="A host has at most 64 GPUs.",
            ),
            models.CheckConstraint(
                condition=~Q(sku=""), name="host_sku_not_empty", violation_error_message="Give the SKU."
            ),
        ]

    def __str__(self) -> str:
        return self.hostname

    def clean(self) -> None:
        if self.domain_id is not None and self.pool_id is not None and self.domain.pool_id != self.pool_id:
            raise ValidationError(
                {
                    "domain": f"Domain {self.domain.name} belongs to pool {self.domain.pool.name}, "
                    f"not to this host's pool {self.pool.name}."
                }
            )
