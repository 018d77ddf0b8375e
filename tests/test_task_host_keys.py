"""A lease and a work item name their host task and their host; the database makes the host the
task's host (one composite foreign key each), whoever writes, and leaves nothing behind."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import IntegrityError, transaction

from opsplanner.models import HostTask, Lease, Operation, WorkItem
from tests.builders import make_fleet

pytestmark = pytest.mark.django_db


def rejected(write: Callable[[], object], model: type) -> None:
    before = model.objects.count()
    with pytest.raises(IntegrityError, match="task_host_fk"), transaction.atomic():
        write()
    assert model.objects.count() == before


def a_task() -> tuple[HostTask, object]:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    operation = Operation.objects.create(kind="reboot", reason="keys", scope="hosts", requester="test", priority=100)
    task = HostTask.objects.create(operation=operation, host=hosts[0], pool_id=pool.pk, priority=100)
    return task, hosts[1]


def test_it_refuses_a_lease_on_another_host_than_its_tasks() -> None:
    task, other_host = a_task()
    rejected(
        lambda: Lease.objects.create(
            host=other_host, host_task=task, operation_id=task.operation_id, pool_id=task.pool_id
        ),
        Lease,
    )
    Lease.objects.create(host_id=task.host_id, host_task=task, operation_id=task.operation_id, pool_id=task.pool_id)


def test_it_refuses_a_work_item_on_another_host_than_its_tasks_or_for_no_task() -> None:
    task, other_host = a_task()
    rejected(
        lambda: WorkItem.objects.create(
            kind="drain", host=other_host, host_task=task, pool_id=task.pool_id, adapter="simulated"
        ),
        WorkItem,
    )
    rejected(
        lambda: WorkItem.objects.create(
            kind="drain", host_id=task.host_id, host_task_id=task.pk + 10_000, pool_id=task.pool_id, adapter="simulated"
        ),
        WorkItem,
    )


def test_it_refuses_moving_a_task_with_work_to_another_host() -> None:
    task, other_host = a_task()
    WorkItem.objects.create(
        kind="drain", host_id=task.host_id, host_task=task, pool_id=task.pool_id, adapter="simulated"
    )
    with pytest.raises(IntegrityError, match="task_host_fk"), transaction.atomic():
        HostTask.objects.filter(pk=task.pk).update(host=other_host)
    assert HostTask.objects.get(pk=task.pk).host_id == task.host_id
