"""Every list endpoint of the API refuses a malformed filter with 400 naming the parameter.

The endpoints are the router's; the filters are each endpoint's FilterSet (declared and generated
from Meta.fields). A known parameter with a value of the wrong type or outside its choices is an
error, as a bad body is; unknown parameters (pagination, format) stay ignored."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from console.api.urls import router
from fleet.services import optout_window_create
from opsplanner import clock
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.builders import make_fleet, make_service
from tests.trains_builders import make_train

pytestmark = pytest.mark.django_db

# A malformed and a well-formed value per filter type, most specific first. A text filter has no
# malformed value; any other type must be listed here so that a new one cannot slip through.
VALUES: list[tuple[type[django_filters.Filter], str, str]] = [
    (django_filters.IsoDateTimeFilter, "not-a-date", "2026-01-01T00:00:00Z"),
    (django_filters.BooleanFilter, "maybe", "true"),
    (django_filters.NumberFilter, "abc", "1"),
    (django_filters.MultipleChoiceFilter, "no-such-choice", ""),
    (django_filters.ChoiceFilter, "no-such-choice", ""),
]


def _list_endpoints() -> list[tuple[str, type]]:
    return [(basename, viewset) for _, viewset, basename in router.registry if "list" in dir(viewset)]


def _filters() -> list[tuple[str, str, django_filters.Filter]]:
    return [
        (basename, name, declared)
        for basename, viewset in _list_endpoints()
        if getattr(viewset, "filterset_class", None) is not None
        for name, declared in viewset.filterset_class.base_filters.items()
    ]


def _typed(declared: django_filters.Filter) -> tuple[str, str] | None:
    for filter_type, malformed, well_formed in VALUES:
        if isinstance(declared, filter_type):
            choices = list(getattr(declared, "extra", {}).get("choices") or [])
            return malformed, well_formed or (str(choices[0][0]) if choices else "")
    assert type(declared) is django_filters.CharFilter, f"no malformed value for {type(declared).__name__}"
    return None


TYPED = [(basename, name, _typed(declared)) for basename, name, declared in _filters()]
MALFORMED = [(basename, name, values[0]) for basename, name, values in TYPED if values]
WELL_FORMED = [(basename, name, values[1]) for basename, name, values in TYPED if values]


@pytest.fixture
def operator() -> APIClient:
    return role_client(Role.OPERATOR)


def test_the_walk_covers_every_list_endpoint_and_its_typed_filters() -> None:
    assert len(_list_endpoints()) == len(router.registry) >= 17
    covered = {basename for basename, _, _ in MALFORMED}
    assert {"host", "domain", "optout-window", "reservation", "operation", "event", "train", "upgrade"} <= covered
    assert ("train", "emergency", "maybe") in MALFORMED
    assert ("optout-window", "active", "maybe") in MALFORMED


@pytest.mark.parametrize(("basename", "name", "value"), MALFORMED, ids=[f"{b}?{n}" for b, n, _ in MALFORMED])
def test_it_refuses_a_malformed_filter_naming_the_parameter(
    operator: APIClient, basename: str, name: str, value: str
) -> None:
    response = operator.get(reverse(f"api:{basename}-list"), {name: value})

    assert response.status_code == 400, response.content[:500]
    body = response.json()
    assert body["code"] == "invalid"
    assert list(body["errors"]) == [name]
    assert body["errors"][name]
    assert all(isinstance(message, str) for message in body["errors"][name])


@pytest.mark.parametrize(("basename", "name", "value"), WELL_FORMED, ids=[f"{b}?{n}" for b, n, _ in WELL_FORMED])
def test_it_accepts_a_well_formed_filter(operator: APIClient, basename: str, name: str, value: str) -> None:
    response = operator.get(reverse(f"api:{basename}-list"), {name: value})

    assert response.status_code == 200, response.content[:500]


def test_it_still_ignores_parameters_it_does_not_know(operator: APIClient) -> None:
    response = operator.get(reverse("api:operation-list"), {"format": "json", "colour": "blue", "limit": "2"})

    assert response.status_code == 200


def test_a_well_formed_boolean_still_filters_windows(operator: APIClient) -> None:
    service = make_service()
    now = clock.now()
    open_now = optout_window_create(
        service=service, starts_at=now - dt.timedelta(hours=1), ends_at=now + dt.timedelta(hours=1), reason="now"
    )
    later = optout_window_create(
        service=service, starts_at=now + dt.timedelta(days=1), ends_at=now + dt.timedelta(days=2), reason="later"
    )
    url = reverse("api:optout-window-list")

    assert _ids(operator.get(url, {"active": "true"})) == [open_now.pk]
    assert _ids(operator.get(url, {"active": "False"})) == [later.pk]
    assert _ids(operator.get(url, {"active": "1", "current": "yes"})) == [open_now.pk]


def test_a_well_formed_boolean_still_filters_trains(operator: APIClient) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    train = make_train(pool)
    url = reverse("api:train-list")

    assert _ids(operator.get(url, {"emergency": "false"})) == [train.pk]
    assert _ids(operator.get(url, {"emergency": "true"})) == []


def test_a_well_formed_id_still_filters_hosts(operator: APIClient) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    make_fleet(domains=1, hosts_per_domain=1)

    assert sorted(_ids(operator.get(reverse("api:host-list"), {"pool": pool.pk}))) == sorted(h.pk for h in hosts)


def _ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.content[:500]
    return [row["id"] for row in response.json()["results"]]
