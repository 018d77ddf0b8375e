"""Live updates collected over a fleet tick: each commit's groups are held until the batch ends,
then every group is sent once; without a batch they go out at each commit as before."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import connection, transaction

from opsplanner import live
from opsplanner.live import announce_after_commit, live_batched, pool_group
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import fleet_tick
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A channel of the real channel layer, in the groups it listens to (one event loop throughout)."""

    def __init__(self) -> None:
        self.layer = get_channel_layer()
        self.channel = ""

    async def join(self, *groups: str) -> None:
        self.channel = await self.layer.new_channel()
        for group in groups:
            await self.layer.group_add(group, self.channel)

    async def received(self, timeout: float = 1.0) -> list[str]:
        got: list[str] = []
        wait = timeout
        while True:
            try:
                message = await asyncio.wait_for(self.layer.receive(self.channel), wait)
            except TimeoutError:
                return got
            got.append(message["group"])
            wait = 0.3  # anything sent twice would follow at once


def run(scenario: Callable[[Listener], Awaitable[None]]) -> None:
    async def main() -> None:
        await scenario(Listener())

    async_to_sync(main)()


def commit_announcing(*groups: str) -> None:
    with transaction.atomic():
        announce_after_commit(set(groups))


def test_a_batch_sends_each_group_once_when_it_ends_and_nothing_before() -> None:
    first, second = pool_group(90001), pool_group(90002)
    held: list[list[str]] = []

    async def scenario(listener: Listener) -> None:
        await listener.join(first, second)

        def tick() -> None:
            with live_batched():
                commit_announcing(first)
                commit_announcing(first, second)
                held.append(async_to_sync(listener.received)(0.5))

        await sync_to_async(tick)()
        assert held == [[]], "sent before the batch ended"
        assert sorted(await listener.received()) == [first, second]

    run(scenario)


def test_a_rolled_back_transaction_inside_a_batch_announces_nothing() -> None:
    group = pool_group(90003)

    async def scenario(listener: Listener) -> None:
        await listener.join(group)

        def announce_then_fail() -> None:
            with transaction.atomic():
                announce_after_commit({group})
                raise RuntimeError("rolled back")

        def tick() -> None:
            with live_batched(), pytest.raises(RuntimeError, match="rolled back"):
                announce_then_fail()

        await sync_to_async(tick)()
        assert await listener.received(timeout=0.5) == []

    run(scenario)


def test_without_a_batch_each_commit_is_announced_at_once() -> None:
    group = pool_group(90004)

    async def scenario(listener: Listener) -> None:
        await listener.join(group)
        await sync_to_async(commit_announcing)(group)
        assert await listener.received() == [group]

    run(scenario)


def test_a_nested_batch_hands_its_groups_to_the_outer_one() -> None:
    inner, outer = pool_group(90005), pool_group(90006)
    held: list[list[str]] = []

    async def scenario(listener: Listener) -> None:
        await listener.join(inner, outer)

        def tick() -> None:
            with live_batched():
                with live_batched():
                    commit_announcing(inner)
                held.append(async_to_sync(listener.received)(0.5))
                commit_announcing(outer)

        await sync_to_async(tick)()
        assert held == [[]], "the inner batch sent what the outer one holds"
        assert sorted(await listener.received()) == [inner, outer]

    run(scenario)


def test_a_fleet_tick_announces_every_pool_it_changed_in_one_send_at_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    first, _ = make_fleet(domains=1, hosts_per_domain=2)
    second, _ = make_fleet(domains=1, hosts_per_domain=2)
    for pool in (first, second):
        operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="live batching")
    sends: list[set[str]] = []
    real_send = live._send

    def counted_send(groups: set[str]) -> None:
        sends.append(set(groups))
        real_send(groups)

    monkeypatch.setattr(live, "_send", counted_send)
    groups = {pool_group(first.pk), pool_group(second.pk)}

    async def scenario(listener: Listener) -> None:
        await listener.join(*groups)
        reports = await sync_to_async(fleet_tick)(lanes=1)
        assert {report.pool_id for report in reports} >= {first.pk, second.pk}
        assert set(await listener.received()) == groups

    run(scenario)
    assert len(sends) == 1, f"one send per fleet tick, not one per pool's commit: {sends}"
    assert groups <= sends[0]


def test_batches_in_two_threads_at_once_each_send_their_own_groups_once() -> None:
    # Two fleet ticks in one process (a test, or a worker and a shell) must not share a batch.
    groups = [pool_group(90007), pool_group(90008)]
    both_inside = threading.Barrier(2)

    async def scenario(listener: Listener) -> None:
        await listener.join(*groups)

        def tick(group: str) -> None:
            try:
                with live_batched():
                    commit_announcing(group)
                    both_inside.wait(timeout=5)
            finally:
                connection.close()  # this thread's own

        await asyncio.gather(*(sync_to_async(tick, thread_sensitive=False)(group) for group in groups))
        assert sorted(await listener.received()) == sorted(groups)

    run(scenario)
