"""API limits: oversized bodies, rate limits per token, and how long idempotency answers are kept."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from console.api.throttling import TokenRateThrottle
from opsplanner import clock
from opsplanner.models import IdempotencyRecord, Operation
from opsplanner.roles import Role
from opsplanner.services.housekeeping import idempotency_records_purge
from tests.api_helpers import role_client, token_client
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=2048)
def test_an_oversized_request_is_refused_with_413_and_nothing_is_written() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    client = role_client(Role.OPERATOR)
    response = client.post(
        "/api/operations/",
        {"kind": "reboot", "scope": f"pool {pool.name}", "reason": "x" * 4000},
        format="json",
    )
    assert response.status_code == 413
    assert response.json()["code"] == "too_large"
    assert "limit is 2048" in response.json()["detail"]
    assert not Operation.objects.exists()


def test_a_token_past_its_rate_is_throttled_and_another_token_of_the_same_user_is_not(monkeypatch) -> None:
    monkeypatch.setattr(TokenRateThrottle, "THROTTLE_RATES", {"token": "3/min"})
    first = role_client(Role.VIEWER)
    statuses = [first.get("/api/pools/").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert first.get("/api/pools/").json()["code"] == "throttled"
    second = token_client(first.user)
    assert second.get("/api/pools/").status_code == 200


def test_idempotency_answers_are_forgotten_after_their_keeping_time() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    client = role_client(Role.OPERATOR)
    body = {"kind": "reboot", "scope": f"pool {pool.name}", "reason": "kernel"}
    assert client.post("/api/operations/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1").status_code == 201
    assert idempotency_records_purge() == 0
    with clock.use_clock(lambda: dt.datetime.now(dt.UTC) + dt.timedelta(days=3)):
        assert idempotency_records_purge() == 1
    assert not IdempotencyRecord.objects.exists()


def test_the_hand_written_host_and_event_representations_match_the_declared_fields() -> None:
    from rest_framework import serializers

    from console.api.serializers.fleet import HostSerializer
    from console.api.serializers.work import EventSerializer
    from opsplanner.models import Event

    _, hosts = make_fleet(domains=1, hosts_per_domain=2)
    events = list(Event.objects.filter(host_id=hosts[0].pk))
    assert events
    for serializer_class, rows in ((HostSerializer, hosts), (EventSerializer, events)):
        for row in rows:
            fast = serializer_class(row).data
            generic = serializers.ModelSerializer.to_representation(serializer_class(row), row)
            assert dict(fast) == dict(generic)


def test_expired_tokens_are_refused_and_housekeeping_deletes_them() -> None:
    from knox.models import AuthToken

    from opsplanner.services.housekeeping import expired_tokens_delete

    client = role_client(Role.VIEWER)
    fresh = token_client(client.user)
    AuthToken.objects.filter(pk=AuthToken.objects.order_by("created").first().pk).update(
        expiry=clock.now() - dt.timedelta(seconds=1)
    )
    assert client.get("/api/pools/").status_code == 401
    assert fresh.get("/api/pools/").status_code == 200
    AuthToken.objects.update(expiry=clock.now() - dt.timedelta(seconds=1))
    assert expired_tokens_delete() == 1
    assert not AuthToken.objects.exists()
