"""The event log is read-only in the admin: the audit trail is never edited."""

from django.contrib import admin
from django.http import HttpRequest

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


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ["worker", "last_seen_at", "pid"]
    readonly_fields = ["worker", "last_seen_at", "pid"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Orchestration state changes only through the services (guarded, with events)."""

    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False


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
class SimulatorProfileAdmin(admin.ModelAdmin):
    list_display = ["__str__", "drain_seconds", "execute_seconds", "verify_seconds", "execute_failure_rate"]


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """Decisions are taken through the approvals service (two-person rule), never edited here."""

    list_display = ("id", "kind", "state", "requester", "decider", "reason", "created_at", "expires_at")
    list_filter = ("kind", "state")
    search_fields = ("requester", "decider", "reason")


@admin.register(AdvisorRun)
class AdvisorRunAdmin(ReadOnlyAdmin):
    """Runs are queued and finished by the advisor service (opsplanner/services/advisor_runs.py)."""

    list_display = ("id", "state", "requester", "created_at", "started_at", "finished_at", "failure_reason")
    list_filter = ("state",)
    search_fields = ("requester", "failure_reason")
