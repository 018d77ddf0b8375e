"""Opt-out windows in force (opsplanner/services/optouts.py): one read and one wording, by host for
admission and the scope preview, by domain for the train tick."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.services import optout_window_create, service_place
from opsplanner import clock
from opsplanner.services.optouts import optout_message, optouts_by_domain, optouts_by_host
from tests.builders import make_domain, make_host, make_pool, make_service

pytestmark = pytest.mark.django_db


def test_a_window_in_force_names_the_same_reason_for_its_hosts_and_their_domain() -> None:
    domain, quiet = make_domain(make_pool()), None
    quiet = make_domain(domain.pool)
    busy_host, quiet_host = make_host(domain), make_host(quiet)
    service = make_service()
    service_place(service=service, hosts=[busy_host])
    now = clock.now()
    window = optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=2), reason="x"
    )
    expected = optout_message(window_id=window.pk, service=service.name, ends_at=window.ends_at)
    assert optouts_by_host(now=now, host_ids=[busy_host.pk, quiet_host.pk]) == {busy_host.pk: expected}
    assert optouts_by_domain(now=now, domain_ids=[domain.pk, quiet.pk]) == {domain.pk: expected}


def test_windows_not_in_force_or_cancelled_make_no_reason() -> None:
    host = make_host(make_domain(make_pool()))
    service = make_service()
    service_place(service=service, hosts=[host])
    now = clock.now()
    optout_window_create(
        service=service, starts_at=now + dt.timedelta(hours=1), ends_at=now + dt.timedelta(hours=2), reason="later"
    )
    assert optouts_by_host(now=now, host_ids=[host.pk]) == {}
    assert optouts_by_domain(now=now, domain_ids=[host.domain_id]) == {}
    assert optouts_by_host(now=now + dt.timedelta(minutes=90), host_ids=[host.pk])  # in force by then


def test_of_several_windows_the_one_that_holds_the_host_longest_is_named() -> None:
    host = make_host(make_domain(make_pool()))
    first, second = make_service(), make_service()
    service_place(service=first, hosts=[host])
    service_place(service=second, hosts=[host])
    now = clock.now()
    optout_window_create(service=first, starts_at=now, ends_at=now + dt.timedelta(hours=1), reason="short")
    long = optout_window_create(service=second, starts_at=now, ends_at=now + dt.timedelta(hours=5), reason="long")
    later = now + dt.timedelta(seconds=1)
    for reason in (
        optouts_by_host(now=later, host_ids=[host.pk])[host.pk],
        optouts_by_domain(now=later, domain_ids=[host.domain_id])[host.domain_id],
    ):
        assert reason.startswith(f"opt-out window #{long.pk} of service {second.name} until ")
