"""Health of the web process (database reachable) and of the workers (recent heartbeats)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from opsplanner import clock
from opsplanner.models import WorkerHeartbeat


@dataclass(frozen=True)
class WorkerHealth:
    live_workers: list[str]
    stale_workers: list[str]
    newest_heartbeat: dt.datetime | None

    @property
    def healthy(self) -> bool:
        return bool(self.live_workers)


def database_reachable() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except Exception:  # noqa: BLE001 - any failure means "not reachable", reported as such
        return False


def worker_health() -> WorkerHealth:
    """Workers that stamped a heartbeat within three beat intervals count as live."""
    cutoff = clock.now() - dt.timedelta(seconds=3 * settings.WORKER_HEARTBEAT_SECONDS)
    live: list[str] = []
    stale: list[str] = []
    newest: dt.datetime | None = None
    for worker, seen in WorkerHeartbeat.objects.order_by("worker").values_list("worker", "last_seen_at"):
        (live if seen >= cutoff else stale).append(worker)
        newest = seen if newest is None or seen > newest else newest
    return WorkerHealth(live_workers=live, stale_workers=stale, newest_heartbeat=newest)
