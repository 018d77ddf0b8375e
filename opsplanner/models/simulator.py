"""Settings of the simulated drainer and executor (a product feature: demo, tests, benchmarks)."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from opsplanner.prepared import PreparedModels

_RATE = [MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))]


def _rate_field(help_text: str) -> models.DecimalField:
    return models.DecimalField(
        max_digits=5, decimal_places=4, default=Decimal(0), validators=_RATE, help_text=help_text
    )


class SimulatorProfile(models.Model):
    """One row (pk=1). Outcomes are deterministic: a hash of the seed, the item and its attempt."""

    seed = models.PositiveIntegerField(default=1)
    drain_seconds = models.FloatField(default=20.0, validators=[MinValueValidator(0)])
    slow_host_fraction = _rate_field("share of hosts whose drain takes slow_drain_factor times longer")
    slow_drain_factor = models.FloatField(default=5.0, validators=[MinValueValidator(1)])
    refusing_host_fraction = _rate_field("share of hosts whose drain is refused")
    execute_seconds = models.FloatField(default=30.0, validators=[MinValueValidator(0)])
    execute_failure_rate = _rate_field("chance that one execution attempt fails")
    verify_seconds = models.FloatField(default=10.0, validators=[MinValueValidator(0)])
    verify_failure_rate = _rate_field("chance that one verification fails")
    undrain_seconds = models.FloatField(default=5.0, validators=[MinValueValidator(0)])
    execute_by_kind = models.JSONField(
        default=dict,
        blank=True,
        help_text="per operation kind, or per upgrade target as kind:component:version, overrides of the two "
        'above: {"upgrade": {"seconds": 600}, "upgrade:gpu-driver:560.1": {"failure_rate": 0.3}}',
    )
    batch_size = models.PositiveIntegerField(default=500, validators=[MinValueValidator(1)])

    class Meta:
        verbose_name = "simulator profile"

    def __str__(self) -> str:
        return f"simulator (seed {self.seed})"

    def clean(self) -> None:
        from opsplanner.models.operations import OperationKind

        if not isinstance(self.execute_by_kind, dict):
            raise ValidationError({"execute_by_kind": "Give an object keyed by operation kind."})
        for key, values in self.execute_by_kind.items():
            kind = str(key).split(":", 1)[0]
            if kind not in OperationKind.values or not isinstance(values, dict) or str(key).count(":") not in (0, 2):
                raise ValidationError(
                    {"execute_by_kind": f"{key!r} is not an operation kind (or kind:component:version) with settings."}
                )
            unknown = set(values) - {"seconds", "failure_rate"}
            seconds, rate = values.get("seconds", 0), values.get("failure_rate", 0)
            if unknown or not isinstance(seconds, int | float) or seconds < 0:
                raise ValidationError({"execute_by_kind": f"{key}: use seconds (0 or more) and failure_rate."})
            if not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise ValidationError({"execute_by_kind": f"{key}: failure_rate is between 0 and 1."})

    def execution(self, kind: str, component: str = "", version: str = "") -> tuple[float, float]:
        """(seconds, failure rate) of one execution of an operation of this kind (and target)."""
        by_kind = self.execute_by_kind.get(kind, {})
        by_target = self.execute_by_kind.get(f"{kind}:{component}:{version}", {}) if component else {}
        return (
            float(by_target.get("seconds", by_kind.get("seconds", self.execute_seconds))),
            float(by_target.get("failure_rate", by_kind.get("failure_rate", self.execute_failure_rate))),
        )

    @classmethod
    def current(cls) -> SimulatorProfile:
        for profile in _PROFILE.objects(pk=1):  # the simulator asks at every instant: compiled once
            return profile
        profile, _ = cls.objects.get_or_create(pk=1)
        return profile


_PROFILE = PreparedModels(lambda *, pk: SimulatorProfile.objects.filter(pk=pk), pk=int)
