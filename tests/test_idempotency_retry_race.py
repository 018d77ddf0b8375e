"""A create retried with its Idempotency-Key while the first attempt is still running (a client that
timed out): the retry waits for the first and answers with its response, not a refusal of its own."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fleet.fleetfile import apply as apply_module
from fleet.fleetfile import sources
from fleet.models import Host
from opsplanner.roles import Role
from tests.api_helpers import token_client
from tests.builders import make_fleet
from tests.driving import in_threads
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_host_create_retried_while_the_first_runs_answers_the_first_ones_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    user = make_user(Role.OPERATOR)
    row = {"hostname": "new-1", "pool": pool.name, "domain": "rack-0001", "sku": "h100"}
    retry_waits = threading.Event()
    real_lock, real_write = sources.pools_lock, apply_module.FleetWriter.write

    def pools_lock() -> None:
        if threading.current_thread().name == "retry":
            retry_waits.set()  # past the replay check, about to wait for the first attempt's locks
        real_lock()

    def write(self: Any) -> None:
        real_write(self)
        assert retry_waits.wait(10)
        time.sleep(0.3)  # the retry is blocked on the pool rows now

    monkeypatch.setattr(sources, "pools_lock", pools_lock)
    monkeypatch.setattr(apply_module.FleetWriter, "write", write)
    answers: dict[str, Any] = {}

    def post(name: str) -> None:
        client = token_client(user)
        answers[name] = client.post("/api/hosts/", row, format="json", headers={"Idempotency-Key": "host-new-1"})

    def first() -> None:
        post("first")

    def retry() -> None:
        time.sleep(0.2)  # the first attempt holds the pools
        threading.current_thread().name = "retry"
        post("retry")

    assert in_threads(first, retry) == []

    assert answers["first"].status_code == 201, answers["first"].content
    assert answers["retry"].status_code == 201, answers["retry"].content
    assert answers["retry"]["Idempotent-Replayed"] == "true"
    assert answers["retry"].json() == answers["first"].json()
    assert Host.objects.filter(hostname="new-1").count() == 1
