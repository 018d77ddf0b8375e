"""An Idempotency-Key names one request: its method, path, query and body. A dry run and the real
create differ only by `?dry_run=true`; a key used for one is not replayed for the other."""

from __future__ import annotations

import pytest

from fleet.models import Host
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def test_a_key_used_for_a_dry_run_is_not_replayed_as_the_real_create() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    operator = role_client(Role.OPERATOR)
    body = {"hosts": [{"hostname": "new-1", "pool": pool.name, "domain": "rack-0001", "sku": "h100"}]}
    key = {"Idempotency-Key": "bulk-1"}

    planned = operator.post("/api/hosts/bulk/?dry_run=true", body, format="json", headers=key)
    created = operator.post("/api/hosts/bulk/", body, format="json", headers=key)

    assert planned.status_code == 200, planned.content
    assert planned.json()["applied"] is False
    # The same key for another request: refused, saying why, never the dry run's answer as if applied.
    assert created.status_code == 409, created.content
    assert created.json()["code"] == "idempotency_key_reused"
    assert "/api/hosts/bulk/" in created.json()["detail"]
    assert not Host.objects.filter(hostname="new-1").exists()
    again = operator.post("/api/hosts/bulk/?dry_run=true", body, format="json", headers=key)
    assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true")
