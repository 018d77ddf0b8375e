"""An escalated host (three repairs failed) waits for a human: retrying starts a new repair with three
attempts, releasing (fixed by hand) starts its verification; neither returns it unverified."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.core.exceptions import ValidationError

from fleet.models import Host, HostState
from opsplanner.models import Event, HostTask, Lease, OperationKind, TaskState, WorkItem, WorkKind
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.escalations import host_escalation_release, host_escalation_retry
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, in_threads, instant_simulator
from tests.test_security import database_state
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db


def escalated_host() -> tuple[object, Host]:
    """A pool of one host whose reboot and three repairs failed: the real path to escalation."""
    instant_simulator(execute_failure_rate=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r", max_attempts=1)
    drive(pool)
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.ESCALATED
    return pool, hosts[0]


def returned_to_service(host: Host, *, after: int) -> bool:
    return Event.objects.filter(
        kind="host.state_changed", host_id=host.pk, pk__gt=after, data__to=HostState.IN_SERVICE
    ).exists()


def test_retrying_an_escalated_host_starts_a_new_repair_at_once_and_records_who_and_why() -> None:
    pool, host = escalated_host()
    operator = make_user()
    operation = host_escalation_retry(host_id=host.pk, reason="reseated the GPU tray", actor=operator)

    task = HostTask.objects.get(operation=operation)
    assert operation.kind == OperationKind.REPAIR
    assert task.state == TaskState.RUNNING
    assert task.drain_key == task.pk
    assert Host.objects.get(pk=host.pk).state == HostState.REPAIR  # still counted as broken
    assert Lease.objects.get(host=host, active=True).host_task_id == task.pk
    assert list(WorkItem.objects.filter(host_task=task).values_list("kind", flat=True)) == [WorkKind.EXECUTE]
    event = Event.objects.get(kind="host.escalation_retried", host_id=host.pk)
    assert (event.actor_id, event.reason, event.data["operation"]) == (
        operator.pk,
        "reseated the GPU tray",
        operation.pk,
    )

    instant_simulator()  # this time the repair works
    drive(pool)  # and the invariants hold every round
    assert Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE
    assert HostTask.objects.get(pk=task.pk).state == TaskState.DONE


def test_releasing_a_host_fixed_by_hand_verifies_it_before_it_returns() -> None:
    pool, host = escalated_host()
    operation = host_escalation_release(host_id=host.pk, reason="replaced the PSU by hand", actor=make_user())

    task = HostTask.objects.get(operation=operation)
    assert task.state == TaskState.VERIFYING
    assert Host.objects.get(pk=host.pk).state == HostState.REPAIR
    kinds = set(WorkItem.objects.filter(host_task=task).values_list("kind", flat=True))
    assert kinds == {WorkKind.VERIFY}  # nothing executed: the operator did the repair

    instant_simulator()
    drive(pool)
    assert Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE
    assert Event.objects.filter(kind="host.escalation_released", host_id=host.pk).exists()


def test_a_released_host_that_fails_its_verification_never_returns_to_service() -> None:
    pool, host = escalated_host()
    mark = Event.objects.order_by("-id").values_list("id", flat=True).first()
    instant_simulator(verify_failure_rate=1, execute_failure_rate=1)
    host_escalation_release(host_id=host.pk, reason="swapped a cable, I think", actor=make_user())

    drive(pool)
    assert not returned_to_service(host, after=mark)
    assert Host.objects.get(pk=host.pk).state == HostState.ESCALATED  # back to a human after three repairs


@pytest.mark.parametrize("action", [host_escalation_retry, host_escalation_release])
def test_a_host_that_is_not_escalated_is_refused_and_nothing_is_written(action) -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=1)
    before = database_state()
    with pytest.raises(ValidationError) as refused:
        action(host_id=hosts[0].pk, reason="why not", actor=make_user())
    assert refused.value.code == "conflict"
    assert "not escalated" in refused.value.messages[0]
    assert database_state() == before


@pytest.mark.parametrize("action", [host_escalation_retry, host_escalation_release])
def test_a_retry_or_release_without_a_reason_is_refused_on_the_reason(action) -> None:
    _, host = escalated_host()
    with pytest.raises(ValidationError) as refused:
        action(host_id=host.pk, reason="  ", actor=make_user())
    assert "reason" in refused.value.message_dict
    assert Host.objects.get(pk=host.pk).state == HostState.ESCALATED


def test_an_unknown_host_is_not_found() -> None:
    with pytest.raises(ValidationError) as refused:
        host_escalation_retry(host_id=987_654_321, reason="x", actor=None)
    assert refused.value.code == "not_found"


@pytest.mark.django_db(transaction=True)
def test_operators_racing_to_retry_and_release_with_ticks_running_start_exactly_one_repair() -> None:
    pool, host = escalated_host()
    instant_simulator()
    barrier = threading.Barrier(4)
    taken: list[int] = []
    refusals: list[str | None] = []
    operators = [make_user() for _ in range(3)]

    def act(action, actor) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            try:
                taken.append(action(host_id=host.pk, reason="mine", actor=actor).pk)
            except ValidationError as refused:
                refusals.append(refused.code)

        return run

    def ticker() -> None:
        barrier.wait()
        for _ in range(5):
            pool_tick(pool_id=pool.pk)

    assert (
        in_threads(
            act(host_escalation_retry, operators[0]),
            act(host_escalation_release, operators[1]),
            act(host_escalation_retry, operators[2]),
            ticker,
        )
        == []
    )
    assert len(taken) == 1
    assert refusals == ["conflict", "conflict"]
    assert check_invariants() == []
    drive(pool)
    assert Host.objects.get(pk=host.pk).state == HostState.IN_SERVICE
