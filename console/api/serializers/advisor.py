"""Domain-size advisor runs: the request (shapes and types only; the service checks the rest) and the run."""

from __future__ import annotations

from rest_framework import serializers

from opsplanner.models import AdvisorRun


class AdvisorRunSerializer(serializers.ModelSerializer):
    recommended = serializers.SerializerMethodField(help_text="the recommended hosts per domain, once done")
    reason = serializers.SerializerMethodField(help_text="why that size, or why there is no recommendation")

    class Meta:
        model = AdvisorRun
        fields = [
            "id",
            "state",
            "params",
            "recommended",
            "reason",
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


class AdvisorRunInput(serializers.Serializer):
    """Which domain sizes to simulate for one pool, and what an interruption and a buffer host-hour cost."""

    pool_hosts = serializers.IntegerField(help_text="hosts in the pool (at most 20,000)")
    sizes = serializers.ListField(
        child=serializers.IntegerField(), max_length=100, help_text="candidate hosts per domain, e.g. [16, 40, 80]"
    )
    interruption_cost = serializers.FloatField(help_text="the cost of interrupting one job once")
    capacity_hour_cost = serializers.FloatField(help_text="the cost of one buffer host held back for an hour")
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
