"""The scope preview says, before anything is submitted, how many hosts a scope covers per pool and
what would make them wait: another operation's lease, an opt-out window, the pool's headroom. It
reads what admission reads, in a fixed number of queries, and writes nothing."""

from __future__ import annotations

import datetime as dt

import pytest

from console.selectors.scope_preview import scope_preview
from fleet.services import optout_window_create, service_place
from fleet.services.hosts import host_transition
from opsplanner import clock
from opsplanner.models import OperationSource
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet, make_service
from tests.test_security import database_state

pytestmark = pytest.mark.django_db

# The resolver's two reads of a pool scope, then hosts' pools, the pools, hosts and holders, the
# opt-out windows active now, and the pool's counts by state and its binding reservation.
POOL_SCOPE_QUERIES = 8


def hostnames(hosts) -> str:
    return "hosts: " + ", ".join(host.hostname for host in hosts)


def test_a_scope_across_two_pools_is_counted_per_pool() -> None:
    east, east_hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=3)
    west, west_hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)

    preview = scope_preview(scope=hostnames(east_hosts[:2] + west_hosts))

    assert preview.error == ""
    assert preview.hosts == 4
    assert {pool.name: pool.hosts for pool in preview.pools} == {east.name: 2, west.name: 2}
    assert preview.may_start == 4


def test_hosts_held_by_another_operation_or_out_of_service_are_counted_with_their_holder() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=4)
    holder = operation_submit(kind="reboot", scope=hostnames(hosts[:3]), reason="earlier work")
    pool_tick(pool_id=pool.pk)  # admitted: the three hosts are leased
    host_transition(host_id=hosts[3].pk, expected="in_service", new="failed", reason="psu")

    preview = scope_preview(scope=f"pool {pool.name}")

    (only,) = preview.pools
    assert (only.hosts, only.held, only.out_of_service, only.ready) == (4, 3, 1, 0)
    assert preview.holders == [(holder.pk, 3)]


def test_hosts_under_an_opt_out_window_wait_except_for_an_emergency() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=4)
    service = make_service()
    service_place(service=service, hosts=hosts[:2])
    now = clock.now()
    window = optout_window_create(
        service=service, starts_at=now - dt.timedelta(hours=1), ends_at=now + dt.timedelta(hours=2), reason="launch"
    )

    preview = scope_preview(scope=f"pool {pool.name}")
    emergency = scope_preview(scope=f"pool {pool.name}", source=OperationSource.EMERGENCY)

    assert (preview.pools[0].opted_out, preview.pools[0].ready) == (2, 2)
    ((reason, count),) = preview.optouts
    assert reason.startswith(f"opt-out window #{window.pk} of service {service.name}")
    assert count == 2
    assert (emergency.pools[0].opted_out, emergency.optouts) == (0, [])


def test_hosts_beyond_the_pools_headroom_wait_for_room_with_the_limit_that_binds() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=2)

    (only,) = scope_preview(scope=f"pool {pool.name}").pools
    in_place = scope_preview(scope=f"pool {pool.name}", needs_drain=False).pools[0]

    assert (only.ready, only.headroom, only.over_headroom, only.may_start) == (6, 2, 4, 2)
    assert only.headroom_reason == f"planned buffer of pool {pool.name} is full (2 hosts)"
    assert (in_place.over_headroom, in_place.may_start) == (0, 6)  # work without a drain takes no room


def test_a_scope_the_resolver_refuses_gives_its_message_and_no_hosts() -> None:
    make_fleet(domains=1, hosts_per_domain=1)

    preview = scope_preview(scope="pool no-such-pool")

    assert preview.error == "There is no pool named 'no-such-pool'."
    assert (preview.hosts, preview.pools) == (0, [])
    assert "Cannot read the scope" in scope_preview(scope="every host please").error


def test_the_preview_writes_nothing() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=3)
    before = database_state()
    scope_preview(scope=f"pool {pool.name}")
    assert database_state() == before


@pytest.mark.parametrize("hosts_per_domain", [2, 40])
def test_the_preview_of_a_pool_takes_the_same_queries_whatever_its_size(
    django_assert_num_queries, hosts_per_domain: int
) -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=hosts_per_domain)
    operation_submit(kind="reboot", scope=hostnames(hosts[:1]), reason="hold one")
    pool_tick(pool_id=pool.pk)
    scope_preview(scope=f"pool {pool.name}")  # warm: prepared queries compile once per process

    with django_assert_num_queries(POOL_SCOPE_QUERIES):
        preview = scope_preview(scope=f"pool {pool.name}")
    assert preview.hosts == 2 * hosts_per_domain


def test_each_more_pool_costs_two_queries(django_assert_num_queries) -> None:
    _, east = make_fleet(domains=1, hosts_per_domain=2)
    _, west = make_fleet(domains=1, hosts_per_domain=2)
    scope = hostnames(east + west)
    scope_preview(scope=scope)

    # A host list resolves in one query (not two), and there are two pools (two more).
    with django_assert_num_queries(POOL_SCOPE_QUERIES - 1 + 2):
        scope_preview(scope=scope)
