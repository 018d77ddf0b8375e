"""Opt-out windows in force now: one read and one wording for everything that must respect them:
admission (by host), the train tick (by domain) and the scope preview."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from fleet.models import OptOutWindow, ServicePlacement
from opsplanner.prepared import PreparedQuery

_ACTIVE_WINDOWS = PreparedQuery(
    lambda *, now: (
        OptOutWindow.objects.filter(cancelled_at__isnull=True, starts_at__lte=now, ends_at__gt=now)
        .order_by("ends_at")
        .values_list("id", "service_id", "service__name", "ends_at")
    ),
    now=dt.datetime,
)


def optout_message(*, window_id: int, service: str, ends_at: dt.datetime) -> str:
    return f"opt-out window #{window_id} of service {service} until {ends_at:%Y-%m-%d %H:%M} UTC"


def optouts_by_host(*, now: dt.datetime, host_ids: Iterable[int]) -> dict[int, str]:
    """{host_id: reason} for the hosts running a service with an opt-out window in force (the one
    ending last when several are)."""
    return _optouts(now=now, key="host_id", where={"host_id__any": list(host_ids)})


def optouts_by_domain(*, now: dt.datetime, domain_ids: Iterable[int]) -> dict[int, str]:
    """{domain_id: reason} for the domains where some host runs a service with an opt-out window in force."""
    return _optouts(now=now, key="host__domain_id", where={"host__domain_id__in": list(domain_ids)})


def _optouts(*, now: dt.datetime, key: str, where: dict[str, object]) -> dict[int, str]:
    # Windows come ordered by their end, so each service keeps the one that ends last; each host or
    # domain is named after the window that holds it longest (until when it cannot be drained).
    windows = {
        service_id: (window_id, name, ends) for window_id, service_id, name, ends in _ACTIVE_WINDOWS.rows(now=now)
    }
    if not windows:
        return {}
    holding: dict[int, tuple[int, str, dt.datetime]] = {}
    placements = ServicePlacement.objects.filter(service_id__in=windows, **where).values_list(key, "service_id")
    for subject_id, service_id in placements:
        window = windows[service_id]
        if subject_id not in holding or window[2] > holding[subject_id][2]:
            holding[subject_id] = window
    return {
        subject_id: optout_message(window_id=window_id, service=name, ends_at=ends)
        for subject_id, (window_id, name, ends) in holding.items()
    }
