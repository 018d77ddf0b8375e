"""An advisor run whose worker dies mid-run is taken over by its redelivered task, never run twice at once.

A real Celery worker (late acks, reject_on_worker_lost) runs a live forecast; the test holds the live pool
table locked so the run stops in its snapshot, kills the worker's pool process there, and checks that
the message delivered again finishes the run instead of leaving it "running" for hours."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest

from opsplanner.models import AdvisorRun, AdvisorRunState, Event
from opsplanner.roles import Role
from simulation import advisor_runs
from simulation.advisor_runs import _run_lease, advisor_live_forecast_request, advisor_run_execute
from simulation.tasks import advisor_run
from tests import processes
from tests.faults_helpers import kill_pool_process, redelivered, sessions, wait_until_ready, worker_env
from tests.processes import start_worker, wait_for
from tests.test_simulation_from_live import live_pool
from tests.trains_builders import make_user


def run_events(run_id: int) -> list[str]:
    rows = Event.objects.filter(subject_type="opsplanner.advisorrun", subject_id=run_id).order_by("id")
    return list(rows.values_list("kind", flat=True))


@pytest.mark.workers
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # the worker reads what the test commits
def test_a_run_whose_worker_is_killed_mid_run_is_taken_over_by_its_redelivery_and_ends(
    tmp_path: Path, enqueued: list[int]
) -> None:
    name = live_pool()
    run = advisor_live_forecast_request(pool=name, days=1, policies=["rolling"], actor=make_user(Role.OPERATOR))
    worker = start_worker(tmp_path, extra_env=worker_env("advisor-worker"))
    try:
        wait_until_ready(worker)
        with psycopg.connect(processes.test_database_url()) as locker:
            # The run's snapshot reads the pools first: it waits here, running, until the test lets it go.
            locker.execute('LOCK TABLE "fleet_pool" IN ACCESS EXCLUSIVE MODE')
            task_id = advisor_run.apply_async((run.pk,), queue=worker.queue).id
            wait_for(lambda: sessions("advisor-worker", waiting_on_lock=True), timeout=60, what="the run mid-snapshot")
            assert AdvisorRun.objects.get(pk=run.pk).state == AdvisorRunState.RUNNING
            kill_pool_process(worker)
            wait_for(lambda: task_id in redelivered(worker.output()), timeout=30, what="the task delivered again")
            locker.rollback()
        finished = re.compile(rf"Task [\w.]+\[{task_id}\] (succeeded|raised)")
        wait_for(lambda: finished.search(worker.output()), timeout=120, what="the redelivered task to end")
    finally:
        worker.stop()

    run.refresh_from_db()
    assert run.state == AdvisorRunState.DONE, (run.state, run.failure_reason)
    assert run.result["pool"] == name
    assert run_events(run.pk) == [
        "advisor_run.requested",
        "advisor_run.started",
        "advisor_run.restarted",
        "advisor_run.done",
    ]


@pytest.mark.django_db
def test_a_delivery_while_a_live_worker_holds_the_run_leaves_it_alone(enqueued: list[int], monkeypatch) -> None:
    name = live_pool()
    run = advisor_live_forecast_request(pool=name, days=1, actor=make_user(Role.OPERATOR))
    AdvisorRun.objects.filter(pk=run.pk).update(state=AdvisorRunState.RUNNING, started_at=run.created_at)
    monkeypatch.setattr(advisor_runs, "_work", lambda run: pytest.fail("the run ran twice at once"))
    with _run_lease(run.pk) as held:  # the worker running it, alive
        assert held
        advisor_run_execute(run_id=run.pk)  # a duplicate delivery meanwhile
    run.refresh_from_db()
    assert run.state == AdvisorRunState.RUNNING
    assert run_events(run.pk) == ["advisor_run.requested"]


def test_under_sqlite_the_lease_is_a_file_lock_one_holder_at_a_time(settings, tmp_path: Path, monkeypatch) -> None:
    settings.VAR_DIR = tmp_path
    monkeypatch.setattr(advisor_runs, "connection", SimpleNamespace(vendor="sqlite"))
    with _run_lease(7) as first, _run_lease(7) as second, _run_lease(8) as other:
        assert (first, second, other) == (True, False, True)
    with _run_lease(7) as again:  # released with its holder
        assert again


@pytest.mark.django_db(transaction=True)  # the lease is taken on a connection of its own: it must see the run
def test_a_running_run_nobody_holds_is_handed_to_a_worker_again_and_one_held_is_left_alone(
    enqueued: list[int],
) -> None:
    from simulation.advisor_runs import advisor_runs_recover

    name = live_pool()
    operator = make_user(Role.OPERATOR)
    orphan = advisor_live_forecast_request(pool=name, days=1, actor=operator)
    AdvisorRun.objects.filter(pk=orphan.pk).update(state=AdvisorRunState.RUNNING, started_at=orphan.created_at)
    held = AdvisorRun.objects.create(
        kind=orphan.kind, params=orphan.params, requester="test", created_at=orphan.created_at,
        state=AdvisorRunState.RUNNING, started_at=orphan.created_at,
    )  # fmt: skip
    AdvisorRun.objects.create(  # queued: its own message is on its way
        kind=orphan.kind, params=orphan.params, requester="test", created_at=orphan.created_at
    )
    enqueued.clear()
    with _run_lease(held.pk) as holding:  # its worker, alive
        assert holding
        assert advisor_runs_recover() == [orphan.pk]
    assert enqueued == [orphan.pk]  # a queued run's own message is still on its way
    with _run_lease(orphan.pk) as free:  # the check let the lease go: the worker taking it over gets it
        assert free


@pytest.mark.workers
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_whose_whole_worker_died_is_finished_by_another_worker_without_waiting_for_the_broker(
    tmp_path: Path, enqueued: list[int], monkeypatch
) -> None:
    from simulation.advisor_runs import advisor_runs_recover

    name = live_pool()
    run = advisor_live_forecast_request(pool=name, days=1, policies=["rolling"], actor=make_user(Role.OPERATOR))
    # Marked running by a worker that is gone (its lease went with its connection): no message of it is
    # left to deliver within the hour, so only the recovery hands it to a worker.
    AdvisorRun.objects.filter(pk=run.pk).update(state=AdvisorRunState.RUNNING, started_at=run.created_at)
    worker = start_worker(tmp_path, extra_env=worker_env("advisor-worker-2"))
    try:
        wait_until_ready(worker)
        monkeypatch.setattr(
            advisor_runs, "_enqueue", lambda run_id: advisor_run.apply_async((run_id,), queue=worker.queue)
        )
        assert advisor_runs_recover() == [run.pk]
        wait_for(
            lambda: AdvisorRun.objects.get(pk=run.pk).state != AdvisorRunState.RUNNING,
            timeout=120,
            what="the run finished by the other worker",
        )
    finally:
        worker.stop()
    run.refresh_from_db()
    assert run.state == AdvisorRunState.DONE, (run.state, run.failure_reason)
    assert run_events(run.pk) == ["advisor_run.requested", "advisor_run.restarted", "advisor_run.done"]
