"""Forms of the trains pages. They check the shape of the input; the services decide the rest and
their refusals are shown next to the field they are about."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction

from fleet.models import Component, ComponentVersion, Pool
from fleet.versions import MAX_VERSION_LENGTH
from opsplanner.scopes import MAX_SCOPE_LENGTH
from trains.limits import (
    FAILURE_RATE_DECIMALS,
    MAX_AUTO_RESUME_S,
    MAX_COUNT,
    MAX_CYCLE_SLO_S,
    MAX_DOMAINS_AT_ONCE,
    MAX_SOAK_S,
    MAX_TRAIN_PRIORITY,
    MAX_UPGRADE_PRIORITY,
    MAX_VISIT_ESTIMATE_S,
)
from trains.models import Pace
from trains.models.trains import DEFAULT_TRAIN_PRIORITY
from trains.models.upgrades import DEFAULT_UPGRADE_PRIORITY, PhaseSelection
from trains.services.offboarding import upgrade_offboard
from trains.services.replan import REPLAN_FIELDS, upgrade_replan
from trains.services.trains import train_create, train_update
from trains.services.upgrades import upgrade_create

T = TypeVar("T")


class ServiceForm(forms.Form):
    """A form whose write is one service call; the service's refusal lands next to its field."""

    # Service field names shown next to another field of this form.
    SERVICE_FIELDS: ClassVar[dict[str, str]] = {}

    def call_service(self, write: Callable[[], T]) -> T | None:
        """Run `write`; on a ValidationError (nothing was written) show it and return None."""
        try:
            return write()
        except ValidationError as error:
            self.add_service_error(error)
            return None

    def add_service_error(self, error: ValidationError) -> None:
        """Put a service's refusal next to the field it is about; anything else above the form."""
        if not hasattr(error, "error_dict"):
            self.add_error(None, error)
            return
        for key, errors in error.error_dict.items():
            field = self.SERVICE_FIELDS.get(key, key)
            if field in self.fields:
                self.add_error(field, errors)
            elif key == NON_FIELD_ERRORS or field == NON_FIELD_ERRORS:
                self.add_error(None, errors)
            else:
                label = key.replace("_", " ")
                self.add_error(None, [f"{label}: {message}" for item in errors for message in item.messages])


class EmergencyTrainForm(ServiceForm):
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

    SERVICE_FIELDS: ClassVar[dict[str, str]] = {
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


# --- trains -----------------------------------------------------------------------------------------
MAX_DOMAIN_ORDER_LENGTH = 64_000
MAX_DOMAIN_NAME = 63


def _seconds(label: str, *, maximum: int, help_text: str, initial: int | None = None, required: bool = True) -> Any:
    return forms.IntegerField(
        label=label, min_value=1, max_value=maximum, initial=initial, required=required, help_text=help_text
    )


def _cycle_slo_field() -> forms.IntegerField:
    return _seconds(
        "Cycle-time SLO (seconds)",
        maximum=MAX_CYCLE_SLO_S,
        initial=7 * 24 * 3600,
        help_text="Every domain is visited within this time (604800 s is 7 days); it must fit the visits.",
    )


def _concurrency_field() -> forms.IntegerField:
    return forms.IntegerField(
        label="Visit concurrency",
        min_value=1,
        max_value=MAX_DOMAINS_AT_ONCE,
        initial=1,
        help_text="Domains visited at the same time; 1 keeps all capacity but one domain up.",
    )


def _pace_field() -> forms.ChoiceField:
    return forms.ChoiceField(
        label="Pace",
        choices=Pace.choices,
        initial=Pace.DOMAIN,
        required=False,
        help_text="Domain-synchronous: the next domain starts when the visit's slowest host is back (slow hosts "
        "waste capacity). Sliding: as each host comes back a host of the next domain starts, never more than a "
        "visit's worth out (the blast radius spreads over more domains). Not given: as it is (a new train: domain).",
    )


def _domain_order_field(*, required: bool) -> forms.CharField:
    return forms.CharField(
        label="Domain order",
        required=required,
        max_length=MAX_DOMAIN_ORDER_LENGTH,
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "rack-0001\nrack-0002"}),
        help_text="Domain names in visiting order, one a line (or separated by commas)"
        + ("." if required else "; empty for every domain with hosts, by position."),
    )


def _domain_names(text: str) -> list[str] | None:
    """The names typed in the domain order box, in order; None when it is empty."""
    names = [name for name in text.replace(",", " ").split() if name]
    too_long = [name for name in names if len(name) > MAX_DOMAIN_NAME]
    if too_long:
        raise ValidationError(f"A domain name has at most {MAX_DOMAIN_NAME} characters.", code="max_length")
    return names or None


class TrainForm(ServiceForm):
    """A regular train over a pool's domains: trains.services.trains.train_create decides."""

    pool = forms.ModelChoiceField(
        queryset=Pool.objects.order_by("name"),
        to_field_name="name",
        empty_label="Choose a pool",
        error_messages={"invalid_choice": "There is no such pool (any more); choose one from the list."},
        help_text="A pool has at most one regular train.",
    )
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and dashes, e.g. ai-train-east.")
    cycle_slo_s = _cycle_slo_field()
    visit_estimate_s = _seconds(
        "Visit estimate (seconds)",
        maximum=MAX_VISIT_ESTIMATE_S,
        initial=3600,
        help_text="How long one domain's visit is expected to take, for the SLO check and the forecast.",
    )
    visit_concurrency = _concurrency_field()
    pace = _pace_field()
    visit_overhead_s = _seconds(
        "Visit overhead (seconds)",
        maximum=MAX_VISIT_ESTIMATE_S,
        required=False,
        help_text="Drain, checks and return of one visit besides the upgrades' own work; sizes what a visit takes "
        "(empty: half the visit estimate).",
    )
    domain_order = _domain_order_field(required=False)
    priority = forms.IntegerField(
        min_value=0,
        max_value=MAX_TRAIN_PRIORITY,
        initial=DEFAULT_TRAIN_PRIORITY,
        help_text=f"Higher goes first where operations overlap (0 to {MAX_TRAIN_PRIORITY}).",
    )
    auto_resume_after_s = _seconds(
        "Auto-resume after (seconds)",
        maximum=MAX_AUTO_RESUME_S,
        required=False,
        help_text="After an autostop, resume once the buffers have recovered for this long; "
        "empty: an operator resumes it.",
    )

    def clean_domain_order(self) -> list[str] | None:
        return _domain_names(self.cleaned_data["domain_order"])

    def clean_pace(self) -> str:
        return self.cleaned_data["pace"] or Pace.DOMAIN

    def create(self, *, actor: Any) -> Any:
        return self.call_service(lambda: train_create(actor=actor, **self.cleaned_data))


class TrainEditForm(ServiceForm):
    """A live regular train's SLO, concurrency, pace and domain order: trains.services.trains.train_update."""

    cycle_slo_s = _cycle_slo_field()
    visit_concurrency = _concurrency_field()
    pace = _pace_field()
    domain_order = _domain_order_field(required=True)

    @classmethod
    def for_train(cls, train: Any, domain_order: list[str], data: Any = None) -> TrainEditForm:
        initial = {
            "cycle_slo_s": train.cycle_slo_s,
            "visit_concurrency": train.visit_concurrency,
            "pace": train.pace,
            "domain_order": "\n".join(domain_order),
        }
        return cls(data, initial=initial)

    def clean_domain_order(self) -> list[str]:
        names = _domain_names(self.cleaned_data["domain_order"])
        if names is None:
            raise ValidationError("Give at least one domain to visit.", code="required")
        return names

    def clean_pace(self) -> str | None:
        return self.cleaned_data["pace"] or None  # not given: the train keeps its pace

    def update(self, *, train_id: int, actor: Any) -> Any:
        return self.call_service(lambda: train_update(train_id=train_id, actor=actor, **self.cleaned_data))


# --- upgrades ---------------------------------------------------------------------------------------
PHASE_ROWS = 4


class PhaseRowForm(forms.Form):
    """One optional rollout phase: one domain (a canary) or a percentage of the scope."""

    name = forms.CharField(max_length=63, required=False)
    domain = forms.CharField(
        max_length=MAX_DOMAIN_NAME, required=False, widget=forms.TextInput(attrs={"list": "upgrade-domains"})
    )
    percent = forms.IntegerField(min_value=1, max_value=100, required=False)
    min_successes = forms.IntegerField(min_value=0, max_value=MAX_COUNT, required=False, initial=1)
    soak_s = forms.IntegerField(label="Soak (s)", min_value=0, max_value=MAX_SOAK_S, required=False, initial=0)
    selection = forms.ChoiceField(choices=PhaseSelection.choices, required=False, initial=PhaseSelection.FIXED)

    def __init__(self, data: Any = None, *, position: int, **kwargs: Any) -> None:
        super().__init__(data, prefix=f"phase-{position}", **kwargs)
        for name, field in self.fields.items():
            field.widget.attrs["aria-label"] = f"Phase {position + 1} {field.label or name}"

    def is_blank(self) -> bool:
        data = self.cleaned_data
        return not data.get("name") and not data.get("domain") and data.get("percent") is None

    def phase(self) -> dict[str, Any]:
        """The phase as upgrade_create takes it (only what was given)."""
        data = self.cleaned_data
        phase: dict[str, Any] = {"selection": data.get("selection") or PhaseSelection.FIXED}
        for key in ("name", "domain", "percent", "min_successes", "soak_s"):
            if data.get(key) not in ("", None):
                phase[key] = data[key]
        return phase


class UpgradeForm(ServiceForm):
    """An upgrade with its rollout phases and failure policy: trains.services.upgrades.upgrade_create."""

    pool = forms.ModelChoiceField(
        queryset=Pool.objects.order_by("name"),
        to_field_name="name",
        empty_label="Choose a pool",
        error_messages={"invalid_choice": "There is no such pool (any more); choose one from the list."},
    )
    component = forms.ModelChoiceField(
        queryset=Component.objects.order_by("name"),
        to_field_name="name",
        empty_label="Choose a component",
        error_messages={"invalid_choice": "There is no such component in the catalogue; choose one from the list."},
    )
    version = forms.ChoiceField(help_text="A version of that component from the catalogue.")
    reason = forms.CharField(
        max_length=500, widget=forms.Textarea(attrs={"rows": 2}), help_text="Why this upgrade is needed."
    )
    scope = forms.CharField(
        max_length=MAX_SCOPE_LENGTH,
        required=False,
        help_text="Empty for the whole pool, or e.g. 'hosts running bios below 2.16.0', 'domain POOL/DOMAIN'.",
    )
    max_failures = forms.IntegerField(
        min_value=0, max_value=MAX_COUNT, initial=2, help_text="Offboard when more hosts than this fail in a phase."
    )
    max_failure_rate = forms.DecimalField(
        label="Max failure rate (0 to 1)",
        min_value=0,
        max_value=1,
        max_digits=FAILURE_RATE_DECIMALS + 1,
        decimal_places=FAILURE_RATE_DECIMALS,
        required=False,
        help_text="Offboard when more than this share of a phase's finished hosts failed; empty: no rate.",
    )
    failure_rate_min_hosts = forms.IntegerField(
        min_value=1,
        max_value=MAX_COUNT,
        initial=5,
        required=False,
        help_text="The rate counts once this many of a phase's hosts have finished (empty: 5).",
    )
    multi_cycle = forms.BooleanField(
        required=False, help_text="Spread over several cycles, a bounded number of hosts per visit."
    )
    hosts_per_visit = forms.IntegerField(
        min_value=1, max_value=MAX_COUNT, required=False, help_text="The bound a multi-cycle upgrade needs."
    )
    priority = forms.IntegerField(
        min_value=0,
        max_value=MAX_UPGRADE_PRIORITY,
        initial=DEFAULT_UPGRADE_PRIORITY,
        required=False,
        help_text="Higher goes first when a visit cannot take every pending upgrade "
        f"(0 to {MAX_UPGRADE_PRIORITY}; empty: {DEFAULT_UPGRADE_PRIORITY}).",
    )
    deadline = forms.DateTimeField(
        label="Deadline (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Optional: every host by then. It goes ahead of upgrades of the same priority; an alert says "
        "what would meet it if the forecast misses it.",
    )
    duration_s = forms.IntegerField(
        label="Time per host (seconds)",
        min_value=1,
        max_value=MAX_SOAK_S,
        required=False,
        help_text="Expected time to apply it on one host; empty: the default estimate, corrected by measured visits.",
    )

    SERVICE_FIELDS: ClassVar[dict[str, str]] = {"phases": NON_FIELD_ERRORS}

    def __init__(self, data: Any = None, *, versions: list[tuple[str, list[tuple[str, str]]]]) -> None:
        super().__init__(data)
        cast(forms.ChoiceField, self.fields["version"]).choices = [("", "Choose a version"), *versions]
        self.phase_rows = [PhaseRowForm(data, position=i) for i in range(PHASE_ROWS)]

    def is_valid(self) -> bool:
        rows_valid = [row.is_valid() for row in self.phase_rows]  # every row, so each shows its errors
        return super().is_valid() and all(rows_valid)

    def phases(self) -> list[dict[str, Any]] | None:
        """The rows filled in, in order; None (one phase over the scope) when none is."""
        return [row.phase() for row in self.phase_rows if not row.is_blank()] or None

    def create(self, *, actor: Any) -> Any:
        data = dict(self.cleaned_data)
        rate = data.pop("max_failure_rate")
        return self.call_service(
            lambda: upgrade_create(
                pool=data["pool"],
                component=data["component"].name,
                version=data["version"],
                reason=data["reason"],
                scope=data["scope"],
                phases=self.phases(),
                max_failures=data["max_failures"],
                max_failure_rate=None if rate is None else float(rate),
                failure_rate_min_hosts=5 if data["failure_rate_min_hosts"] is None else data["failure_rate_min_hosts"],
                multi_cycle=data["multi_cycle"],
                hosts_per_visit=data["hosts_per_visit"],
                priority=DEFAULT_UPGRADE_PRIORITY if data["priority"] is None else data["priority"],
                deadline=data["deadline"],
                duration_s=data["duration_s"],
                actor=actor,
            )
        )


class OffboardForm(ServiceForm):
    """Take an active upgrade out of every train, as the API's offboard does."""

    reason = forms.CharField(
        label="Why offboard it?",
        max_length=500,
        error_messages={"required": "Say why: the reason is shown to operators and in the event log."},
        widget=forms.TextInput(attrs={"placeholder": "e.g. hosts fail to boot after the flash"}),
    )

    def offboard(self, *, upgrade: Any, actor: Any) -> bool:
        return bool(self.call_service(lambda: self._offboard(upgrade, actor)))

    def _offboard(self, upgrade: Any, actor: Any) -> bool:
        with transaction.atomic():  # upgrade_offboard runs in its caller's transaction
            if not upgrade_offboard(upgrade=upgrade, reason=self.cleaned_data["reason"], actor=actor):
                raise ValidationError(
                    f"Upgrade #{upgrade.pk} is not active (any more); only an active upgrade is offboarded.",
                    code="conflict",
                )
        return True


class _MinuteDateTimeField(forms.DateTimeField):
    """A time shown and posted to the minute (a datetime-local box): posted back at that precision,
    it has not changed, whatever seconds the time it showed had."""

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            shown, posted = self.to_python(initial), self.to_python(data)
        except ValidationError:
            return True
        minute = [None if t is None else t.replace(second=0, microsecond=0) for t in (shown, posted)]
        return minute[0] != minute[1]


class ReplanForm(ServiceForm):
    """An active upgrade's priority, deadline and pace, as a deadline alert advises:
    trains.services.replan.upgrade_replan decides. The form shows the current values; only what the
    operator changed is replanned."""

    upgrade: Any  # the upgrade replanned (for_upgrade)

    priority = forms.IntegerField(
        min_value=0,
        max_value=MAX_UPGRADE_PRIORITY,
        help_text=f"Higher goes first when a visit cannot take every pending upgrade (0 to {MAX_UPGRADE_PRIORITY}).",
        show_hidden_initial=True,
    )
    deadline = _MinuteDateTimeField(
        label="Deadline (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Every host by then; empty: no deadline. A new deadline is judged by the forecast at once.",
        show_hidden_initial=True,
    )
    multi_cycle = forms.BooleanField(
        required=False,
        help_text="Spread over several cycles, a bounded number of hosts per visit; off: every host of a domain "
        "per visit.",
        show_hidden_initial=True,
    )
    hosts_per_visit = forms.IntegerField(
        min_value=1,
        max_value=MAX_COUNT,
        required=False,
        help_text="The bound a multi-cycle upgrade needs; dropped when it is not multi-cycle.",
        show_hidden_initial=True,
    )

    @classmethod
    def for_upgrade(cls, upgrade: Any, data: Any = None) -> ReplanForm:
        initial = {name: getattr(upgrade, name) for name in REPLAN_FIELDS}
        form = cls(data, initial=initial)
        form.upgrade = upgrade
        return form

    def replan(self, *, actor: Any) -> Any:
        return self.call_service(lambda: upgrade_replan(upgrade_id=self.upgrade.pk, actor=actor, **self._given()))

    @property
    def changes_something(self) -> bool:
        """The operator changed a field the replan reads (a valid form only)."""
        return bool(self._given())

    def _given(self) -> dict[str, Any]:
        """Only what the operator changed on the page (each field posts the value it showed, hidden):
        what an API call changed meanwhile stays, and a deadline shown to the minute and posted back
        keeps its exact time."""
        data = {name: self.cleaned_data[name] for name in self.changed_data}
        if not self.cleaned_data["multi_cycle"]:
            data.pop("hosts_per_visit", None)  # the box may still show the old bound; the service drops it
        return data
