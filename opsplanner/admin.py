"""The event log is read-only in the admin: the audit trail is never edited."""

from django.contrib import admin
from django.http import HttpRequest

from opsplanner.models import Event, WorkerHeartbeat


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
