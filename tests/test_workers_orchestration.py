"""The whole lifecycle driven by real Celery processes: two workers and the beat, on Redis and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.models import Host, HostState, InstalledVersion
from opsplanner.models import HostTask, TaskState, WorkerHeartbeat
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.processes import WorkerProcess, start_beat, start_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]


@pytest.fixture
def celery_processes(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    first = start_worker(tmp_path, extra_env={"TICK_SECONDS": "1"})
    second = start_worker(tmp_path, queue=first.queue, extra_env={"TICK_SECONDS": "1"})
    beat = start_beat(tmp_path, queue=first.queue, extra_env={"TICK_SECONDS": "1"})
    processes = [first, second, beat]
    try:
        wait_for(
            lambda: WorkerHeartbeat.objects.filter(worker__in=[first.name, second.name]).count() == 2,
            timeout=60,
            what="two workers",
        )
        yield processes
    finally:
        for process in processes:
            process.stop()


def test_workers_take_an_upgrade_through_every_host_and_return_them_verified(celery_processes) -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=3, hosts_per_domain=4, planned_buffer_hosts=4)
    operation = operation_submit(
        kind="upgrade", component="gpu-driver", version="560.35.03", scope=f"pool {pool.name}", reason="rollout"
    )
    reboot = operation_submit(kind="reboot", scope=f"domain {pool.name}/rack-0002", reason="kernel args")

    def finished() -> bool:
        assert check_invariants() == [], "an invariant broke while the workers ran"
        return not HostTask.objects.exclude(state__in=[TaskState.DONE, TaskState.HANDED_OVER]).exists()

    wait_for(finished, timeout=120, what="all host tasks to finish", interval=0.5)

    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
    versions = InstalledVersion.objects.filter(host__pool=pool, component__name="gpu-driver")
    assert set(versions.values_list("version__version", flat=True)) == {"560.35.03"}
    assert operation.tasks.count() == 12
    assert reboot.tasks.count() == 4
    # Both workers did part of the work.
    logs = [process.output() for process in celery_processes[:2]]
    assert all("opsplanner.tasks.pool_tick" in log or "opsplanner.tasks.tick" in log for log in logs)
