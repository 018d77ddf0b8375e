"""Live updates: after a commit that wrote events, tell the websocket groups whose pages changed.

One group per object (`pool-<id>`, `approvals`), a message that only names the group: consumers
re-read what their user may see from the database and push the fragment. Sent after commit only
(a rolled-back change is never announced as such), and a failure to reach the channel layer never
fails the write: the pages also refresh by polling."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)
APPROVALS_GROUP = "approvals"
MESSAGE_TYPE = "live.changed"
# What this thread's current commit already announced (reset at the start of each commit's callbacks).
_sent = threading.local()


def pool_group(pool_id: int) -> str:
    return f"pool-{pool_id}"


def groups_for(pool_ids: Iterable[int | None], subject_types: Iterable[str]) -> set[str]:
    groups = {pool_group(pool_id) for pool_id in pool_ids if pool_id}
    if "opsplanner.approval" in set(subject_types):
        groups.add(APPROVALS_GROUP)
    return groups


_muted = False


@contextmanager
def live_muted() -> Iterator[None]:
    """Announce nothing inside the block: a simulation's changes are not the live fleet's."""
    global _muted
    previous, _muted = _muted, True
    try:
        yield
    finally:
        _muted = previous


def announce_after_commit(groups: set[str]) -> None:
    """Send the groups once the current transaction commits, each group once per commit.

    Each call registers its own callback with its own groups, so groups queued in a transaction
    (or savepoint) that rolls back are dropped with it by Django; a reset callback registered
    first in each transaction starts the commit's record of what was already sent."""
    if not groups or _muted:
        return
    connection = transaction.get_connection()
    if connection.in_atomic_block and not any(
        getattr(func, "live_reset", False) for _, func, _ in connection.run_on_commit
    ):
        transaction.on_commit(_reset_sent, robust=True)
    transaction.on_commit(partial(_send_unsent, frozenset(groups)), robust=True)


def _reset_sent() -> None:
    _sent.groups = set()


_reset_sent.live_reset = True  # type: ignore[attr-defined]


def _send_unsent(groups: frozenset[str]) -> None:
    already: set[str] = getattr(_sent, "groups", None) or set()
    unsent = set(groups) - already
    _sent.groups = already | unsent
    if not unsent:
        return
    batch: LiveBatch | None = getattr(_current, "batch", None)
    if batch is not None:
        batch.add(unsent)
        return
    _send(unsent)


def _send(groups: set[str]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(_group_send_all)(layer, sorted(groups))
    except Exception as error:  # noqa: BLE001 - live updates are best effort; pages also poll
        log.warning("live update not sent (%s): %s", ", ".join(sorted(groups)), error)


async def _group_send_all(layer: Any, groups: list[str]) -> None:
    # One trip through async_to_sync (an event loop and a channel-layer connection) for all of them.
    for group in groups:
        await layer.group_send(group, {"type": MESSAGE_TYPE, "group": group})


class LiveBatch:
    """Groups announced inside a live_batched() block, from its thread and the threads that join it."""

    def __init__(self) -> None:
        self.groups: set[str] = set()
        self._lock = threading.Lock()

    def add(self, groups: Iterable[str]) -> None:
        with self._lock:
            self.groups.update(groups)

    def taken(self) -> set[str]:
        with self._lock:
            groups, self.groups = self.groups, set()
        return groups


_current = threading.local()  # the batch this thread's commits announce into, if any


@contextmanager
def live_batched(batch: LiveBatch | None = None) -> Iterator[LiveBatch]:
    """Hold what commits inside the block announce and send it once, when the block ends: the fleet
    tick commits a transaction per pool, and each send costs a few milliseconds. Per thread: other
    threads' commits go out as usual, unless a thread joins this batch with live_batched(batch)
    (the fleet tick's lanes do). A batch opened inside another hands its groups to the outer one."""
    previous: LiveBatch | None = getattr(_current, "batch", None)
    opened = batch is None
    current = LiveBatch() if batch is None else batch
    _current.batch = current
    try:
        yield current
    finally:
        _current.batch = previous
        if opened:
            groups = current.taken()
            if previous is not None:
                previous.add(groups)
            elif groups:
                _send(groups)
