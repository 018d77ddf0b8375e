"""FilterSets for fleet lists, shared by the API and the UI pages."""

from __future__ import annotations

import django_filters
from django.db.models import Q, QuerySet

from console.filters import StrictBooleanFilter, StrictFilterSet
from fleet.models import CapacityReservation, Host, HostState, MaintenanceDomain, OptOutWindow
from opsplanner import clock


class HostFilter(StrictFilterSet):
    pool = django_filters.NumberFilter(field_name="pool_id", help_text="pool id")
    pool_name = django_filters.CharFilter(field_name="pool__name", help_text="pool name")
    domain = django_filters.NumberFilter(field_name="domain_id", help_text="domain id")
    state = django_filters.MultipleChoiceFilter(choices=HostState.choices)
    hostname = django_filters.CharFilter(field_name="hostname", lookup_expr="startswith", help_text="prefix")
    drift = StrictBooleanFilter(
        method="filter_drift", help_text="hosts whose last version report differed from what OpsPlanner believed"
    )

    class Meta:
        model = Host
        fields = ["pool", "pool_name", "domain", "state", "hostname", "drift"]

    def filter_drift(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        from fleet.selectors.inventory import drift_exists

        return queryset.filter(drift_exists()) if value else queryset.exclude(drift_exists())


class DomainFilter(StrictFilterSet):
    pool = django_filters.NumberFilter(field_name="pool_id")

    class Meta:
        model = MaintenanceDomain
        fields = ["pool", "kind"]


class _WindowFilter(StrictFilterSet):
    service = django_filters.NumberFilter(field_name="service_id")
    active = StrictBooleanFilter(method="filter_active", help_text="open now (not cancelled)")
    current = StrictBooleanFilter(method="filter_current", help_text="not cancelled and not over")

    def filter_active(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        now = clock.now()
        active = Q(cancelled_at__isnull=True, starts_at__lte=now, ends_at__gt=now)
        return queryset.filter(active) if value else queryset.exclude(active)

    def filter_current(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        current = Q(cancelled_at__isnull=True, ends_at__gt=clock.now())
        return queryset.filter(current) if value else queryset.exclude(current)


class OptOutWindowFilter(_WindowFilter):
    class Meta:
        model = OptOutWindow
        fields = ["service", "active", "current"]


class ReservationFilter(_WindowFilter):
    pool = django_filters.NumberFilter(field_name="pool_id")

    class Meta:
        model = CapacityReservation
        fields = ["service", "pool", "active", "current"]
