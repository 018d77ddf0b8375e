"""POST /api/hosts/bulk/: thousands of hosts in one request and one transaction, checked by the
fleet file's schema: all are created, or none with every problem named by its index."""

from __future__ import annotations

import time

import pytest

from fleet.models import Host
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def rows(pool: str, count: int, *, start: int = 0) -> list[dict]:
    return [
        {"hostname": f"bulk-{n:05d}", "pool": pool, "domain": f"rack-000{1 + n % 2}", "sku": "h100", "gpu_count": 8}
        for n in range(start, start + count)
    ]


def test_the_bulk_api_creates_5000_hosts_in_one_call_with_an_event_each() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    events_before = Event.objects.count()

    started = time.perf_counter()
    response = role_client(Role.OPERATOR).post("/api/hosts/bulk/", {"hosts": rows(pool.name, 5000)}, format="json")
    took = time.perf_counter() - started

    assert response.status_code == 201, response.content[:500]
    assert response.json()["counts"] == {"host": {"create": 5000, "update": 0, "remove": 0}}
    assert Host.objects.filter(hostname__startswith="bulk-").count() == 5000
    assert Host.objects.get(hostname="bulk-00003").domain.name == "rack-0002"
    assert Event.objects.filter(kind="host.created").count() >= 5000
    assert Event.objects.count() - events_before == 5001  # one per host and the apply's own
    assert took < 30, took


def test_a_bulk_request_with_errors_names_each_by_its_index_and_writes_nothing() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=1)
    batch = rows(pool.name, 5)
    batch[1]["domain"] = "rack-99"
    batch[3]["gpu_count"] = 99
    batch[4]["hostname"] = hosts[0].hostname

    response = role_client(Role.OPERATOR).post("/api/hosts/bulk/", {"hosts": batch}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == {
        "hosts[1].domain": [f"no domain 'rack-99' in pool {pool.name}"],
        "hosts[3].gpu_count": ["must be between 0 and 64, not 99"],
        "hosts[4].hostname": [f"host {hosts[0].hostname} exists already"],
    }
    assert not Host.objects.filter(hostname__startswith="bulk-").exists()
    assert not Event.objects.filter(kind="host.created", data__hostname__startswith="bulk-").exists()


def test_a_retried_bulk_request_answers_the_first_answer_and_creates_nothing_more() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    client = role_client(Role.OPERATOR)
    body, key = {"hosts": rows(pool.name, 3)}, {"Idempotency-Key": "bulk-1"}

    first = client.post("/api/hosts/bulk/", body, format="json", headers=key)
    again = client.post("/api/hosts/bulk/", body, format="json", headers=key)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Host.objects.filter(hostname__startswith="bulk-").count() == 3


def test_a_bulk_dry_run_plans_and_writes_nothing() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)

    response = role_client(Role.OPERATOR).post(
        "/api/hosts/bulk/?dry_run=true", {"hosts": rows(pool.name, 2)}, format="json"
    )

    assert response.status_code == 200
    assert response.json()["dry_run"] is True
    assert [c["name"] for c in response.json()["changes"]] == ["bulk-00000", "bulk-00001"]
    assert not Host.objects.filter(hostname__startswith="bulk-").exists()


def test_a_service_owner_may_not_create_hosts() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)

    response = role_client(Role.SERVICE_OWNER).post("/api/hosts/bulk/", {"hosts": rows(pool.name, 1)}, format="json")

    assert response.status_code == 403
    assert not Host.objects.filter(hostname__startswith="bulk-").exists()
