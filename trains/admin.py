"""Admin: trains and upgrades are read here; changes go through the services (API and UI)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from opsplanner.admin import ReadOnlyAdmin
from trains.models import Cycle, Train, TrainStop, Upgrade, UpgradePhase, Visit


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class TrainStopInline(ReadOnlyInline):
    model = TrainStop


@admin.register(Train)
class TrainAdmin(ReadOnlyAdmin):
    list_display = ("name", "pool", "state", "state_reason", "emergency", "visit_concurrency", "cycle_slo_s")
    list_filter = ("state", "emergency", "pool")
    search_fields = ("name", "pool__name")
    inlines = [TrainStopInline]


@admin.register(Cycle)
class CycleAdmin(ReadOnlyAdmin):
    list_display = ("train", "number", "started_at", "deadline_at", "forecast_end_at", "ended_at", "miss_cause")
    list_filter = ("train",)


@admin.register(Visit)
class VisitAdmin(ReadOnlyAdmin):
    list_display = ("train", "cycle", "domain", "position", "state", "started_at", "ended_at", "skips", "outcome")
    list_filter = ("state", "train")
    search_fields = ("domain__name",)


class UpgradePhaseInline(ReadOnlyInline):
    model = UpgradePhase


@admin.register(Upgrade)
class UpgradeAdmin(ReadOnlyAdmin):
    list_display = ("id", "component_version", "pool", "state", "current_phase", "emergency", "created_at")
    list_filter = ("state", "emergency", "pool")
    search_fields = ("component_version__component__name", "component_version__version", "scope")
    inlines = [UpgradePhaseInline]
