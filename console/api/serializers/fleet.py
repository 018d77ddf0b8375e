"""Fleet resources: pools with live buffer usage, domains, hosts, components, services, windows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rest_framework import serializers

from console.api.serializers.fast import iso
from console.api.serializers.fields import MAX_ID
from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
)
from fleet.models.services import _TimeWindow
from fleet.selectors.inventory import pools_with_usage  # noqa: F401 (moved there; imported from here too)

if TYPE_CHECKING:
    from django.contrib.auth.models import User  # settings.AUTH_USER_MODEL
    from django_stubs_ext import WithAnnotations

    from fleet.selectors.inventory import PoolUsageCounts


class PoolSerializer(serializers.ModelSerializer):
    usage = serializers.SerializerMethodField()

    class Meta:
        model = Pool
        fields = [
            "id",
            "name",
            "workload_class",
            "description",
            "planned_buffer_hosts",
            "planned_buffer_fraction",
            "failure_buffer_hosts",
            "failure_buffer_fraction",
            "hard_floor_hosts",
            "executor",
            "drainer",
            "created_at",
            "usage",
        ]

    def get_usage(self, pool: Pool) -> dict[str, int]:
        # The views list pools through pools_with_usage, which counts the hosts. (The parameter says
        # Pool: drf-spectacular reads this signature at run time, where WithAnnotations does not exist.)
        counted = cast("WithAnnotations[Pool, PoolUsageCounts]", pool)
        total = counted.n_total
        buffers = pool.buffers_for(total)
        return {
            "total": total,
            "in_service": counted.n_in_service,
            "planned_out": counted.n_planned_out,
            "failure_out": counted.n_failure_out,
            "planned_buffer": buffers.planned,
            "failure_buffer": buffers.failure,
            "floor": buffers.floor,
            "planned_room": max(buffers.planned - counted.n_planned_out, 0),
        }


class DomainSerializer(serializers.ModelSerializer):
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    hosts = serializers.IntegerField(source="n_hosts", read_only=True)

    class Meta:
        model = MaintenanceDomain
        fields = ["id", "pool", "pool_name", "name", "kind", "position", "hosts", "created_at"]


class HostSerializer(serializers.ModelSerializer):
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    domain_name = serializers.CharField(source="domain.name", read_only=True)

    class Meta:
        model = Host
        fields = [
            "id",
            "hostname",
            "pool",
            "pool_name",
            "domain",
            "domain_name",
            "state",
            "state_changed_at",
            "sku",
            "gpu_count",
            "labels",
            "created_at",
        ]

    def to_representation(self, host: Host) -> dict[str, Any]:
        if type(self) is not HostSerializer:  # the detail view adds computed fields
            return super().to_representation(host)
        return {
            "id": host.id,
            "hostname": host.hostname,
            "pool": host.pool_id,
            "pool_name": getattr(host, "pool_name", None) or host.pool.name,
            "domain": host.domain_id,
            "domain_name": getattr(host, "domain_name", None) or host.domain.name,
            "state": host.state,
            "state_changed_at": iso(host.state_changed_at),
            "sku": host.sku,
            "gpu_count": host.gpu_count,
            "labels": host.labels,
            "created_at": iso(host.created_at),
        }


class InstalledSerializer(serializers.Serializer):
    component = serializers.CharField()
    version = serializers.CharField()
    previous_version = serializers.CharField(allow_null=True)
    installed_at = serializers.DateTimeField()
    drift_from = serializers.CharField(
        allow_null=True, help_text="what OpsPlanner believed when the host last reported something else"
    )


class HolderSerializer(serializers.Serializer):
    operation = serializers.IntegerField()
    host_task = serializers.IntegerField()
    kind = serializers.CharField()
    since = serializers.DateTimeField()


class HostDetailSerializer(HostSerializer):
    versions = serializers.SerializerMethodField()
    holder = serializers.SerializerMethodField()
    incompatibilities = serializers.SerializerMethodField()
    services = serializers.SerializerMethodField()
    history = serializers.SerializerMethodField(help_text="the host's events, newest first")

    class Meta(HostSerializer.Meta):
        fields = [*HostSerializer.Meta.fields, "versions", "holder", "incompatibilities", "services", "history"]

    def get_history(self, host: Host) -> str:
        return f"/api/events/?host={host.pk}"

    def get_versions(self, host: Host) -> list[dict[str, Any]]:
        rows = host.installed_versions.select_related(
            "component", "version", "previous_version", "drift_from"
        ).order_by("component__name")
        return InstalledSerializer(
            [
                {
                    "component": row.component.name,
                    "version": row.version.version,
                    "previous_version": row.previous_version.version if row.previous_version is not None else None,
                    "installed_at": row.installed_at,
                    "drift_from": row.drift_from.version if row.drift_from is not None else None,
                }
                for row in rows
            ],
            many=True,
        ).data  # type: ignore[return-value]  # stub gap: many=True makes a ListSerializer, whose data is a list

    def get_holder(self, host: Host) -> dict[str, Any] | None:
        lease = host.leases.filter(active=True).select_related("operation").first()
        if lease is None:
            return None
        return HolderSerializer(
            {
                "operation": lease.operation_id,
                "host_task": lease.host_task_id,
                "kind": lease.operation.kind,
                "since": lease.acquired_at,
            }
        ).data

    def get_incompatibilities(self, host: Host) -> list[str]:
        from fleet.selectors.compatibility import host_incompatibilities

        return host_incompatibilities([host.pk]).get(host.pk, [])

    def get_services(self, host: Host) -> list[str]:
        return list(host.services.order_by("name").values_list("name", flat=True))


class ComponentVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ComponentVersion
        fields = ["id", "version", "released_at", "withdrawn_at", "withdrawn_reason", "withdrawn_by"]
        read_only_fields = ["withdrawn_by"]


class ComponentSerializer(serializers.ModelSerializer):
    versions = ComponentVersionSerializer(many=True, read_only=True)

    class Meta:
        model = Component
        fields = ["id", "name", "display_name", "layer", "needs_reboot", "needs_drain", "versions"]


class CompatibilityRuleSerializer(serializers.ModelSerializer):
    job_facing_component = serializers.CharField(source="job_facing_version.component.name", read_only=True)
    job_facing_version = serializers.CharField(source="job_facing_version.version", read_only=True)
    lower_component = serializers.CharField(source="lower_component.name", read_only=True)

    class Meta:
        model = CompatibilityRule
        fields = [
            "id",
            "job_facing_component",
            "job_facing_version",
            "lower_component",
            "min_version",
            "max_version",
            "note",
        ]


class ServiceSerializer(serializers.ModelSerializer):
    owners: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", many=True, read_only=True
    )
    hosts = serializers.IntegerField(source="n_hosts", read_only=True)

    class Meta:
        model = Service
        fields = ["id", "name", "display_name", "description", "owners", "hosts"]


class _WindowSerializer(serializers.ModelSerializer):
    service_name = serializers.CharField(source="service.name", read_only=True)
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    active = serializers.SerializerMethodField()

    def get_active(self, window: _TimeWindow) -> bool:
        from opsplanner import clock

        return window.is_active_at(clock.now())


WINDOW_FIELDS = [
    "id",
    "service",
    "service_name",
    "starts_at",
    "ends_at",
    "reason",
    "created_by",
    "created_at",
    "cancelled_at",
    "active",
]


class OptOutWindowSerializer(_WindowSerializer):
    class Meta:
        model = OptOutWindow
        fields = WINDOW_FIELDS


class ReservationSerializer(_WindowSerializer):
    pool_name = serializers.CharField(source="pool.name", read_only=True)

    class Meta:
        model = CapacityReservation
        fields = [*WINDOW_FIELDS, "pool", "pool_name", "min_hosts_in_service"]


class WindowInput(serializers.Serializer):
    """An opt-out window to register: which service, when, why."""

    service = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    reason = serializers.CharField(max_length=500)


class ReservationInput(WindowInput):
    pool = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    min_hosts_in_service = serializers.IntegerField(min_value=1, max_value=10_000_000)


class ReasonInput(serializers.Serializer):
    reason = serializers.CharField(max_length=500)
