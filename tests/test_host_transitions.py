"""The tick moves hosts only as HOST_TRANSITIONS allows: it refuses any other move and rolls back,
and every move a flow with failures, repairs and an escalation makes is in the table."""

from __future__ import annotations

import pytest
from django.db import transaction

from fleet.models import Host, HostState
from fleet.models.hosts import HOST_TRANSITIONS
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.services.escalations import host_escalation_release
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.tick import run as tick_run
from opsplanner.services.tick.context import IllegalTransition, TickContext
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db


def test_the_tick_refuses_a_host_move_the_table_does_not_allow_and_writes_nothing() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)

    with transaction.atomic():
        ctx = TickContext(pool=pool, now=clock.now())
        with pytest.raises(IllegalTransition, match="a host cannot go from in_service to maintenance"):
            ctx.move_hosts([h.pk for h in hosts], expected=HostState.IN_SERVICE, new=HostState.MAINTENANCE, reason="r")

    assert ctx.events == []
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}


def test_a_pool_tick_that_tries_an_illegal_move_rolls_back_with_an_event(monkeypatch) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)

    def admit_straight_into_maintenance(ctx: TickContext, *, budget: int) -> None:
        ctx.move_hosts([hosts[0].pk], expected=HostState.IN_SERVICE, new=HostState.MAINTENANCE, reason="no drain")

    monkeypatch.setattr(tick_run, "admit", admit_straight_into_maintenance)

    report = pool_tick(pool_id=pool.pk, kick=False)

    assert report.retried
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
    assert not Event.objects.filter(kind="host.state_changed", host_id=hosts[0].pk).exists()
    rolled_back = Event.objects.get(kind="tick.rolled_back", subject_id=pool.pk)
    assert rolled_back.reason == "a host cannot go from in_service to maintenance"


def test_a_pool_tick_rolled_back_for_the_same_reason_again_leaves_one_event_and_a_new_reason_its_own(
    monkeypatch,
) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    target = [HostState.MAINTENANCE]

    def admit_straight_into(ctx: TickContext, *, budget: int) -> None:
        ctx.move_hosts([hosts[0].pk], expected=HostState.IN_SERVICE, new=target[0], reason="no drain")

    monkeypatch.setattr(tick_run, "admit", admit_straight_into)

    reports = [pool_tick(pool_id=pool.pk, kick=False) for _ in range(3)]
    target[0] = HostState.RETURNING
    reports.append(pool_tick(pool_id=pool.pk, kick=False))

    assert all(report.retried for report in reports)
    assert list(
        Event.objects.filter(kind="tick.rolled_back", subject_id=pool.pk)
        .order_by("id")
        .values_list("reason", flat=True)
    ) == ["a host cannot go from in_service to maintenance", "a host cannot go from in_service to returning"]


def test_every_host_move_of_a_flow_with_failures_repairs_and_an_escalation_is_in_the_table() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=2)
    broken, refused, unverified, upgraded = hosts
    instant_simulator(execute_failure_rate=1)  # every repair of `broken` fails: it is escalated
    operation_submit(kind="reboot", scope=f"hosts: {broken.hostname}", reason="r", max_attempts=1)
    drive(pool)
    instant_simulator(refusing_host_fraction=1)  # the drain is refused: the host goes back
    operation_submit(kind="reboot", scope=f"hosts: {refused.hostname}", reason="r")
    drive(pool)
    instant_simulator()
    host_escalation_release(host_id=broken.pk, reason="reseated the cards")  # verified, then returned
    host_failure_report(host_id=unverified.pk, reason="fell over in service")  # repaired without a drain
    operation_submit(
        kind="upgrade", scope=f"hosts: {upgraded.hostname}", reason="r", component="gpu-driver", version="560.35.03"
    )
    drive(pool)

    moves = {
        (data["from"], data["to"])
        for data in Event.objects.filter(kind="host.state_changed", pool_id=pool.pk).values_list("data", flat=True)
    }
    assert not Event.objects.filter(kind="tick.rolled_back").exists()
    assert {(before, after) for before, after in moves if after not in HOST_TRANSITIONS[before]} == set()
    assert {
        (HostState.IN_SERVICE, HostState.DRAINING),
        (HostState.DRAINING, HostState.RETURNING),
        (HostState.FAILED, HostState.REPAIR),
        (HostState.REPAIR, HostState.FAILED),
        (HostState.FAILED, HostState.ESCALATED),
        (HostState.ESCALATED, HostState.REPAIR),
        (HostState.REPAIR, HostState.IN_SERVICE),
        (HostState.MAINTENANCE, HostState.VERIFYING),
        (HostState.RETURNING, HostState.IN_SERVICE),
    } <= moves
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
