"""Service owners' forms. They only parse what was typed; the services in fleet.services.owners
decide (end after start, not over, fits the pool, whose service), and their refusals are shown
next to the fields they are about."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Count, Exists, OuterRef
from django.utils import timezone

from fleet.models import CapacityReservation, OptOutWindow, Pool, Service, ServicePlacement
from fleet.services.owners import (
    optout_window_cancel,
    optout_window_create,
    optout_window_update,
    reservation_cancel,
    reservation_create,
    reservation_update,
)
from opsplanner.events import Actor

T = TypeVar("T")

DATETIME_LOCAL = "%Y-%m-%dT%H:%M"
REASON_MAX = 500


class UTCDateTimeField(forms.DateTimeField):
    """A `datetime-local` input read and shown in UTC, whatever the active time zone is."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local"}, format=DATETIME_LOCAL)

    def to_python(self, value: Any) -> dt.datetime | None:
        with timezone.override(dt.UTC):
            return super().to_python(value)

    def prepare_value(self, value: Any) -> Any:
        with timezone.override(dt.UTC):
            return super().prepare_value(value)


def _reason_field(label: str, help_text: str) -> forms.CharField:
    return forms.CharField(
        label=label,
        max_length=REASON_MAX,
        strip=True,
        help_text=help_text,
        error_messages={"required": "Say why: the reason is shown to operators and in the event log."},
        widget=forms.TextInput(attrs={"size": 60}),
    )


class ServiceWriteForm(forms.Form):
    """A form whose `save` calls one service; that service's ValidationError lands on the fields."""

    def call_service(self, write: Callable[[], T]) -> T | None:
        """Run `write`; on a ValidationError put its messages on the form and return None."""
        try:
            return write()
        except ValidationError as error:
            self.add_service_errors(error)
            return None

    def add_service_errors(self, error: ValidationError) -> None:
        if not hasattr(error, "error_dict"):
            self.add_error(None, error.messages)
            return
        for field, messages in error.message_dict.items():
            # A message about something the form does not ask for (the service, the pool…) goes on top.
            self.add_error(field if field in self.fields else None, messages)


class OptOutWindowForm(ServiceWriteForm):
    starts_at = UTCDateTimeField(label="Starts (UTC)")
    ends_at = UTCDateTimeField(label="Ends (UTC)")
    reason = _reason_field("Reason", "Why trains should avoid the service's hosts then.")

    @classmethod
    def for_window(cls, window: OptOutWindow, data: Any = None) -> OptOutWindowForm:
        return cls(data, initial={"starts_at": window.starts_at, "ends_at": window.ends_at, "reason": window.reason})

    def create(self, *, service: Service, actor: Actor) -> OptOutWindow | None:
        return self.call_service(lambda: optout_window_create(service=service, actor=actor, **self.cleaned_data))

    def update(self, *, window: OptOutWindow, actor: Actor) -> OptOutWindow | None:
        return self.call_service(lambda: optout_window_update(window_id=window.pk, actor=actor, **self.cleaned_data))


class PoolChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Pool) -> str:
        return f"{obj.name} ({obj.n_hosts} hosts)"  # type: ignore[attr-defined]


class ReservationForm(ServiceWriteForm):
    pool = PoolChoiceField(
        queryset=Pool.objects.none(),
        empty_label=None,
        help_text="Pools where the service runs come first.",
        error_messages={"invalid_choice": "There is no such pool; pick one from the list."},
    )
    min_hosts_in_service = forms.IntegerField(
        label="Hosts kept in service",
        min_value=1,
        max_value=10_000_000,
        help_text="At least this many hosts of the pool stay in service during the window.",
    )
    starts_at = UTCDateTimeField(label="Starts (UTC)")
    ends_at = UTCDateTimeField(label="Ends (UTC)")
    reason = _reason_field("Reason", "Why the service needs this capacity then.")

    def __init__(self, *args: Any, service: Service, editing: CapacityReservation | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if editing is not None:
            # The pool is fixed once reserved: a reservation elsewhere is a new one.
            del self.fields["pool"]
            return
        runs_service = ServicePlacement.objects.filter(service=service, host__pool=OuterRef("pk"))
        field: PoolChoiceField = self.fields["pool"]  # type: ignore[assignment]
        field.queryset = Pool.objects.annotate(n_hosts=Count("hosts"), runs_service=Exists(runs_service)).order_by(
            "-runs_service", "name"
        )

    @classmethod
    def for_reservation(cls, reservation: CapacityReservation, data: Any = None) -> ReservationForm:
        initial = {
            "min_hosts_in_service": reservation.min_hosts_in_service,
            "starts_at": reservation.starts_at,
            "ends_at": reservation.ends_at,
            "reason": reservation.reason,
        }
        return cls(data, initial=initial, service=reservation.service, editing=reservation)

    def create(self, *, service: Service, actor: Actor) -> CapacityReservation | None:
        return self.call_service(lambda: reservation_create(service=service, actor=actor, **self.cleaned_data))

    def update(self, *, reservation: CapacityReservation, actor: Actor) -> CapacityReservation | None:
        return self.call_service(
            lambda: reservation_update(reservation_id=reservation.pk, actor=actor, **self.cleaned_data)
        )


class CancelForm(forms.Form):
    reason = _reason_field("Why cancel?", "Recorded in the event log.")

    def cancel_window(self, *, window: OptOutWindow, actor: Actor) -> bool:
        if optout_window_cancel(window_id=window.pk, reason=self.cleaned_data["reason"], actor=actor):
            return True
        self.add_error(None, f"Opt-out window #{window.pk} was already cancelled.")
        return False

    def cancel_reservation(self, *, reservation: CapacityReservation, actor: Actor) -> bool:
        if reservation_cancel(reservation_id=reservation.pk, reason=self.cleaned_data["reason"], actor=actor):
            return True
        self.add_error(None, f"Capacity reservation #{reservation.pk} was already cancelled.")
        return False
