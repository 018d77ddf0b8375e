"""External executors claim, heartbeat and report work items; nothing is claimed twice or applied twice."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from opsplanner import clock
from opsplanner.models import Event, WorkItem, WorkKind, WorkState
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import (
    WorkItemConflict,
    work_item_heartbeat,
    work_item_report,
    work_items_claim,
)
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def external_drains(hosts: int = 4):
    pool, fleet_hosts = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external", executor="external")
    pool_tick(pool_id=pool.pk)
    return pool, fleet_hosts


def test_a_claim_takes_ready_items_and_marks_them_running_for_the_claimer() -> None:
    external_drains(3)
    items = work_items_claim(worker="drainer-a", kinds=["drain"], limit=2, lease_seconds=60)
    assert len(items) == 2
    assert {i.state for i in WorkItem.objects.filter(pk__in=[i.pk for i in items])} == {WorkState.RUNNING}
    assert {i.claimed_by for i in items} == {"drainer-a"}
    assert WorkItem.objects.filter(state=WorkState.READY).count() == 1
    assert Event.objects.filter(kind="work_item.claimed", actor="drainer-a").count() == 2


def test_a_retried_report_returns_the_first_answer_and_changes_nothing() -> None:
    external_drains(1)
    (item,) = work_items_claim(worker="drainer-a", limit=1)
    first = work_item_report(item_id=item.pk, worker="drainer-a", key="report-1", outcome="done")
    events = Event.objects.count()
    again = work_item_report(item_id=item.pk, worker="drainer-a", key="report-1", outcome="done")
    assert (again.pk, again.state, again.finished_at) == (first.pk, WorkState.DONE, first.finished_at)
    assert Event.objects.count() == events
    with pytest.raises(WorkItemConflict, match="already reported done with another key"):
        work_item_report(item_id=item.pk, worker="drainer-a", key="report-2", outcome="failed")


def test_only_the_claimer_may_report_or_heartbeat() -> None:
    external_drains(1)
    (item,) = work_items_claim(worker="drainer-a", limit=1)
    with pytest.raises(WorkItemConflict, match="running for drainer-a, not for drainer-b"):
        work_item_report(item_id=item.pk, worker="drainer-b", key="k", outcome="done")
    with pytest.raises(WorkItemConflict, match="running for drainer-a, not for drainer-b"):
        work_item_heartbeat(item_id=item.pk, worker="drainer-b")
    assert work_item_heartbeat(item_id=item.pk, worker="drainer-a", lease_seconds=600) > clock.now()


def test_a_report_with_a_malformed_result_is_refused_and_writes_nothing() -> None:
    external_drains(1)
    (item,) = work_items_claim(worker="drainer-a", limit=1)
    for outcome, result, message in [
        ("finished", {}, "The outcome is 'done' or 'failed'."),
        ("done", {"versions": ["560"]}, "result.versions maps component names"),
        ("done", {"versions": {"gpu-driver": 560}}, "result.versions maps component names"),
    ]:
        with pytest.raises(ValidationError, match=message):
            work_item_report(item_id=item.pk, worker="drainer-a", key="k", outcome=outcome, result=result)
    item.refresh_from_db()
    assert (item.state, item.report_key) == (WorkState.RUNNING, "")


def test_an_upgrade_report_must_name_the_new_version() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation_submit(
        kind="upgrade",
        component="gpu-driver",
        version="560.35.03",
        scope=f"pool {pool.name}",
        reason="r",
        executor="external",
        drainer="external",
    )
    pool_tick(pool_id=pool.pk)
    (drain,) = work_items_claim(worker="x", limit=1)
    work_item_report(item_id=drain.pk, worker="x", key="d", outcome="done")
    pool_tick(pool_id=pool.pk)
    (execute,) = work_items_claim(worker="x", kinds=["execute"], limit=1)
    assert execute.params == {
        "operation": execute.host_task.operation_id,
        "kind": "upgrade",
        "component": "gpu-driver",
        "version": "560.35.03",
    }
    with pytest.raises(ValidationError, match=r"result.versions\['gpu-driver'\], the new version"):
        work_item_report(item_id=execute.pk, worker="x", key="e", outcome="done", result={})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"limit": 0}, "Claim between 1 and 1000"),
        ({"lease_seconds": 0}, "The lease must be 1 to"),
        ({"kinds": ["flash"]}, "Unknown kinds: flash"),
        ({"worker": ""}, "Say who is claiming"),
    ],
)
def test_bad_claims_are_refused_with_the_reason(fields, message) -> None:
    arguments = {"worker": "w", **fields}
    with pytest.raises(ValidationError, match=message):
        work_items_claim(**arguments)


def test_an_item_whose_executor_stops_heartbeating_is_taken_back_then_failed_by_policy() -> None:
    pool, _ = external_drains(1)
    item = WorkItem.objects.get()
    WorkItem.objects.filter(pk=item.pk).update(max_attempts=2)
    start = clock.now()
    later = [start]

    with clock.use_clock(lambda: later[0]):
        work_items_claim(worker="gone", limit=1, lease_seconds=30)
        later[0] = start + dt.timedelta(seconds=31)
        pool_tick(pool_id=pool.pk)
        item.refresh_from_db()
        assert (item.state, item.claimed_by, item.attempts) == (WorkState.READY, "", 1)
        assert Event.objects.filter(kind="work_item.retaken", subject_id=item.pk).exists()

        work_items_claim(worker="gone-too", limit=1, lease_seconds=30)
        later[0] = start + dt.timedelta(seconds=70)
        pool_tick(pool_id=pool.pk)
    item.refresh_from_db()
    assert item.state == WorkState.FAILED
    assert item.outcome_reason == "gone-too stopped heartbeating on the last attempt (2)"


def test_a_heartbeat_that_lands_after_the_tick_read_the_lapsed_lease_keeps_the_last_attempt(monkeypatch) -> None:
    from opsplanner.services.tick import advance

    pool, _ = external_drains(1)
    item = WorkItem.objects.get()
    WorkItem.objects.filter(pk=item.pk).update(max_attempts=1)
    start = clock.now()
    later = [start]
    read = advance._OVERDUE_ITEMS

    class HeartbeatAfterTheRead:
        def rows(self, **params: object) -> list[tuple]:
            rows = read.rows(**params)
            work_item_heartbeat(item_id=item.pk, worker="slow", lease_seconds=30)
            return rows

    with clock.use_clock(lambda: later[0]):
        work_items_claim(worker="slow", limit=1, lease_seconds=30)
        later[0] = start + dt.timedelta(seconds=31)
        monkeypatch.setattr(advance, "_OVERDUE_ITEMS", HeartbeatAfterTheRead())
        pool_tick(pool_id=pool.pk)

    item.refresh_from_db()
    assert (item.state, item.claimed_by) == (WorkState.RUNNING, "slow")
    assert not Event.objects.filter(kind="work_item.failed", subject_id=item.pk).exists()


def test_a_drain_that_never_finishes_escalates_after_its_timeout() -> None:
    pool, _hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation = operation_submit(
        kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external", drain_timeout_s=60
    )
    pool_tick(pool_id=pool.pk)  # admitted now: the drain must finish within 60 s
    later = clock.now() + dt.timedelta(seconds=120)
    with clock.use_clock(lambda: later):
        pool_tick(pool_id=pool.pk)
    task = operation.tasks.get()
    assert task.state == "failed"
    assert task.failure_reason == "drain failed: drain did not finish within its deadline of 60 s"
    undrain = WorkItem.objects.get(kind=WorkKind.UNDRAIN)
    assert undrain.state == WorkState.READY  # the host goes back: the drainer is asked to return it


@pytest.mark.django_db(transaction=True)
def test_many_executors_claiming_at_once_never_get_the_same_item() -> None:
    external_drains(40)
    claimers = 6
    barrier = threading.Barrier(claimers)
    claimed: list[list[int]] = [[] for _ in range(claimers)]

    def claim(index: int) -> None:
        try:
            barrier.wait()
            while batch := work_items_claim(worker=f"drainer-{index}", limit=3):
                claimed[index].extend(item.pk for item in batch)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [pk for batch in claimed for pk in batch]
    assert len(everything) == 40
    assert len(set(everything)) == 40
    assert WorkItem.objects.filter(state=WorkState.RUNNING).count() == 40


def test_a_report_from_an_expired_claim_is_refused_even_under_the_same_worker_name() -> None:
    pool, _ = external_drains(1)
    start = clock.now()
    moment = [start]
    with clock.use_clock(lambda: moment[0]):
        (first,) = work_items_claim(worker="drainer", limit=1, lease_seconds=30)
        moment[0] = start + dt.timedelta(seconds=31)
        pool_tick(pool_id=pool.pk)  # taken back
        (second,) = work_items_claim(worker="drainer", limit=1, lease_seconds=30)
    assert (first.pk, first.attempts, second.attempts) == (second.pk, 1, 2)
    with pytest.raises(WorkItemConflict, match="is on attempt 2; the claim of attempt 1 expired"):
        work_item_report(item_id=first.pk, worker="drainer", key="old", outcome="done", attempt=1)
    with pytest.raises(WorkItemConflict):
        work_item_heartbeat(item_id=first.pk, worker="drainer", attempt=1)
    done = work_item_report(item_id=second.pk, worker="drainer", key="new", outcome="done", attempt=2)
    assert done.state == WorkState.DONE
