"""Forms of the trains pages. They check the shape of the input; the services decide the rest and
their refusals are shown next to the field they are about."""

from __future__ import annotations

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from fleet.models import Component, ComponentVersion, Pool
from fleet.versions import MAX_VERSION_LENGTH
from opsplanner.scopes import MAX_SCOPE_LENGTH

MAX_VISIT_ESTIMATE_S = 7 * 24 * 3600
MAX_DOMAINS_AT_ONCE = 100  # Train.visit_concurrency's bound


class EmergencyTrainForm(forms.Form):
    pool = forms.ModelChoiceField(
        queryset=Pool.objects.order_by("name"),
        to_field_name="name",
        empty_label="Choose a pool",
        error_messages={"invalid_choice": "There is no such pool (any more); choose one from the list."},
    )
    component = forms.CharField(
        max_length=63,
        help_text="The component to install, by name, e.g. nic-firmware.",
        widget=forms.TextInput(attrs={"list": "emergency-components", "autocomplete": "off"}),
    )
    version = forms.CharField(
        max_length=MAX_VERSION_LENGTH,
        help_text="A version of that component from the catalogue.",
        widget=forms.TextInput(attrs={"list": "emergency-versions", "autocomplete": "off"}),
    )
    scope = forms.CharField(
        max_length=MAX_SCOPE_LENGTH,
        required=False,
        help_text="Empty for the whole pool, or e.g. 'hosts running nic-firmware below 22.4', "
        "'domain POOL/DOMAIN', 'hosts: a, b', '10% of pool POOL'.",
    )
    domains_at_once = forms.IntegerField(
        min_value=1,
        max_value=MAX_DOMAINS_AT_ONCE,
        initial=1,
        help_text="Domains visited at the same time; never below the pool's hard floor.",
    )
    visit_estimate_s = forms.IntegerField(
        label="Visit estimate (seconds)",
        min_value=1,
        max_value=MAX_VISIT_ESTIMATE_S,
        initial=1800,
        help_text="How long one domain's visit is expected to take, for the forecast.",
    )
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why this cannot wait for the regular train (e.g. the CVE); the approver reads it.",
    )

    # Service field names shown next to another field of this form.
    SERVICE_FIELDS = {
        "component_version": "version",
        "visit_concurrency": "domains_at_once",
        "cycle_slo_s": "visit_estimate_s",
    }

    def clean_component(self) -> str:
        name = self.cleaned_data["component"].strip()
        if not Component.objects.filter(name=name).exists():
            raise ValidationError(f"There is no component named {name!r} in the catalogue.", code="unknown")
        return name

    def clean_version(self) -> str:
        return self.cleaned_data["version"].strip()

    def add_service_error(self, error: ValidationError) -> None:
        """Put a service's refusal next to the field it is about; anything else above the form."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for key, errors in error.error_dict.items():
            field = self.SERVICE_FIELDS.get(key, key)
            if field in self.fields:
                self.add_error(field, errors)
            elif key == NON_FIELD_ERRORS:
                self.add_error(None, errors)
            else:
                label = key.replace("_", " ")
                self.add_error(None, [f"{label}: {message}" for item in errors for message in item.messages])

    @staticmethod
    def catalogue() -> dict[str, list[object]]:
        """Suggestions for the component and version inputs (versions not withdrawn)."""
        versions = (
            ComponentVersion.objects.filter(withdrawn_at__isnull=True)
            .select_related("component")
            .order_by("component__name", "sort_key")[:500]
        )
        return {
            "components": list(Component.objects.order_by("name").values_list("name", flat=True)),
            "versions": list(versions),
        }
