"""Worker liveness, written by each worker's heartbeat task and read by the health endpoint."""

from __future__ import annotations

import os

from opsplanner import clock
from opsplanner.models import WorkerHeartbeat


def worker_heartbeat_record(*, worker: str) -> WorkerHeartbeat:
    heartbeat, _ = WorkerHeartbeat.objects.update_or_create(
        worker=worker, defaults={"last_seen_at": clock.now(), "pid": os.getpid()}
    )
    return heartbeat
