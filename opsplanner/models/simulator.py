"""Settings of the simulated drainer and executor (a product feature: demo, tests, benchmarks)."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

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
    batch_size = models.PositiveIntegerField(default=500, validators=[MinValueValidator(1)])

    class Meta:
        verbose_name = "simulator profile"

    def __str__(self) -> str:
        return f"simulator (seed {self.seed})"

    @classmethod
    def current(cls) -> SimulatorProfile:
        profile, _ = cls.objects.get_or_create(pk=1)
        return profile
