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

# A host the fleet file no longer names (fleet.fleetfile, --prune): kept for history (its tasks,
# events and versions still refer to it) but gone from the live inventory. Deliberately not a
# HostState member: capacity counts iterate HostState, so a retired host is in no total, no buffer
# and no floor, and `Host.objects` leaves it out, so no scope, train, phase or count chooses it.
# Only the fleet file retires a host (never one holding a lease, out of service or named by an open
# operation) and restores it to in_service when a later file names it again.
RETIRED = "retired"
HOST_STATE_CHOICES = [*HostState.choices, (RETIRED, "Retired")]

# Allowed host state transitions; services refuse anything else.
HOST_TRANSITIONS: dict[str, frozenset[str]] = {
    HostState.IN_SERVICE: frozenset({HostState.DRAINING, HostState.FAILED}),
    HostState.DRAINING: frozenset({HostState.MAINTENANCE, HostState.RETURNING, HostState.FAILED}),
    # Straight back, unverified, when its install was stopped unclaimed (its target withdrawn) and
    # nothing else was done in its drain (opsplanner/services/tick/advance.py: _not_applied).
    HostState.MAINTENANCE: frozenset({HostState.VERIFYING, HostState.RETURNING, HostState.FAILED}),
    HostState.VERIFYING: frozenset({HostState.MAINTENANCE, HostState.RETURNING, HostState.FAILED}),
    HostState.RETURNING: frozenset({HostState.IN_SERVICE, HostState.FAILED}),
    HostState.FAILED: frozenset({HostState.REPAIR, HostState.ESCALATED}),
    # A repaired host is verified and returned while still counted as broken (failure buffer), or
    # catches up on its drain's missed train work first (planned buffer, opsplanner/services/tick/repair.py).
    HostState.REPAIR: frozenset({HostState.IN_SERVICE, HostState.MAINTENANCE, HostState.FAILED, HostState.ESCALATED}),
    HostState.ESCALATED: frozenset({HostState.REPAIR}),
}


class LiveHostManager(models.Manager["Host"]):
    """The live inventory: every host but the retired ones (Host.all_objects has them too)."""

    def get_queryset(self) -> models.QuerySet[Host]:
        return super().get_queryset().exclude(state=RETIRED)


class Host(models.Model):
    hostname = models.CharField(max_length=253, unique=True, validators=[HOSTNAME_VALIDATOR])
    # Indexed by (pool, state, id) and (domain, state) below: every index is one more write per state change.
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="hosts", db_index=False)
    domain = models.ForeignKey(MaintenanceDomain, on_delete=models.PROTECT, related_name="hosts", db_index=False)
    state = models.CharField(max_length=16, choices=HOST_STATE_CHOICES, default=HostState.IN_SERVICE)
    state_changed_at = models.DateTimeField(default=clock.now)
    sku = models.CharField("hardware SKU", max_length=64)
    gpu_count = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(64)])
    created_at = models.DateTimeField(default=clock.now)
    # Free-form facts from the fleet file (row, switch, slurm_node ...): strings, numbers or booleans.
    labels = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()), blank=True)

    objects = LiveHostManager()
    all_objects = models.Manager()  # noqa: DJ012 (a manager, after the default one)

    class Meta:
        ordering = ["hostname"]
        indexes = [
            # (pool, state) counts for the buffers; the id serves the API's cursor order within them.
            models.Index(fields=["pool", "state", "id"], name="host_pool_state_id_idx"),
            models.Index(fields=["domain", "state"], name="host_domain_state_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=[*HostState.values, RETIRED]),
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

    def validate_unique(self, exclude: object = None) -> None:
        super().validate_unique(exclude)  # type: ignore[arg-type]
        if (
            self.hostname
            and "hostname" not in (exclude or ())  # type: ignore[operator]
            and Host.all_objects.filter(hostname=self.hostname, state=RETIRED).exclude(pk=self.pk).exists()
        ):
            raise ValidationError(
                {"hostname": f"A retired host is named {self.hostname}: name it in the fleet file to bring it back."}
            )

    def clean(self) -> None:
        if self.domain_id is not None and self.pool_id is not None and self.domain.pool_id != self.pool_id:
            raise ValidationError(
                {
                    "domain": f"Domain {self.domain.name} belongs to pool {self.domain.pool.name}, "
                    f"not to this host's pool {self.pool.name}."
                }
            )
