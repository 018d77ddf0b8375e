"""Helpers of the service owners' page tests: times, form data, builders, page parsing."""

from __future__ import annotations

import datetime as dt
import re

from fleet import services
from fleet.models import CapacityReservation, OptOutWindow
from opsplanner.models import Event

NOW = dt.datetime(2031, 3, 10, 12, 0, tzinfo=dt.UTC)


def local(moment: dt.datetime) -> str:
    """How a datetime-local input sends a time."""
    return moment.strftime("%Y-%m-%dT%H:%M")


def hours(n: float) -> dt.datetime:
    return NOW + dt.timedelta(hours=n)


def window_data(starts: float = 2, ends: float = 6, reason: str = "quarterly training run") -> dict[str, str]:
    return {"starts_at": local(hours(starts)), "ends_at": local(hours(ends)), "reason": reason}


def make_window(service, starts: float = 2, ends: float = 6, reason: str = "big run") -> OptOutWindow:
    return services.optout_window_create(service=service, starts_at=hours(starts), ends_at=hours(ends), reason=reason)


def make_reservation(service, pool, hosts: int = 2, starts: float = 2, ends: float = 6) -> CapacityReservation:
    return services.reservation_create(
        service=service,
        pool=pool,
        min_hosts_in_service=hosts,
        starts_at=hours(starts),
        ends_at=hours(ends),
        reason="launch",
    )


def field_block(page: str, name: str) -> str:
    """The markup of one form field: its label, input, help and errors."""
    # Up to the next field (not the field's own errors block, `field-errors`) or the form's end.
    block = rf'<div class="field[^"]*" data-field="{name}">(.*?)(?=<div class="field[ "]|</form>)'
    match = re.search(block, page, re.S)
    assert match, f"no field {name} on the page"
    return match.group(1)


def counts() -> tuple[int, int, int]:
    return OptOutWindow.objects.count(), CapacityReservation.objects.count(), Event.objects.count()
