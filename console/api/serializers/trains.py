"""Trains, their forecast, visits, upgrades and phases."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.api.serializers.fields import MAX_ID
from opsplanner import clock
from opsplanner.adapters import DRAINER_OVERRIDE_CHOICES, EXECUTOR_OVERRIDE_CHOICES, POOLS_ADAPTER
from opsplanner.scopes import MAX_SCOPE_LENGTH
from trains.limits import (
    MAX_AUTO_RESUME_S,
    MAX_COUNT,
    MAX_CYCLE_SLO_S,
    MAX_DOMAINS_AT_ONCE,
    MAX_SOAK_S,
    MAX_TRAIN_PRIORITY,
    MAX_UPGRADE_PRIORITY,
    MAX_VISIT_ESTIMATE_S,
)
from trains.models import Pace, Train, Upgrade, UpgradePhase, UpgradeState, Visit
from trains.models.trains import DEFAULT_TRAIN_PRIORITY
from trains.models.upgrades import DEFAULT_UPGRADE_PRIORITY, PhaseSelection
from trains.selectors_forecast import ForecastCode, upgrades_forecasts
from trains.selectors_promise import PromiseState, upgrade_promise


class TrainSerializer(serializers.ModelSerializer):
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    domain_order = serializers.SerializerMethodField()

    class Meta:
        model = Train
        fields = [
            "id",
            "name",
            "pool",
            "pool_name",
            "emergency",
            "upgrade",
            "state",
            "state_reason",
            "state_changed_at",
            "visit_concurrency",
            "pace",
            "cycle_slo_s",
            "visit_estimate_s",
            "visit_overhead_s",
            "budget_code",
            "budget_reason",
            "priority",
            "executor",
            "drainer",
            "auto_resume_after_s",
            "created_at",
            "domain_order",
        ]

    def get_domain_order(self, train: Train) -> list[str]:
        return [stop.domain.name for stop in train.stops.all()]


class TrainInput(serializers.Serializer):
    pool = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    name = serializers.CharField(max_length=63)
    cycle_slo_s = serializers.IntegerField(min_value=1, max_value=MAX_CYCLE_SLO_S)
    visit_estimate_s = serializers.IntegerField(min_value=1, max_value=MAX_VISIT_ESTIMATE_S, default=3600)
    domain_order = serializers.ListField(child=serializers.CharField(max_length=63), required=False, max_length=10_000)
    visit_concurrency = serializers.IntegerField(min_value=1, max_value=MAX_DOMAINS_AT_ONCE, default=1)
    pace = serializers.ChoiceField(
        choices=Pace.choices,
        default=Pace.DOMAIN,
        help_text="domain: the next domain starts when the visit's last host is back; sliding: hosts of the next "
        "domain start as hosts come back, never more than a visit's worth out",
    )
    visit_overhead_s = serializers.IntegerField(
        min_value=1,
        max_value=MAX_VISIT_ESTIMATE_S,
        required=False,
        allow_null=True,
        help_text="drain, checks and return of one visit; empty: half the visit estimate",
    )
    priority = serializers.IntegerField(min_value=0, max_value=MAX_TRAIN_PRIORITY, default=DEFAULT_TRAIN_PRIORITY)
    auto_resume_after_s = serializers.IntegerField(min_value=1, max_value=MAX_AUTO_RESUME_S, required=False)
    executor = serializers.ChoiceField(choices=EXECUTOR_OVERRIDE_CHOICES, default=POOLS_ADAPTER, allow_blank=True)
    drainer = serializers.ChoiceField(choices=DRAINER_OVERRIDE_CHOICES, default=POOLS_ADAPTER, allow_blank=True)


class DomainForecastSerializer(serializers.Serializer):
    domain_id = serializers.IntegerField()
    domain = serializers.CharField()
    position = serializers.IntegerField()
    state = serializers.CharField()
    last_visited_at = serializers.DateTimeField(allow_null=True)
    starts_at = serializers.DateTimeField(allow_null=True)
    ends_at = serializers.DateTimeField(allow_null=True)
    skip_reason = serializers.CharField()


class ForecastSerializer(serializers.Serializer):
    train = serializers.IntegerField(source="train.pk")
    train_name = serializers.CharField(source="train.name")
    cycle = serializers.IntegerField(source="cycle.number", allow_null=True, default=None)
    cycle_deadline = serializers.DateTimeField(source="cycle.deadline_at", allow_null=True, default=None)
    visit_seconds = serializers.FloatField()
    cycle_end = serializers.DateTimeField(allow_null=True)
    meets_slo = serializers.BooleanField()
    miss_cause = serializers.CharField()
    domains = DomainForecastSerializer(many=True)


class VisitSerializer(serializers.ModelSerializer):
    domain_name = serializers.CharField(source="domain.name", read_only=True)
    cycle_number = serializers.IntegerField(source="cycle.number", read_only=True)

    class Meta:
        model = Visit
        fields = [
            "id",
            "train",
            "cycle",
            "cycle_number",
            "domain",
            "domain_name",
            "position",
            "state",
            "plan",
            "started_at",
            "ended_at",
            "skips",
            "skip_reason",
            "outcome",
        ]


class UpgradePhaseSerializer(serializers.ModelSerializer):
    domain_name = serializers.CharField(source="domain.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = UpgradePhase
        fields = [
            "position",
            "name",
            "domain",
            "domain_name",
            "percent",
            "min_successes",
            "soak_s",
            "started_at",
            "successes_reached_at",
            "graduated_at",
            "selection",
            "picked_hosts",
            "held_code",
            "held_reason",
            "held_at",
        ]


class UpgradeForecastSerializer(serializers.Serializer):
    code = serializers.ChoiceField(choices=ForecastCode.choices)
    cycle = serializers.IntegerField(allow_null=True, help_text="the cycle by which every host has it")
    at = serializers.DateTimeField(allow_null=True, help_text="around when that cycle reaches its last host")
    deadline_met = serializers.BooleanField(allow_null=True, help_text="null: the upgrade has no deadline")
    text = serializers.CharField()
    hosts_escalated = serializers.IntegerField(
        help_text="hosts below its target escalated to a human: not forecast (no visit takes them until they return)"
    )
    hosts_incompatible = serializers.IntegerField(
        help_text="hosts below its target that every visit refuses it on: their domain has hosts the target would "
        "make break a compatibility rule (code incompatible; not forecast)"
    )


class UpgradePromiseSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=PromiseState.choices)
    cycle = serializers.IntegerField(
        allow_null=True, help_text="the cycle its first forecast said every host has it by"
    )
    at = serializers.DateTimeField(allow_null=True, help_text="around when, by that forecast")
    made_at = serializers.DateTimeField(allow_null=True, help_text="when that forecast was made")
    late_s = serializers.FloatField(
        allow_null=True, help_text="past the promised time when every host ran it (or now, not yet); negative: early"
    )
    text = serializers.CharField()


class UpgradeListSerializer(serializers.ListSerializer):
    """Forecasts every upgrade of the page at once (a fixed number of queries, whatever the page)."""

    def to_representation(self, data: Any) -> list[Any]:
        upgrades = list(data.all() if hasattr(data, "all") else data)
        # The child reads its root's context: one forecast for the whole page.
        cast(dict[str, Any], self._context)["forecasts"] = upgrades_forecasts(upgrades)
        return super().to_representation(upgrades)


class UpgradeSerializer(serializers.ModelSerializer):
    component = serializers.CharField(source="component_version.component.name", read_only=True)
    version = serializers.CharField(source="component_version.version", read_only=True)
    phases = UpgradePhaseSerializer(many=True, read_only=True)
    held_code = serializers.SerializerMethodField(help_text="why the phase in force cannot graduate; empty if it can")
    held_reason = serializers.SerializerMethodField(help_text="what holds the phase in force and what would unblock it")
    forecast = serializers.SerializerMethodField(
        help_text="when the upgrade reaches every host of its scope, from its place in the backlog"
    )
    promise = serializers.SerializerMethodField(
        help_text="its first forecast, kept, against when every host ran it (or now, while not every host has)"
    )

    class Meta:
        model = Upgrade
        list_serializer_class = UpgradeListSerializer
        fields = [
            "id",
            "pool",
            "component",
            "version",
            "scope",
            "reason",
            "state",
            "state_reason",
            "emergency",
            "current_phase",
            "max_failures",
            "max_failure_rate",
            "failure_rate_min_hosts",
            "multi_cycle",
            "hosts_per_visit",
            "priority",
            "deadline",
            "duration_s",
            "requester",
            "created_at",
            "finished_at",
            "held_code",
            "held_reason",
            "forecast",
            "promise",
            "phases",
        ]

    @extend_schema_field(UpgradeForecastSerializer)
    def get_forecast(self, upgrade: Upgrade) -> dict:
        forecasts = self.context.get("forecasts")
        if forecasts is None or upgrade.pk not in forecasts:  # one upgrade (a detail, a create)
            forecasts = upgrades_forecasts([upgrade])
        return UpgradeForecastSerializer(asdict(forecasts[upgrade.pk])).data

    @extend_schema_field(UpgradePromiseSerializer)
    def get_promise(self, upgrade: Upgrade) -> dict:
        return UpgradePromiseSerializer(asdict(upgrade_promise(upgrade, now=clock.now()))).data

    def _phase_in_force(self, upgrade: Upgrade) -> UpgradePhase | None:
        phases = upgrade.phases.all()  # prefetched by the viewset
        return next((p for p in phases if p.position == upgrade.current_phase), None)

    def get_held_code(self, upgrade: Upgrade) -> str:
        phase = self._phase_in_force(upgrade)
        return phase.held_code if phase is not None and upgrade.state == UpgradeState.ACTIVE else ""

    def get_held_reason(self, upgrade: Upgrade) -> str:
        phase = self._phase_in_force(upgrade)
        return phase.held_reason if phase is not None and upgrade.state == UpgradeState.ACTIVE else ""


class PhaseInput(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    domain = serializers.CharField(max_length=63, required=False, allow_blank=True)
    percent = serializers.IntegerField(min_value=1, max_value=100, required=False)
    min_successes = serializers.IntegerField(min_value=0, max_value=MAX_COUNT, default=1)
    soak_s = serializers.IntegerField(min_value=0, max_value=MAX_SOAK_S, default=0)
    selection = serializers.ChoiceField(choices=PhaseSelection.choices, default=PhaseSelection.FIXED)


class UpgradeInput(serializers.Serializer):
    pool = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    component = serializers.CharField(max_length=63)
    version = serializers.CharField(max_length=64)
    reason = serializers.CharField(max_length=500)
    scope = serializers.CharField(max_length=MAX_SCOPE_LENGTH, required=False, allow_blank=True, default="")
    phases = PhaseInput(many=True, required=False, max_length=20)  # type: ignore[call-arg]  # stub gap: many=True takes min/max_length (DRF 3.14+)
    max_failures = serializers.IntegerField(min_value=0, max_value=MAX_COUNT, default=2)
    max_failure_rate = serializers.FloatField(min_value=0, max_value=1, required=False)
    failure_rate_min_hosts = serializers.IntegerField(min_value=1, max_value=MAX_COUNT, default=5)
    multi_cycle = serializers.BooleanField(default=False)
    hosts_per_visit = serializers.IntegerField(min_value=1, max_value=MAX_COUNT, required=False)
    priority = serializers.IntegerField(min_value=0, max_value=MAX_UPGRADE_PRIORITY, default=DEFAULT_UPGRADE_PRIORITY)
    deadline = serializers.DateTimeField(required=False, help_text="every host by then; moves the upgrade ahead")
    duration_s = serializers.IntegerField(
        min_value=1, max_value=MAX_SOAK_S, required=False, help_text="expected time to apply it on one host"
    )


class UpgradeReplanInput(serializers.Serializer):
    """Only the fields sent change (trains.services.replan.upgrade_replan decides the rest)."""

    priority = serializers.IntegerField(
        min_value=0, max_value=MAX_UPGRADE_PRIORITY, required=False, help_text="higher goes first in a visit"
    )
    deadline = serializers.DateTimeField(
        required=False, allow_null=True, help_text="every host by then; null clears it"
    )
    multi_cycle = serializers.BooleanField(
        required=False, help_text="false: every host of a domain per visit (its hosts per visit are dropped)"
    )
    hosts_per_visit = serializers.IntegerField(
        min_value=1, max_value=MAX_COUNT, required=False, allow_null=True, help_text="a multi-cycle upgrade's bound"
    )
