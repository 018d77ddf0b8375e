"""Back-to-back opt-out windows: a host or domain held by one window and then, without a gap, by
another (of its own service or of another service on it) cannot be drained until the last of them
ends; the reason must say so, not name the first window's end as the time it is free."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.services import optout_window_create, service_place
from opsplanner import clock
from opsplanner.services.optouts import optout_message, optouts_by_domain, optouts_by_host
from tests.builders import make_domain, make_host, make_pool, make_service

pytestmark = pytest.mark.django_db

HOUR = dt.timedelta(hours=1)


def free_at(reason: str) -> str:
    return reason.rsplit(" until ", 1)[1]


def test_adjacent_windows_of_one_service_hold_the_host_until_the_last_ends() -> None:
    host = make_host(make_domain(make_pool()))
    service = make_service()
    service_place(service=service, hosts=[host])
    now = clock.now()
    first = optout_window_create(service=service, starts_at=now - HOUR, ends_at=now + HOUR, reason="batch")
    second = optout_window_create(service=service, starts_at=first.ends_at, ends_at=now + 3 * HOUR, reason="batch 2")

    for reason in (
        optouts_by_host(now=now, host_ids=[host.pk])[host.pk],
        optouts_by_domain(now=now, domain_ids=[host.domain_id])[host.domain_id],
    ):
        assert reason.startswith(optout_message(window_id=first.pk, service=service.name, ends_at=first.ends_at))
        assert f"#{second.pk}" in reason
        assert free_at(reason) == f"{second.ends_at:%Y-%m-%d %H:%M} UTC"
    # Indeed still held when the first one ends.
    assert host.pk in optouts_by_host(now=first.ends_at, host_ids=[host.pk])


def test_an_overlapping_window_of_another_service_on_the_domain_extends_the_hold() -> None:
    domain = make_domain(make_pool())
    busy, other = make_host(domain), make_host(domain)
    web, batch = make_service(), make_service()
    service_place(service=web, hosts=[busy])
    service_place(service=batch, hosts=[other])
    now = clock.now()
    optout_window_create(service=web, starts_at=now - HOUR, ends_at=now + HOUR, reason="launch")
    later = optout_window_create(service=batch, starts_at=now + HOUR / 2, ends_at=now + 4 * HOUR, reason="batch")

    reason = optouts_by_domain(now=now, domain_ids=[domain.pk])[domain.pk]
    assert free_at(reason) == f"{later.ends_at:%Y-%m-%d %H:%M} UTC"
    # The host of the later window alone is not held yet: nothing is in force on it now.
    assert optouts_by_host(now=now, host_ids=[other.pk]) == {}


def test_a_gap_between_windows_ends_the_hold_and_a_cancelled_window_does_not_extend_it() -> None:
    host = make_host(make_domain(make_pool()))
    service = make_service()
    service_place(service=service, hosts=[host])
    now = clock.now()
    first = optout_window_create(service=service, starts_at=now - HOUR, ends_at=now + HOUR, reason="a")
    optout_window_create(
        service=service, starts_at=first.ends_at + dt.timedelta(minutes=1), ends_at=now + 3 * HOUR, reason="gap"
    )
    cancelled = optout_window_create(service=service, starts_at=now, ends_at=now + 5 * HOUR, reason="c")
    from fleet.services.owners import optout_window_cancel

    assert optout_window_cancel(window_id=cancelled.pk, reason="not needed")
    expected = optout_message(window_id=first.pk, service=service.name, ends_at=first.ends_at)
    assert optouts_by_host(now=now, host_ids=[host.pk]) == {host.pk: expected}
