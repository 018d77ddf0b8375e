"""Opt-out windows in force now: one read and one wording for everything that must respect them:
admission (by host), the train tick (by domain) and the scope preview."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from fleet.models import OptOutWindow, ServicePlacement
from opsplanner.prepared import PreparedQuery


class _Window(NamedTuple):
    id: int
    service_id: int
    service: str
    starts_at: dt.datetime
    ends_at: dt.datetime


# Windows not over yet, in force or to come: one in force may be followed by another without a gap.
_WINDOWS_NOT_OVER = PreparedQuery(
    lambda *, now: (
        OptOutWindow.objects.filter(cancelled_at__isnull=True, ends_at__gt=now)
        .order_by("starts_at", "id")
        .values_list("id", "service_id", "service__name", "starts_at", "ends_at")
    ),
    now=dt.datetime,
)


def optout_message(*, window_id: int, service: str, ends_at: dt.datetime, then: _Window | None = None) -> str:
    """`then`: the last of the windows that follow without a gap, which keeps the subject held."""
    reason = f"opt-out window #{window_id} of service {service} until {ends_at:%Y-%m-%d %H:%M} UTC"
    if then is not None:
        reason += f", then window #{then.id} of service {then.service} until {then.ends_at:%Y-%m-%d %H:%M} UTC"
    return reason


def optouts_by_host(*, now: dt.datetime, host_ids: Iterable[int]) -> dict[int, str]:
    """{host_id: reason} for the hosts running a service with an opt-out window in force (the one
    ending last when several are)."""
    return _optouts(now=now, key="host_id", where={"host_id__any": list(host_ids)})


def optouts_by_domain(*, now: dt.datetime, domain_ids: Iterable[int]) -> dict[int, str]:
    """{domain_id: reason} for the domains where some host runs a service with an opt-out window in force."""
    return _optouts(now=now, key="host__domain_id", where={"host__domain_id__in": list(domain_ids)})


def _optouts(*, now: dt.datetime, key: str, where: dict[str, object]) -> dict[int, str]:
    # Each host or domain is named after the window in force that holds it longest; windows of its
    # services that start before the hold ends extend it (until when it cannot be drained).
    by_service: dict[int, list[_Window]] = defaultdict(list)
    for row in _WINDOWS_NOT_OVER.rows(now=now):
        by_service[row[1]].append(_Window(*row))
    if not any(w.starts_at <= now for windows in by_service.values() for w in windows):
        return {}
    services_of: dict[int, set[int]] = defaultdict(set)  # a domain has a service once, however many hosts
    for subject_id, service_id in ServicePlacement.objects.filter(service_id__in=by_service, **where).values_list(
        key, "service_id"
    ):
        services_of[subject_id].add(service_id)
    reasons: dict[int, str] = {}
    for subject_id, service_ids in services_of.items():
        windows = sorted((w for s in service_ids for w in by_service[s]), key=lambda w: (w.starts_at, w.id))
        in_force = [w for w in windows if w.starts_at <= now]
        if not in_force:
            continue
        holder = max(in_force, key=lambda w: w.ends_at)
        held_until, then = holder.ends_at, None
        for window in windows:  # by start: a window starting after the hold ends (a gap) frees the subject
            if window.starts_at > held_until:
                break
            if window.ends_at > held_until:
                held_until, then = window.ends_at, window
        reasons[subject_id] = optout_message(
            window_id=holder.id, service=holder.service, ends_at=holder.ends_at, then=then
        )
    return reasons
