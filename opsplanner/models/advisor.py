"""Advisor runs: one request to simulate, run by a worker in scratch databases (simulation/advisor_runs.py).
A domain-size run simulates a pool's trains with several domain sizes and advises one; a live forecast
copies a live pool and forecasts its next days under each policy."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from opsplanner import clock


class AdvisorRunState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class AdvisorRunKind(models.TextChoices):
    DOMAIN_SIZE = "domain_size", "Domain-size advice"
    LIVE_FORECAST = "live_forecast", "Live forecast"


ACTIVE_ADVISOR_STATES = (AdvisorRunState.QUEUED, AdvisorRunState.RUNNING)


class AdvisorRun(models.Model):
    kind = models.CharField(max_length=16, choices=AdvisorRunKind.choices, default=AdvisorRunKind.DOMAIN_SIZE)
    params = models.JSONField(
        default=dict,
        help_text="as validated; domain size: pool_hosts, sizes, interruption_cost, capacity_hour_cost, "
        "cycle_slo_hours, seed and the simulated hardware; live forecast: pool, days, policies, seed",
    )
    state = models.CharField(max_length=16, choices=AdvisorRunState.choices, default=AdvisorRunState.QUEUED)
    result = models.JSONField(
        null=True,
        blank=True,
        help_text="domain size: the advice (points per size, recommended, reason); live forecast: the measures "
        "per policy and per pending upgrade",
    )
    failure_reason = models.CharField(max_length=2000, blank=True, default="")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requester = models.CharField(max_length=150, help_text="username or the system part that asked")
    created_at = models.DateTimeField(default=clock.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=AdvisorRunKind.values),
                name="advisor_run_kind_valid",
                violation_error_message="An advisor run is a domain-size advice or a live forecast.",
            ),
            models.CheckConstraint(
                condition=Q(state__in=AdvisorRunState.values),
                name="advisor_run_state_valid",
                violation_error_message="An advisor run is queued, running, done or failed.",
            ),
            models.CheckConstraint(
                condition=Q(state__in=[AdvisorRunState.QUEUED, AdvisorRunState.RUNNING], finished_at__isnull=True)
                | Q(state__in=[AdvisorRunState.DONE, AdvisorRunState.FAILED], finished_at__isnull=False),
                name="advisor_run_finished_when_over",
                violation_error_message="A run has a finish time exactly when it is done or failed.",
            ),
            models.CheckConstraint(
                condition=~Q(state=AdvisorRunState.DONE) | Q(result__isnull=False),
                name="advisor_run_done_has_result",
                violation_error_message="A done run has its result.",
            ),
            models.CheckConstraint(
                condition=~Q(state=AdvisorRunState.FAILED) | ~Q(failure_reason=""),
                name="advisor_run_failure_explained",
                violation_error_message="A failed run says why.",
            ),
        ]
        indexes = [models.Index(fields=["state"], name="advisor_run_state_idx")]

    def __str__(self) -> str:
        return f"advisor run #{self.pk} ({self.state})"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_ADVISOR_STATES
