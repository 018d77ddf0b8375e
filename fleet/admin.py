"""The inventory in the Django admin, with search and filters. Every add, change and delete goes
through fleet.services.audit (AuditedAdmin), so it leaves an event naming the changed fields. Host
state is read-only here: state changes go through the services so they are guarded. Opt-out windows
and reservations are read-only too: their owners' services hold their rules (not in the past, within
the pool's size, only live windows change, cancelled with a reason); use the owner pages or the API.
A host moved or a pool's buffers changed here meet the services' rules (under the same locks): no
move of a host under live work, no buffer below what is out for it now."""

import copy
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    InstalledVersion,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
    ServicePlacement,
)
from fleet.services.catalogue import pool_change_refusals
from fleet.services.host_changes import host_move_refusals
from opsplanner.admin import AuditedAdmin, ReadOnlyAdmin


class PoolAdminForm(forms.ModelForm):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is not None and not self.errors:
            wanted = copy.copy(self.instance)  # the instance gets the form's values only after clean()
            for name in self.changed_data:
                setattr(wanted, name, cleaned.get(name))
            # changeform_view is one transaction: the pool stays locked until the change is saved.
            refusals = pool_change_refusals(pool=wanted, changed_fields=set(self.changed_data))
            if refusals:
                raise ValidationError(refusals)
        return cleaned


class HostAdminForm(forms.ModelForm):
    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is not None and not self.errors and {"pool", "domain"} & set(self.changed_data):
            refusals = host_move_refusals(host_id=self.instance.pk, pool=cleaned["pool"], domain=cleaned["domain"])
            if refusals:
                raise ValidationError(refusals)
        return cleaned


@admin.register(Pool)
class PoolAdmin(AuditedAdmin):
    form = PoolAdminForm
    list_display = [
        "name",
        "workload_class",
        "planned_buffer_hosts",
        "planned_buffer_fraction",
        "failure_buffer_hosts",
        "failure_buffer_fraction",
    ]
    list_filter = ["workload_class"]
    search_fields = ["name", "description"]


@admin.register(MaintenanceDomain)
class MaintenanceDomainAdmin(AuditedAdmin):
    list_display = ["name", "pool", "kind", "position"]
    list_filter = ["kind", "pool"]
    search_fields = ["name", "pool__name"]
    list_select_related = ["pool"]


class InstalledVersionInline(admin.TabularInline):
    model = InstalledVersion
    extra = 0
    raw_id_fields = ["version"]


@admin.register(Host)
class HostAdmin(AuditedAdmin):
    form = HostAdminForm
    list_display = ["hostname", "pool", "domain", "state", "sku", "gpu_count", "state_changed_at"]
    list_filter = ["state", "pool", "sku"]
    search_fields = ["hostname", "domain__name"]
    list_select_related = ["pool", "domain"]
    raw_id_fields = ["domain"]
    readonly_fields = ["state", "state_changed_at", "created_at"]
    show_full_result_count = False
    inlines = [InstalledVersionInline]


@admin.register(Component)
class ComponentAdmin(AuditedAdmin):
    list_display = ["name", "display_name", "layer", "needs_reboot", "needs_drain"]
    list_filter = ["layer", "needs_reboot"]
    search_fields = ["name", "display_name"]


@admin.register(ComponentVersion)
class ComponentVersionAdmin(AuditedAdmin):
    list_display = ["component", "version", "released_at", "withdrawn_at", "withdrawn_by"]
    list_filter = ["component"]
    search_fields = ["version", "component__name"]
    list_select_related = ["component"]


@admin.register(InstalledVersion)
class InstalledVersionAdmin(AuditedAdmin):
    list_display = ["host", "component", "version", "installed_at"]
    list_filter = ["component"]
    search_fields = ["host__hostname", "version__version"]
    list_select_related = ["host", "component", "version__component"]
    raw_id_fields = ["host", "version"]
    show_full_result_count = False


@admin.register(CompatibilityRule)
class CompatibilityRuleAdmin(AuditedAdmin):
    list_display = ["job_facing_version", "lower_component", "min_version", "max_version", "note"]
    list_filter = ["lower_component"]
    search_fields = ["note", "lower_component__name", "job_facing_version__version"]
    list_select_related = ["job_facing_version__component", "lower_component"]


class ServicePlacementInline(admin.TabularInline):
    model = ServicePlacement
    extra = 0
    raw_id_fields = ["host"]


@admin.register(Service)
class ServiceAdmin(AuditedAdmin):
    list_display = ["name", "display_name"]
    search_fields = ["name", "display_name", "owners__username"]
    filter_horizontal = ["owners"]


@admin.register(ServicePlacement)
class ServicePlacementAdmin(AuditedAdmin):
    list_display = ["service", "host", "running_jobs"]
    list_filter = ["service"]
    search_fields = ["host__hostname", "service__name"]
    list_select_related = ["service", "host"]
    raw_id_fields = ["host"]
    show_full_result_count = False


@admin.register(OptOutWindow)
class OptOutWindowAdmin(ReadOnlyAdmin):
    list_display = ["service", "starts_at", "ends_at", "reason", "cancelled_at"]
    list_filter = ["service", "cancelled_at"]
    search_fields = ["service__name", "reason"]
    date_hierarchy = "starts_at"


@admin.register(CapacityReservation)
class CapacityReservationAdmin(ReadOnlyAdmin):
    list_display = ["service", "pool", "min_hosts_in_service", "starts_at", "ends_at", "cancelled_at"]
    list_filter = ["pool", "service", "cancelled_at"]
    search_fields = ["service__name", "reason"]
    date_hierarchy = "starts_at"
