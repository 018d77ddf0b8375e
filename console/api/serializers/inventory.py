"""Inputs of the inventory's write endpoints: shapes and types only; the services check the rest.

Hosts are written with the fleet file's fields (docs/fleet-file.md): pool and domain by name."""

from __future__ import annotations

from rest_framework import serializers

from console.api.serializers.fields import MAX_ID
from fleet.fleetfile.sources import MAX_HOSTS_PER_REQUEST
from fleet.models import ComponentLayer, DomainKind, WorkloadClass
from opsplanner.adapters import DRAINER_CHOICES, EXECUTOR_CHOICES

REASON_HELP = "why, recorded on the event"


class HostRowSerializer(serializers.Serializer):
    """A host as the fleet file's `hosts[]` declares it (documentation of the bulk rows)."""

    hostname = serializers.CharField(max_length=253)
    pool = serializers.CharField(help_text="pool name", max_length=63)
    domain = serializers.CharField(help_text="domain name in the pool", max_length=63)
    sku = serializers.CharField(max_length=64)
    gpu_count = serializers.IntegerField(min_value=0, max_value=64, default=0)
    labels = serializers.DictField(required=False, help_text="free-form: strings, numbers or true/false")


class BulkHostsSchema(serializers.Serializer):
    hosts = HostRowSerializer(many=True)


class BulkHostsInput(serializers.Serializer):
    """The rows are checked by the fleet file's schema, every problem at its index (`hosts[12].sku`)."""

    hosts = serializers.ListField(child=serializers.JSONField(), max_length=MAX_HOSTS_PER_REQUEST)


class HostUpdateInput(serializers.Serializer):
    pool = serializers.CharField(
        required=False, help_text="move to this pool (name; give the domain too)", max_length=63
    )
    domain = serializers.CharField(
        required=False, help_text="move to this domain (name, in the host's pool)", max_length=63
    )
    sku = serializers.CharField(required=False, max_length=64)
    gpu_count = serializers.IntegerField(required=False, min_value=0, max_value=64)
    labels = serializers.DictField(required=False, help_text="replaces the labels")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, help_text=REASON_HELP)


class HostRetireInput(serializers.Serializer):
    reason = serializers.CharField(max_length=500, help_text=REASON_HELP)


class HostVersionsInput(serializers.Serializer):
    versions = serializers.DictField(
        child=serializers.CharField(max_length=64), allow_empty=False, help_text='{"bios": "2.1", ...}'
    )
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, help_text=REASON_HELP)


class VersionOutcomeSerializer(serializers.Serializer):
    component = serializers.CharField()
    believed = serializers.CharField(allow_null=True, help_text="what OpsPlanner believed before the report")
    reported = serializers.CharField()
    outcome = serializers.ChoiceField(choices=["recorded", "matches", "drift", "drift_cleared"])


class HostVersionsSerializer(serializers.Serializer):
    hostname = serializers.CharField()
    drift = serializers.BooleanField(help_text="the host has a component whose report differed")
    versions = VersionOutcomeSerializer(many=True)


class PoolUpdateInput(serializers.Serializer):
    workload_class = serializers.ChoiceField(choices=WorkloadClass.choices, required=False)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    planned_buffer_hosts = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    planned_buffer_fraction = serializers.DecimalField(
        max_digits=5, decimal_places=4, required=False, allow_null=True, min_value=0
    )
    failure_buffer_hosts = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    failure_buffer_fraction = serializers.DecimalField(
        max_digits=5, decimal_places=4, required=False, allow_null=True, min_value=0
    )
    hard_floor_hosts = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    executor = serializers.ChoiceField(choices=EXECUTOR_CHOICES, required=False)
    drainer = serializers.ChoiceField(choices=DRAINER_CHOICES, required=False)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, help_text=REASON_HELP)


class PoolInput(PoolUpdateInput):
    name = serializers.CharField(max_length=63)
    workload_class = serializers.ChoiceField(choices=WorkloadClass.choices)


class DomainUpdateInput(serializers.Serializer):
    kind = serializers.ChoiceField(choices=DomainKind.choices, required=False)
    position = serializers.IntegerField(required=False, min_value=0, max_value=2_147_483_647)


class DomainInput(DomainUpdateInput):
    pool = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    name = serializers.CharField(max_length=63)


class ComponentUpdateInput(serializers.Serializer):
    display_name = serializers.CharField(required=False, max_length=120)
    needs_reboot = serializers.BooleanField(required=False)
    needs_drain = serializers.BooleanField(required=False)


class ComponentInput(ComponentUpdateInput):
    name = serializers.CharField(max_length=63)
    layer = serializers.ChoiceField(choices=ComponentLayer.choices)


class VersionInput(serializers.Serializer):
    version = serializers.CharField(max_length=64)


class RuleInput(serializers.Serializer):
    job_facing_component = serializers.CharField(max_length=63)
    job_facing_version = serializers.CharField(max_length=64)
    lower_component = serializers.CharField(max_length=63)
    min_version = serializers.CharField(required=False, allow_blank=True, max_length=64, default="")
    max_version = serializers.CharField(required=False, allow_blank=True, max_length=64, default="")
    note = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


class ServiceUpdateInput(serializers.Serializer):
    display_name = serializers.CharField(required=False, max_length=120)
    description = serializers.CharField(required=False, allow_blank=True, max_length=10_000)
    owners = serializers.ListField(child=serializers.CharField(max_length=150), required=False, max_length=1000)


class ServiceInput(ServiceUpdateInput):
    name = serializers.CharField(max_length=63)


class PlacementsRemoveInput(serializers.Serializer):
    hosts = serializers.ListField(
        child=serializers.CharField(max_length=253), allow_empty=False, max_length=MAX_HOSTS_PER_REQUEST
    )


class PlacementsInput(PlacementsRemoveInput):
    running_jobs = serializers.IntegerField(min_value=0, max_value=2_147_483_647, default=1)


class PlacementsSerializer(serializers.Serializer):
    added = serializers.IntegerField()
    changed = serializers.IntegerField()
    removed = serializers.IntegerField()
