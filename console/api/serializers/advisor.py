"""Advisor runs: the requests (shapes and types only; the service checks the rest) and the run.

Two kinds share one endpoint, told apart by `kind`: a domain-size advice (the default) and a live
forecast (what-if on the live fleet)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from opsplanner.models import AdvisorRun
from opsplanner.models.advisor import AdvisorRunKind
from simulation.advisor_runs import LIVE_FORECAST_POLICIES, MAX_FORECAST_DAYS
from simulation.config import POLICIES


class LiveForecastMeasures(serializers.Serializer):
    """A policy's forecast over the whole pool (the measures `simulate --from-live` prints; more may follow)."""

    drains = serializers.IntegerField(allow_null=True, help_text="host drains")
    drains_per_host = serializers.FloatField(allow_null=True, help_text="drains per host of the pool")
    interrupted_by_drains = serializers.IntegerField(allow_null=True, help_text="jobs interrupted by drains")
    rollouts = serializers.IntegerField(allow_null=True, help_text="pending upgrades forecast")
    rollouts_finished = serializers.IntegerField(allow_null=True, help_text="of them, on every host in time")
    rollout_mean_hours = serializers.FloatField(allow_null=True, help_text="time to full rollout, mean")
    rollout_worst_hours = serializers.FloatField(allow_null=True, help_text="time to full rollout, worst")
    cycles_missed_slo = serializers.IntegerField(allow_null=True, help_text="train cycles that missed their SLO")
    cycles_missed_keepable = serializers.IntegerField(allow_null=True, help_text="of them, an SLO that was keepable")
    reach_24h_mean = serializers.FloatField(allow_null=True, help_text="share of hosts reached per upgrade at 24 h")
    min_in_service = serializers.IntegerField(allow_null=True, help_text="fewest hosts in service at once")
    violations = serializers.IntegerField(allow_null=True, help_text="invariant violations (0 expected)")


class LiveForecastUpgrade(serializers.Serializer):
    pool = serializers.CharField()
    component = serializers.CharField()
    version = serializers.CharField()
    full_rollout_hours = serializers.FloatField(allow_null=True, help_text="None: not on every host in time")
    outcome = serializers.CharField(allow_null=True)
    reach_24h = serializers.FloatField(allow_null=True, help_text="share of hosts at 24 h; None: past the end")
    reach_72h = serializers.FloatField(allow_null=True)
    reach_7d = serializers.FloatField(allow_null=True)


class LiveForecastPolicy(serializers.Serializer):
    policy = serializers.ChoiceField(choices=POLICIES)
    label = serializers.CharField()  # type: ignore[assignment]  # a declared field, popped by the metaclass
    notes = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="what this policy's forecast assumed (a stopped train)"
    )
    measures = LiveForecastMeasures()
    upgrades = LiveForecastUpgrade(many=True)


class LiveForecastResult(serializers.Serializer):
    pool = serializers.CharField()
    start_at = serializers.DateTimeField(help_text="the live now the forecast started from")
    days = serializers.FloatField()
    hosts = serializers.IntegerField()
    notes = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="what the forecast assumed, not in its measures"
    )
    policies = LiveForecastPolicy(many=True)


class AdvisorRunSerializer(serializers.ModelSerializer):
    recommended = serializers.SerializerMethodField(help_text="the recommended hosts per domain, once done")
    reason = serializers.SerializerMethodField(help_text="why that size, or why there is no recommendation")
    forecast = serializers.SerializerMethodField(help_text="a done live forecast's measures per policy, else null")

    class Meta:
        model = AdvisorRun
        fields = [
            "id",
            "kind",
            "state",
            "params",
            "recommended",
            "reason",
            "forecast",
            "result",
            "failure_reason",
            "requester",
            "created_at",
            "started_at",
            "finished_at",
        ]

    def get_recommended(self, run: AdvisorRun) -> int | None:
        return (run.result or {}).get("recommended")

    def get_reason(self, run: AdvisorRun) -> str:
        return str((run.result or {}).get("reason") or "")

    @extend_schema_field(LiveForecastResult(allow_null=True))
    def get_forecast(self, run: AdvisorRun) -> dict[str, Any] | None:
        return run.result if run.kind == AdvisorRunKind.LIVE_FORECAST and run.result else None


class AdvisorRunKindInput(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=AdvisorRunKind.values, default=AdvisorRunKind.DOMAIN_SIZE, help_text="which run (default domain_size)"
    )


class AdvisorRunInput(serializers.Serializer):
    """Which domain sizes to simulate for one pool, and what an interruption and a buffer host-hour cost."""

    kind = serializers.ChoiceField(choices=[AdvisorRunKind.DOMAIN_SIZE.value], default=AdvisorRunKind.DOMAIN_SIZE)
    pool_hosts = serializers.IntegerField(help_text="hosts in the pool (at most 20,000)")
    sizes = serializers.ListField(
        child=serializers.IntegerField(), max_length=100, help_text="candidate hosts per domain, e.g. [16, 40, 80]"
    )
    interruption_cost = serializers.FloatField(help_text="the cost of interrupting one job once")
    capacity_hour_cost = serializers.FloatField(
        help_text="the cost of a host doing no work for an hour: a buffer host held back, or one an interrupted "
        "job strands"
    )
    cycle_slo_hours = serializers.FloatField(default=72.0, help_text="a cycle over the whole pool must end within")
    seed = serializers.IntegerField(default=1, help_text="the same seed gives the same simulation")
    # The simulated hardware (simulation.advisor_runs.HARDWARE_KNOBS); left out: the simulator's defaults.
    drain_minutes = serializers.FloatField(required=False, help_text="draining one host (default 15)")
    execute_minutes = serializers.FloatField(required=False, help_text="applying the upgrade (default 30)")
    verify_minutes = serializers.FloatField(required=False, help_text="the checks after it (default 10)")
    undrain_minutes = serializers.FloatField(required=False, help_text="returning a host to service (default 5)")
    host_failures_per_day = serializers.FloatField(required=False, help_text="per host (default 0.0005)")
    upgrade_failure_rate = serializers.FloatField(required=False, help_text="per host and upgrade (default 0.005)")
    verify_failure_rate = serializers.FloatField(required=False, help_text="per check (default 0.002)")
    optout_windows_per_week = serializers.FloatField(required=False, help_text="each 2-8 hours (default 2)")
    job_hosts_min = serializers.IntegerField(required=False, help_text="the smallest job, in hosts (default 4)")
    job_hosts_max = serializers.IntegerField(required=False, help_text="the largest job, in hosts (default 32)")


class LiveForecastInput(serializers.Serializer):
    """What-if on the live fleet: copy one live pool (never writing to it) and forecast its pending
    upgrades over the next days under each policy."""

    kind = serializers.ChoiceField(choices=[AdvisorRunKind.LIVE_FORECAST.value])
    pool = serializers.CharField(max_length=200, help_text="the live pool's name; it must have hosts")
    days = serializers.IntegerField(help_text=f"days to forecast, 1 to {MAX_FORECAST_DAYS}")
    policies = serializers.ListField(
        child=serializers.CharField(max_length=50),
        max_length=len(POLICIES),
        required=False,
        help_text=f"some of {', '.join(POLICIES)} (default {', '.join(LIVE_FORECAST_POLICIES)})",
    )
    seed = serializers.IntegerField(default=1, help_text="draws the host failures; the same seed, the same forecast")
