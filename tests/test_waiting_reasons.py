"""Every pending task says why it waits (invariant 5), even beyond the head of the queue that
admission examines one task at a time, and a quiet tick rewrites none of those reasons."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Pool
from opsplanner.models import HostTask, Operation, TaskState, WaitingCode
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db

# The admission budget these tests tick with: the head of the queue examined task by task is this
# long (in production at least HORIZON_MIN = 100 tasks), so a 16-host pool overflows it.
HORIZON = 6


def reboot(pool: Pool, *, scope: str = "", priority: int = 100, hold_reason: str = "") -> Operation:
    return operation_submit(
        kind="reboot",
        scope=scope or f"pool {pool.name}",
        reason="kernel parameters",
        priority=priority,
        hold_reason=hold_reason,
    )


def tick(pool: Pool):
    return pool_tick(pool_id=pool.pk, admit_budget=HORIZON, kick=False)


def turn(pool: Pool) -> tuple[str, str]:
    """What a task says that admission has not examined: new, or behind the head of the queue."""
    return (
        WaitingCode.QUEUED,
        f"waiting its turn in the queue of pool {pool.name} (higher priority first, then older first)",
    )


def hosts_scope(hosts) -> str:
    return "hosts: " + ", ".join(host.hostname for host in hosts)


def pending_reasons(pool: Pool) -> dict[int, tuple[str, str]]:
    rows = HostTask.objects.filter(pool_id=pool.pk, state=TaskState.PENDING).values_list(
        "id", "waiting_code", "waiting_reason"
    )
    return {task_id: (code, reason) for task_id, code, reason in rows}


def row_versions(pool: Pool) -> dict[int, str]:
    """Each task row's xmin: it changes whenever PostgreSQL writes the row, even to the same values."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, xmin::text FROM opsplanner_hosttask WHERE pool_id = %s", [pool.pk])
        return dict(cursor.fetchall())


def test_a_new_task_says_it_waits_its_turn_in_its_pool_before_any_tick() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=3)

    operation = reboot(pool)

    assert {(t.waiting_code, t.waiting_reason) for t in operation.tasks.all()} == {turn(pool)}


def test_every_pending_task_says_why_even_beyond_the_admission_horizon() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=8, planned_buffer_hosts=2)
    operation = reboot(pool)

    tick(pool)

    tasks = list(operation.tasks.order_by("-priority", "created_at", "id"))
    head, beyond = tasks[:HORIZON], tasks[HORIZON:]
    assert [t.state for t in head] == [TaskState.DRAINING] * 2 + [TaskState.PENDING] * 4
    full = (WaitingCode.PLANNED_BUFFER, f"planned buffer of pool {pool.name} is full (2 hosts)")
    assert {(t.waiting_code, t.waiting_reason) for t in head[2:]} == {full}
    assert len(beyond) == 10
    assert {(t.state, t.waiting_code, t.waiting_reason) for t in beyond} == {(TaskState.PENDING, *turn(pool))}


def test_tasks_left_without_a_reason_get_one_at_the_next_tick_even_beyond_the_horizon() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=8, planned_buffer_hosts=2)
    operation = reboot(pool)
    operation.tasks.update(waiting_code="", waiting_reason="")  # as tasks submitted before reasons were given

    report = tick(pool)

    assert all(code and reason for code, reason in pending_reasons(pool).values())
    assert report.counts["waiting_reasons_changed"] == 14  # 4 refused at the head, 10 behind it


def test_a_held_operation_beyond_the_horizon_says_it_is_held() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=8, planned_buffer_hosts=2)
    reboot(pool)
    held = reboot(pool, scope=hosts_scope(hosts[-2:]), priority=10, hold_reason="waiting for approval #7")
    paused = reboot(pool, scope=hosts_scope(hosts[-4:-2]), priority=10, hold_reason="train paused by alice")

    tick(pool)

    assert {(t.waiting_code, t.waiting_reason) for t in held.tasks.all()} == {
        (WaitingCode.HELD, "held: waiting for approval #7")
    }
    assert {(t.waiting_code, t.waiting_reason) for t in paused.tasks.all()} == {
        (WaitingCode.HELD, "held: train paused by alice")
    }
    assert all(code and reason for code, reason in pending_reasons(pool).values())
    before = {task.pk: row_versions(pool)[task.pk] for task in held.tasks.all()}
    tick(pool)
    assert {task_id: row_versions(pool)[task_id] for task_id in before} == before  # said once, not again


def test_a_tick_with_nothing_changed_rewrites_no_task_row() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=8, planned_buffer_hosts=2)
    reboot(pool)
    tick(pool)  # admits two; the four refused stay at the head, and two more join them
    tick(pool)  # which the second tick examines: from now on nothing moves until a drain finishes
    before = row_versions(pool)

    report = tick(pool)

    assert report.counts["waiting_reasons_changed"] == 0
    assert row_versions(pool) == before


def test_a_quiet_tick_costs_the_same_statements_for_a_queue_twice_as_long() -> None:
    statements = []
    for hosts_per_domain in (8, 16):
        pool, _ = make_fleet(domains=2, hosts_per_domain=hosts_per_domain, planned_buffer_hosts=2)
        reboot(pool)
        tick(pool)
        tick(pool)
        with CaptureQueriesContext(connection) as queries:
            tick(pool)
        statements.append(len(queries))
        assert all(code and reason for code, reason in pending_reasons(pool).values())
    assert statements[0] == statements[1]


def test_a_task_that_falls_behind_the_horizon_and_comes_back_always_has_a_true_reason() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=8, planned_buffer_hosts=10)
    first = reboot(pool, scope=hosts_scope(hosts[:1]), priority=500)
    low = reboot(pool, scope=hosts_scope(hosts[:1]), priority=10)
    tick(pool)
    tick(pool)
    task = low.tasks.get()
    assert (task.waiting_code, task.waiting_reason) == (WaitingCode.HOST_HELD, f"host held by operation #{first.pk}")

    # Higher-priority work now fills the head of the queue: the task is no longer examined, and
    # says where it stands instead of repeating what it was last told.
    urgent = reboot(pool, scope=hosts_scope(hosts[1:9]), priority=900)
    tick(pool)
    task.refresh_from_db()
    assert (task.waiting_code, task.waiting_reason) == turn(pool)

    # Back at the head, it is examined again and gets its own reason back.
    operation_cancel(operation_id=urgent.pk, reason="not needed after all")
    tick(pool)
    task.refresh_from_db()
    assert (task.waiting_code, task.waiting_reason) == (WaitingCode.HOST_HELD, f"host held by operation #{first.pk}")
