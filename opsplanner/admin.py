"""The event log is read-only in the admin: the audit trail is never edited. Orchestration state is
read-only here (its services guard the transitions); inventory rows written here go through
fleet.services.audit, so every add, change and delete leaves an event."""

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import Model, QuerySet
from django.forms import BaseInlineFormSet, BaseModelForm
from django.http import HttpRequest

from fleet.services.audit import inventory_record_delete, inventory_record_save
from opsplanner.models import (
    AdvisorRun,
    Approval,
    Event,
    HostTask,
    Lease,
    Operation,
    SimulatorProfile,
    WorkerHeartbeat,
    WorkItem,
)


class AuditedAdmin(admin.ModelAdmin):
    """Adds, changes and deletes through inventory_record_save / inventory_record_delete: validated,
    in the admin's transaction (changeform_view and delete_view are atomic), each with its event
    naming the changed fields. Many-to-many fields are set by the service, inline rows one by one."""

    def save_model(self, request: HttpRequest, obj: Model, form: BaseModelForm, change: bool) -> None:
        m2m = {
            field.name: form.cleaned_data[field.name] for field in obj._meta.many_to_many if field.name in form.fields
        }
        inventory_record_save(obj=obj, actor=request.user, fields=form.fields, m2m=m2m)

    def save_related(self, request: HttpRequest, form: BaseModelForm, formsets: Any, change: bool) -> None:
        for formset in formsets:  # no form.save_m2m(): save_model set the many-to-many fields
            self.save_formset(request, form, formset, change=change)

    def save_formset(self, request: HttpRequest, form: BaseModelForm, formset: BaseInlineFormSet, change: bool) -> None:
        instances = formset.save(commit=False)
        fields = {*formset.form.base_fields, formset.fk.name}
        for obj in formset.deleted_objects:
            inventory_record_delete(obj=obj, actor=request.user)
        for obj in instances:
            inventory_record_save(obj=obj, actor=request.user, fields=fields)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, Any, set, list]:
        """A row that history still refers to (PROTECT) is refused for that reason, not for a missing
        permission: the rows that hold it are read-only here by design."""
        deleted, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, model_count, set() if protected else perms_needed, protected

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        inventory_record_delete(obj=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        with transaction.atomic():
            for obj in queryset:
                inventory_record_delete(obj=obj, actor=request.user)


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "kind", "actor", "subject_type", "subject_id", "pool_id", "host_id", "reason"]
    list_filter = ["kind", "subject_type"]
    search_fields = ["kind", "actor", "reason"]
    date_hierarchy = "created_at"
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Event | None = None) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Orchestration state changes only through the services (guarded, with events)."""

    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    """Written by the workers themselves."""

    list_display = ["worker", "last_seen_at", "pid"]


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "kind",
        "component_version",
        "scope",
        "priority",
        "source",
        "state",
        "requester",
        "created_at",
    ]
    list_filter = ["state", "kind", "source"]
    search_fields = ["scope", "reason", "requester"]
    list_select_related = ["component_version__component"]


@admin.register(HostTask)
class HostTaskAdmin(ReadOnlyAdmin):
    list_display = ["id", "operation", "host", "state", "waiting_code", "waiting_reason", "failure_reason"]
    list_filter = ["state", "waiting_code"]
    search_fields = ["host__hostname", "waiting_reason", "failure_reason"]
    list_select_related = ["operation", "host"]


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["id", "host", "host_task", "operation_id", "active", "acquired_at", "released_at"]
    list_filter = ["active"]
    search_fields = ["host__hostname"]
    list_select_related = ["host"]


@admin.register(WorkItem)
class WorkItemAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "verify_class", "host", "state", "adapter", "claimed_by", "attempts", "created_at"]
    list_filter = ["state", "kind", "adapter"]
    search_fields = ["host__hostname", "claimed_by", "outcome_reason"]
    list_select_related = ["host"]


@admin.register(SimulatorProfile)
class SimulatorProfileAdmin(AuditedAdmin):
    list_display = ["__str__", "drain_seconds", "execute_seconds", "verify_seconds", "execute_failure_rate"]


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """Decisions are taken through the approvals service (two-person rule), never edited here."""

    list_display = ("id", "kind", "state", "requester", "decider", "reason", "created_at", "expires_at")
    list_filter = ("kind", "state")
    search_fields = ("requester", "decider", "reason")


@admin.register(AdvisorRun)
class AdvisorRunAdmin(ReadOnlyAdmin):
    """Runs are queued and finished by the advisor service (simulation/advisor_runs.py)."""

    list_display = ("id", "state", "requester", "created_at", "started_at", "finished_at", "failure_reason")
    list_filter = ("state",)
    search_fields = ("requester", "failure_reason")
