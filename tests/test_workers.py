"""Real Celery worker processes, on Redis and PostgreSQL, run the project's tasks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opsplanner.models import WorkerHeartbeat
from opsplanner.tasks import worker_heartbeat
from tests.processes import WorkerProcess, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    process = start_worker(tmp_path)
    try:
        wait_for(
            lambda: WorkerHeartbeat.objects.filter(worker=process.name).exists() or process.process.poll() is not None,
            timeout=60,
            what="the worker to report ready",
        )
        assert process.process.poll() is None, process.output()
        yield process
    finally:
        process.stop()


def test_a_worker_stamps_its_heartbeat_as_soon_as_it_is_ready(worker: WorkerProcess) -> None:
    heartbeat = WorkerHeartbeat.objects.get(worker=worker.name)
    assert heartbeat.pid != 0


def test_a_task_sent_through_redis_runs_in_the_worker_process(worker: WorkerProcess) -> None:
    first = WorkerHeartbeat.objects.get(worker=worker.name).last_seen_at

    worker_heartbeat.apply_async(queue=worker.queue)

    wait_for(
        lambda: WorkerHeartbeat.objects.get(worker=worker.name).last_seen_at > first,
        timeout=30,
        what="the worker to run the heartbeat task",
    )
    assert "opsplanner.tasks.worker_heartbeat" in worker.output()
    assert "succeeded" in worker.output()
