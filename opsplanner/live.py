"""Live updates: after a commit that wrote events, tell the websocket groups whose pages changed.

One group per object (`pool-<id>`, `approvals`), a message that only names the group: consumers
re-read what their user may see from the database and push the fragment. Sent after commit only
(a rolled-back change is never announced as such), and a failure to reach the channel layer never
fails the write: the pages also refresh by polling."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)
APPROVALS_GROUP = "approvals"
MESSAGE_TYPE = "live.changed"
_pending = threading.local()


def pool_group(pool_id: int) -> str:
    return f"pool-{pool_id}"


def groups_for(pool_ids: Iterable[int | None], subject_types: Iterable[str]) -> set[str]:
    groups = {pool_group(pool_id) for pool_id in pool_ids if pool_id}
    if "opsplanner.approval" in set(subject_types):
        groups.add(APPROVALS_GROUP)
    return groups


def announce_after_commit(groups: set[str]) -> None:
    """Queue the groups; one flush per commit sends each once (later callbacks find nothing left)."""
    if not groups:
        return
    pending: set[str] = getattr(_pending, "groups", None) or set()
    pending |= groups
    _pending.groups = pending
    transaction.on_commit(_flush, robust=True)


def _flush() -> None:
    groups: set[str] = getattr(_pending, "groups", None) or set()
    _pending.groups = set()
    if not groups:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        for group in sorted(groups):
            async_to_sync(layer.group_send)(group, {"type": MESSAGE_TYPE, "group": group})
    except Exception as error:  # noqa: BLE001 - live updates are best effort; pages also poll
        log.warning("live update not sent (%s): %s", ", ".join(sorted(groups)), error)
