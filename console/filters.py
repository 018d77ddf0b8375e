"""FilterSets for operations, tasks, work items, approvals and events (API and UI)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q, QuerySet

from opsplanner.models import (
    Approval,
    ApprovalKind,
    ApprovalState,
    Event,
    HostTask,
    Operation,
    OperationKind,
    OperationSource,
    OperationState,
    TaskState,
    WaitingCode,
    WorkItem,
    WorkKind,
    WorkState,
)


class UtcIsoDateTimeField(django_filters.fields.IsoDateTimeField):
    """An ISO time converted to UTC: PostgreSQL refuses offsets beyond ±15:59 that Python accepts."""

    def to_python(self, value: Any) -> dt.datetime | None:
        parsed = super().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(dt.UTC)
        except OverflowError:  # e.g. 0001-01-01T00:00+01:00
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})


class RawValueInput(forms.TextInput):
    """Hands the field the value as sent: django-filter's boolean widgets turn "maybe" into None,
    which silently drops the filter instead of refusing it."""

    def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
        return data.get(name)


class StrictBooleanField(forms.NullBooleanField):
    widget = RawValueInput

    # NullBooleanField's to_python adds None to BooleanField's bool; django-stubs ignores that override too.
    def to_python(self, value: Any) -> bool | None:  # type: ignore[override]
        if value is None or isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word == "":
            return None
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ValidationError("Enter true or false.", code="invalid")

    def validate(self, value: bool | None) -> None:
        pass


class StrictBooleanFilter(django_filters.BooleanFilter):
    """true/false (also 1/0, yes/no, on/off, any case); anything else is refused, not ignored."""

    field_class = StrictBooleanField


class StrictFilterSet(django_filters.FilterSet):
    """The base of every FilterSet: boolean model fields listed in Meta.fields filter strictly too."""

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        models.BooleanField: {"filter_class": StrictBooleanFilter},
        models.NullBooleanField: {"filter_class": StrictBooleanFilter},
    }


class OperationFilter(StrictFilterSet):
    state = django_filters.MultipleChoiceFilter(choices=OperationState.choices)
    kind = django_filters.MultipleChoiceFilter(choices=OperationKind.choices)
    source = django_filters.MultipleChoiceFilter(choices=OperationSource.choices)

    class Meta:
        model = Operation
        fields = ["state", "kind", "source"]


class HostTaskFilter(StrictFilterSet):
    state = django_filters.MultipleChoiceFilter(choices=TaskState.choices)
    waiting_code = django_filters.MultipleChoiceFilter(choices=WaitingCode.choices)
    operation = django_filters.NumberFilter(field_name="operation_id")
    host = django_filters.NumberFilter(field_name="host_id")
    pool = django_filters.NumberFilter(field_name="pool_id")

    class Meta:
        model = HostTask
        fields = ["state", "waiting_code", "operation", "host", "pool"]


class WorkItemFilter(StrictFilterSet):
    state = django_filters.MultipleChoiceFilter(choices=WorkState.choices)
    kind = django_filters.MultipleChoiceFilter(choices=WorkKind.choices)
    pool = django_filters.NumberFilter(field_name="pool_id")
    host = django_filters.NumberFilter(field_name="host_id")

    class Meta:
        model = WorkItem
        fields = ["state", "kind", "pool", "host", "adapter"]


class ApprovalFilter(StrictFilterSet):
    state = django_filters.MultipleChoiceFilter(choices=ApprovalState.choices)
    kind = django_filters.MultipleChoiceFilter(choices=ApprovalKind.choices)

    class Meta:
        model = Approval
        fields = ["state", "kind"]


class EventFilter(StrictFilterSet):
    """Events by host, pool, operation (its own events and its tasks'), train (its own, its cycles'
    and its visits'), kind (exact, or a prefix ending in '.'), and time range. All index probes."""

    host = django_filters.NumberFilter(field_name="host_id")
    pool = django_filters.NumberFilter(field_name="pool_id")
    operation = django_filters.NumberFilter(method="filter_operation")
    train = django_filters.NumberFilter(method="filter_train")
    kind = django_filters.CharFilter(method="filter_kind", help_text="e.g. task.state_changed, or task. for all")
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    subject_type = django_filters.CharFilter()
    subject_id = django_filters.NumberFilter()

    class Meta:
        model = Event
        fields = ["host", "pool", "operation", "train", "kind", "since", "until", "subject_type", "subject_id"]

    def filter_operation(self, queryset: QuerySet, name: str, value: int) -> QuerySet:
        tasks = HostTask.objects.filter(operation_id=value).values("id")
        return queryset.filter(
            Q(subject_type="opsplanner.operation", subject_id=value)
            | Q(subject_type="opsplanner.hosttask", subject_id__in=tasks)
        )

    def filter_train(self, queryset: QuerySet, name: str, value: int) -> QuerySet:
        from trains.models import Cycle, Visit

        return queryset.filter(
            Q(subject_type="trains.train", subject_id=value)
            | Q(subject_type="trains.visit", subject_id__in=Visit.objects.filter(train_id=value).values("id"))
            | Q(subject_type="trains.cycle", subject_id__in=Cycle.objects.filter(train_id=value).values("id"))
        )

    def filter_kind(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        if value.endswith("."):
            return queryset.filter(kind__startswith=value)
        return queryset.filter(kind=value)
