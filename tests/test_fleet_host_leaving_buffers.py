"""A pool losing a host (retired, or moved to another pool) has a smaller total, and a buffer given
as a fraction shrinks with it: never below what is out for it now (invariant 2)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from fleet.fleetfile import FleetApplyRefused, fleet_apply
from fleet.fleetfile.export import fleet_export_document
from fleet.fleetfile.schema import fleet_spec_from_document
from fleet.models import Host, HostState
from fleet.models.hosts import RETIRED
from fleet.services.host_changes import host_retire, host_update
from opsplanner.models import Event
from opsplanner.roles import Role
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.api_helpers import role_client
from tests.builders import make_domain, make_fleet, make_pool

pytestmark = pytest.mark.django_db


def _full_fraction_pool() -> tuple[Any, list[Host]]:
    """Ten hosts, a planned buffer of 0.2 (two hosts), both out for planned work now."""
    pool, hosts = make_fleet(domains=2, hosts_per_domain=5)
    pool.planned_buffer_hosts, pool.planned_buffer_fraction = None, Decimal("0.2")
    pool.save(update_fields=["planned_buffer_hosts", "planned_buffer_fraction"])
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}, {hosts[1].hostname}", reason="fix")
    pool_tick(pool_id=pool.pk)
    assert Host.objects.filter(pool=pool).exclude(state=HostState.IN_SERVICE).count() == 2
    assert _buffer_violations() == []
    return pool, hosts


def _buffer_violations() -> list[Any]:
    return [v for v in check_invariants() if v.code == "planned_buffer"]


def _refusal(pool: Any) -> str:
    return f"pool {pool.name}: the planned buffer would be 1 hosts, below the 2 hosts out for planned work now"


def test_retiring_a_host_through_the_api_does_not_shrink_a_full_buffer_below_what_is_out() -> None:
    pool, hosts = _full_fraction_pool()
    operator = role_client(Role.OPERATOR)
    events = Event.objects.count()

    response = operator.post(f"/api/hosts/{hosts[9].hostname}/retire/", {"reason": "gone"}, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["detail"] == f"host {hosts[9].hostname}: not retired: {_refusal(pool)}"
    assert Host.objects.get(pk=hosts[9].pk).state == HostState.IN_SERVICE
    assert Event.objects.count() == events
    assert _buffer_violations() == []


def test_a_host_retired_where_the_buffer_has_room_is_retired() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=5)
    pool.planned_buffer_hosts, pool.planned_buffer_fraction = None, Decimal("0.2")
    pool.save(update_fields=["planned_buffer_hosts", "planned_buffer_fraction"])
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="fix")
    pool_tick(pool_id=pool.pk)

    host_retire(hostname=hosts[9].hostname, reason="gone")

    assert Host.all_objects.get(pk=hosts[9].pk).state == RETIRED
    assert _buffer_violations() == []


def test_moving_a_host_to_another_pool_does_not_shrink_a_full_buffer_below_what_is_out() -> None:
    pool, hosts = _full_fraction_pool()
    other = make_pool(name="elsewhere")
    make_domain(other, name="rack-a")

    with pytest.raises(ValidationError) as refused:
        host_update(host_id=hosts[9].pk, pool="elsewhere", domain="rack-a")

    assert f"host {hosts[9].hostname}: not moved to pool elsewhere: {_refusal(pool)}" in refused.value.messages
    assert Host.objects.get(pk=hosts[9].pk).pool_id == pool.pk
    assert _buffer_violations() == []


def test_a_fleet_file_that_prunes_a_host_does_not_shrink_a_full_buffer_below_what_is_out() -> None:
    pool, hosts = _full_fraction_pool()
    document = fleet_export_document(pool=pool.name)
    document["hosts"] = [h for h in document["hosts"] if h["hostname"] != hosts[9].hostname]

    with pytest.raises(FleetApplyRefused) as refused:
        fleet_apply(spec=fleet_spec_from_document(copy.deepcopy(document)), prune=True)

    assert refused.value.plan.refusals == [f"{_refusal(pool)} (with 1 of its hosts retired or moved out)"]
    assert Host.objects.get(pk=hosts[9].pk).state == HostState.IN_SERVICE
    assert _buffer_violations() == []
