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
    with _batch_lock:
        if _batch is not None:
            _batch.update(unsent)
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


_batch: set[str] | None = None
_batch_lock = threading.Lock()


@contextmanager
def live_batched() -> Iterator[None]:
    """Collect what commits inside the block announce, from any thread, and send it once at its
    end: the fleet tick commits a transaction per pool, and each send costs a few milliseconds.
    Process-wide: another thread's announcements made meanwhile wait for the end too (later, never lost)."""
    global _batch
    with _batch_lock:
        outer, _batch = _batch, set()
    try:
        yield
    finally:
        with _batch_lock:
            collected, _batch = _batch, outer
            if outer is not None:
                outer.update(collected)
                collected = set()
        if collected:
            _send(collected)
