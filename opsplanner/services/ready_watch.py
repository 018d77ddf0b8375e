"""One watcher per process for every long-polling claim: a waiting claim registers what it waits for
(adapter, kinds, pool, host) and sleeps on an event; one thread looks, in two queries a round, which
of those have a ready item and wakes their claims, which then claim as usual.

Without it each waiting claim polled the database itself: 2,000 per-host agents meant thousands of
queries a second and every request thread queueing for the connection pool. Now a waiting claim
holds a thread and nothing else, and the database sees one look per process every POLL_S.

Level-triggered on purpose: the watcher asks "is something ready", not "did something change", so
an item that became ready between a claim's own attempt and its registration is found next round,
and a wake-up that another claim wins is harmless (the loser claims nothing and waits again).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from django.db import close_old_connections, connection

from opsplanner.models import WorkItem, WorkState

POLL_S = 0.2
log = logging.getLogger(__name__)


class ReadyFilter(NamedTuple):
    """What a claim waits for: a ready item of this adapter (of these kinds, in this pool, of this host)."""

    adapter: str
    kinds: frozenset[str]
    pool_id: int | None
    host_id: int | None

    def matches(self, adapter: str, kind: str, pool_id: int, host_id: int) -> bool:
        return (
            adapter == self.adapter
            and (not self.kinds or kind in self.kinds)
            and self.pool_id in (None, pool_id)
            and self.host_id in (None, host_id)
        )


class ReadyWatcher:
    def __init__(self, poll_seconds: float = POLL_S) -> None:
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._someone_waits = threading.Condition(self._lock)
        self._waiting: dict[ReadyFilter, set[threading.Event]] = defaultdict(set)
        self._thread: threading.Thread | None = None

    def wait(self, wanted: ReadyFilter, timeout: float) -> bool:
        """Sleep until an item `wanted` describes may be ready (True) or `timeout` passes (False)."""
        ready = threading.Event()
        with self._lock:
            self._waiting[wanted].add(ready)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="ready-watcher", daemon=True)
                self._thread.start()
            self._someone_waits.notify()
        try:
            return ready.wait(timeout)
        finally:
            with self._lock:
                waiters = self._waiting.get(wanted)
                if waiters is not None:
                    waiters.discard(ready)
                    if not waiters:
                        del self._waiting[wanted]

    def waiting(self) -> int:
        with self._lock:
            return sum(len(events) for events in self._waiting.values())

    def _watch(self) -> None:
        while True:
            with self._lock:
                while not self._waiting:
                    connection.close()  # nobody waits: hold no connection while idle
                    self._someone_waits.wait()
                wanted = list(self._waiting)
            try:
                found = ready_among(wanted)
            except Exception:  # a database hiccup must not end the watcher: the claims time out at worst
                log.exception("ready watcher: a look at the ready items failed")
                close_old_connections()
                found = set()
            with self._lock:
                for ready in found:
                    for event in self._waiting.get(ready, ()):
                        event.set()
            if not connection.in_atomic_block and connection.settings_dict.get("OPTIONS", {}).get("pool"):
                connection.close()  # back to the pool between looks
            threading.Event().wait(self.poll_seconds)


def ready_among(wanted: Iterable[ReadyFilter]) -> set[ReadyFilter]:
    """Which of `wanted` have a ready item now: one query for the host-bound ones (per-host agents),
    one for the rest (central adapters, by adapter and pool)."""
    by_host: dict[int, list[ReadyFilter]] = defaultdict(list)
    central: list[ReadyFilter] = []
    for w in wanted:
        if w.host_id is None:
            central.append(w)
        else:
            by_host[w.host_id].append(w)
    ready = WorkItem.objects.filter(state=WorkState.READY).order_by()
    found: set[ReadyFilter] = set()
    if by_host:
        for adapter, kind, pool_id, host_id in ready.filter(host_id__in=list(by_host)).values_list(
            "adapter", "kind", "pool_id", "host_id"
        ):
            found.update(w for w in by_host[host_id] if w.matches(adapter, kind, pool_id, host_id))
    if central:
        # One row per (adapter, kind, pool): the host does not matter to these claims.
        pooled = ready.filter(adapter__in={w.adapter for w in central}).values_list("adapter", "kind", "pool_id")
        for adapter, kind, pool_id in pooled.distinct():
            found.update(w for w in central if w.matches(adapter, kind, pool_id, 0))
    return found


watcher = ReadyWatcher()
