"""Real Celery worker processes, on Redis and PostgreSQL, run the project's tasks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import transaction

from opsplanner import tasks
from opsplanner.models import Operation, OperationState, WorkerHeartbeat
from opsplanner.tasks import worker_heartbeat
from tests.processes import WorkerProcess, start_worker, wait_for
from tests.test_offboard_resubmission_elsewhere import an_install_waiting_with_a_resubmission_in_another_pool
from tests.test_resubmissions_shown_and_cancelled import events_of
from trains.models import Upgrade
from trains.services.offboarding import upgrade_offboard

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


def test_a_resubmission_an_offboarding_left_in_another_pool_is_cancelled_by_a_worker_once_if_delivered_twice(
    worker: WorkerProcess, settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    wanted, again, upgrade = an_install_waiting_with_a_resubmission_in_another_pool()
    settings.KICK_TASKS = True  # type: ignore[attr-defined]  # enqueued after the commit, as from a worker's tick
    task = tasks.resubmissions_left_cancel
    monkeypatch.setattr(task, "delay", lambda pk: [task.apply_async((pk,), queue=worker.queue) for _ in range(2)])

    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")

    def results() -> list[str]:  # how many tasks each delivery cancelled
        return re.findall(r"resubmissions_left_cancel\[[^]]+\] succeeded in [^:]+: (\d+)", worker.output())

    wait_for(lambda: len(results()) == 2, timeout=30, what="the worker to run both deliveries")
    assert sorted(results()) == ["0", "1"]  # the second found nothing left
    assert Operation.objects.get(pk=again.pk).state == OperationState.CANCELLED
    [cancelled] = events_of(again, "operation.cancelled")
    assert cancelled.data == {"tasks": 1, "with": wanted.pk}
