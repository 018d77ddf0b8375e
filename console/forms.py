"""Forms of the operations pages. They check the shape of the input (as the API's OperationIntent
does); the services decide the rest, and their refusals are shown next to the field they are about."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db.models import Exists, OuterRef, QuerySet
from django.urls import reverse_lazy

from console.filters import OperationFilter
from fleet.models import Pool
from fleet.versions import MAX_VERSION_LENGTH
from opsplanner.models import MAX_PRIORITY, OPERATOR_KINDS, HostTask, Operation, OperationKind
from opsplanner.scopes import MAX_SCOPE_LENGTH

PREVIEW_URL = reverse_lazy("operation-preview")
AD_HOC_KINDS = [(value, label) for value, label in OperationKind.choices if value in OPERATOR_KINDS]
DRAIN_CHOICES = [("", "as the kind needs (upgrades: as the component needs)"), ("yes", "drain"), ("no", "no drain")]
DRAIN_VALUES = {"": None, "yes": True, "no": False}


class ServiceErrorsMixin:
    """Put a service's refusal next to the field it is about; anything else above the form."""

    SERVICE_FIELDS: dict[str, str] = {}

    def add_service_error(self, error: ValidationError) -> None:
        form: Any = self
        if not hasattr(error, "error_dict"):
            form.add_error(None, error)
            return
        for key, errors in error.error_dict.items():
            field = self.SERVICE_FIELDS.get(key, key)
            if field in form.fields:
                form.add_error(field, errors)
            elif key == NON_FIELD_ERRORS:
                form.add_error(None, errors)
            else:
                label = key.replace("_", " ")
                form.add_error(None, [f"{label}: {message}" for item in errors for message in item.messages])


class OperationSubmitForm(ServiceErrorsMixin, forms.Form):
    kind = forms.ChoiceField(choices=AD_HOC_KINDS, initial=OperationKind.REBOOT)
    scope = forms.CharField(
        max_length=MAX_SCOPE_LENGTH,
        help_text="e.g. 'pool P', '10% of pool P', 'domain P/D', 'hosts: a, b', 'hosts running C below V in pool P'.",
        widget=forms.TextInput(
            attrs={
                "autocomplete": "off",
                "size": 60,
                "hx-get": PREVIEW_URL,
                "hx-trigger": "input changed delay:400ms, load",
                "hx-target": "#scope-preview",
                "hx-include": "[name='kind'], [name='needs_drain']",
                "hx-sync": "this:replace",
            }
        ),
    )
    component = forms.CharField(
        max_length=63, required=False, help_text="For an upgrade: the component, e.g. gpu-driver."
    )
    version = forms.CharField(
        max_length=MAX_VERSION_LENGTH, required=False, help_text="For an upgrade: its target version."
    )
    priority = forms.IntegerField(
        min_value=0, max_value=MAX_PRIORITY, initial=100, help_text="Higher goes first; then older first."
    )
    needs_drain = forms.ChoiceField(
        choices=DRAIN_CHOICES,
        required=False,
        label="Drain",
        widget=forms.Select(
            attrs={  # the preview's headroom depends on it: ask again when it changes
                "hx-get": PREVIEW_URL,
                "hx-trigger": "change",
                "hx-target": "#scope-preview",
                "hx-include": "[name='scope'], [name='kind']",
            }
        ),
    )
    gang = forms.BooleanField(
        required=False, help_text="Take every host at once or none (one pool, within its planned buffer)."
    )
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 3}), help_text="Why it is needed.")

    SERVICE_FIELDS = {"component_version": "version"}

    def clean_scope(self) -> str:
        return self.cleaned_data["scope"].strip()

    def clean_component(self) -> str:
        return self.cleaned_data["component"].strip()

    def clean_version(self) -> str:
        return self.cleaned_data["version"].strip()

    def clean_needs_drain(self) -> bool | None:
        return DRAIN_VALUES[self.cleaned_data.get("needs_drain") or ""]


class ScopePreviewForm(forms.Form):
    """The preview's query: the scope as typed so far, and what the operation would do."""

    scope = forms.CharField(max_length=MAX_SCOPE_LENGTH, required=False)
    kind = forms.ChoiceField(choices=AD_HOC_KINDS, required=False)
    needs_drain = forms.ChoiceField(choices=DRAIN_CHOICES, required=False)

    def drains(self) -> bool:
        """Whether the hosts would be drained (and so count against the planned buffer)."""
        return DRAIN_VALUES[self.cleaned_data.get("needs_drain") or ""] is not False


class ReasonForm(ServiceErrorsMixin, forms.Form):
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2}))


class OperationListFilter(OperationFilter):
    """The operations page's filters: the API's, plus the pool an operation has hosts in. A value
    that is not one of the choices is refused with a message, never ignored."""

    pool = django_filters.ModelChoiceFilter(
        queryset=Pool.objects.order_by("name"), to_field_name="name", method="filter_pool", label="Pool"
    )

    class Meta(OperationFilter.Meta):
        model = Operation
        fields = ["state", "kind", "source", "pool"]

    def filter_pool(self, queryset: QuerySet[Operation], name: str, value: Pool) -> QuerySet[Operation]:
        return queryset.filter(Exists(HostTask.objects.filter(operation_id=OuterRef("pk"), pool_id=value.pk)))
