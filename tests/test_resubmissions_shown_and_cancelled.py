"""A resubmission (the ad-hoc work a withdrawal asked for again, resubmission.py) is visible with its
original, both ways, in the API and on the operations' pages; and cancelling the original cancels
its resubmissions still open (transitively), each with its events, as the operator's cancel means the
work should not happen. A resubmission already finished is left alone. An original already completed
(its tasks all ended, the superseded ones too) cannot be cancelled: the resubmission is cancelled on
its own."""

from __future__ import annotations

import pytest

from fleet.models import Host
from fleet.services.catalogue import component_version_withdraw
from opsplanner.models import Event, HostTask, Operation, OperationState, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.roles import Role
from opsplanner.services.operation_cancel import operation_cancel
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator
from tests.test_superseded_resubmitted import (
    n_superseded_by_an_applied_n_plus_one,
    resubmissions_of,
    superseded,
    withdraw_n_plus_one,
)
from tests.test_superseded_versions import bios, bios_on, bios_upgrade
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db


def an_original_superseded_on_its_first_host() -> tuple[Operation, list[Host]]:
    """Two hosts asked for bios 2.16.0 (N) by an operator, the second in a pool never ticked here (its
    task waits): the first got 2.18.0 (N+1) first and its N task ended superseded. The original (open)
    and the hosts."""
    instant_simulator()
    pool, [first] = make_fleet(domains=1, hosts_per_domain=1)
    _, [waiting] = make_fleet(domains=1, hosts_per_domain=1)
    bios_upgrade([first], "2.18.0")  # first in the queue
    wanted = bios_upgrade([first, waiting], "2.16.0")
    drive(pool, until=lambda: superseded(wanted, first))
    return wanted, [first, waiting]


def an_open_original_resubmitted_on_its_first_host() -> tuple[Operation, Operation, list[Host]]:
    """As above, then 2.18.0 withdrawn and N asked again for the first host. The original (open), its
    resubmission (pending) and the hosts."""
    wanted, [first, waiting] = an_original_superseded_on_its_first_host()
    withdraw_n_plus_one()
    [again] = resubmissions_of(wanted)
    assert again.tasks.get().state == wanted.tasks.get(host=waiting).state == TaskState.PENDING
    return wanted, again, [first, waiting]


def events_of(operation: Operation, kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind, subject_type="opsplanner.operation", subject_id=operation.pk))


def test_cancelling_the_original_cancels_its_pending_resubmission_with_its_events() -> None:
    wanted, again, hosts = an_open_original_resubmitted_on_its_first_host()

    operation_cancel(operation_id=wanted.pk, reason="2.16.0 is not wanted after all", actor="op")

    again.refresh_from_db()
    task = again.tasks.get()
    assert again.state == OperationState.CANCELLED
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)
    [cancelled] = events_of(again, "operation.cancelled")
    assert cancelled.data == {"tasks": 1, "with": wanted.pk}
    assert "2.16.0 is not wanted after all" in cancelled.reason
    assert Event.objects.filter(kind="task.state_changed", subject_id=task.pk, data__to=TaskState.CANCELLED).exists()
    assert events_of(wanted, "operation.cancelled")[0].data == {"tasks": 1, "resubmissions": [again.pk]}
    drive(hosts[0].pool)
    assert bios_on(hosts[0]) == "2.14.0"  # rolled back, and N not installed again


def test_cancelling_the_original_cancels_the_resubmission_of_its_resubmission() -> None:
    wanted, again, hosts = an_open_original_resubmitted_on_its_first_host()
    # Asked again in turn (by hand here; a later withdrawal would, had `again` been superseded too).
    again_again = bios_upgrade(hosts[:1], "2.16.0", resubmission_of=again.pk)

    operation_cancel(operation_id=wanted.pk, reason="2.16.0 is not wanted after all", actor="op")

    assert Operation.objects.get(pk=again_again.pk).state == OperationState.CANCELLED
    assert events_of(again_again, "operation.cancelled")[0].data == {"tasks": 1, "with": wanted.pk}
    assert events_of(wanted, "operation.cancelled")[0].data["resubmissions"] == [again.pk, again_again.pk]


def test_a_resubmission_already_done_is_left_alone_and_its_own_open_one_cancelled_with_the_original() -> None:
    wanted, again, hosts = an_open_original_resubmitted_on_its_first_host()
    drive(hosts[0].pool, until=lambda: Operation.objects.get(pk=again.pk).state == OperationState.COMPLETED)
    assert Operation.objects.get(pk=wanted.pk).state == OperationState.OPEN  # the waiting host's N
    again_again = bios_upgrade(hosts[1:], "2.16.0", resubmission_of=again.pk)  # by hand, as above
    events_before = Event.objects.filter(subject_type="opsplanner.operation", subject_id=again.pk).count()

    operation_cancel(operation_id=wanted.pk, reason="2.16.0 is not wanted after all", actor="op")

    assert Operation.objects.get(pk=again.pk).state == OperationState.COMPLETED
    assert Event.objects.filter(subject_type="opsplanner.operation", subject_id=again.pk).count() == events_before
    assert bios_on(hosts[0]) == "2.16.0"
    assert Operation.objects.get(pk=again_again.pk).state == OperationState.CANCELLED
    assert events_of(wanted, "operation.cancelled")[0].data["resubmissions"] == [again_again.pk]


def test_withdrawing_the_target_of_an_original_and_its_resubmission_cancels_each_once() -> None:
    # The withdrawal cancels both; the original's cancel takes the resubmission with it, which then
    # is closed: cancelling it again refused, and the withdrawal with it.
    wanted, again, _ = an_open_original_resubmitted_on_its_first_host()

    component_version_withdraw(version_id=bios("2.16.0").pk, reason="2.16.0 bricks too", actor="op2")

    assert Operation.objects.get(pk=wanted.pk).state == OperationState.CANCELLED
    assert Operation.objects.get(pk=again.pk).state == OperationState.CANCELLED
    assert len(events_of(again, "operation.cancelled")) == 1


def test_the_api_shows_a_resubmission_and_its_original_both_ways(client) -> None:
    wanted, again, _ = an_open_original_resubmitted_on_its_first_host()
    client.force_login(make_user(Role.OPERATOR))

    original = client.get(f"/api/operations/{wanted.pk}/").json()
    resubmission = client.get(f"/api/operations/{again.pk}/").json()
    listed = {row["id"]: row for row in client.get("/api/operations/").json()["results"]}

    assert (original["resubmission_of"], original["resubmissions"]) == (None, [again.pk])
    assert (resubmission["resubmission_of"], resubmission["resubmissions"]) == (wanted.pk, [])
    assert (listed[wanted.pk]["resubmissions"], listed[again.pk]["resubmission_of"]) == ([again.pk], wanted.pk)


def test_the_pages_link_a_completed_original_and_its_resubmission_which_is_cancelled_on_its_own(client) -> None:
    wanted, _ = n_superseded_by_an_applied_n_plus_one()
    withdraw_n_plus_one()
    [again] = resubmissions_of(wanted)
    client.force_login(make_user(Role.OPERATOR))

    original_page = client.get(f"/operations/{wanted.pk}/").content.decode()
    resubmission_page = client.get(f"/operations/{again.pk}/").content.decode()

    assert Operation.objects.get(pk=wanted.pk).state == OperationState.COMPLETED  # nothing left to cancel there
    assert f'href="/operations/{again.pk}/">#{again.pk}</a>' in original_page
    assert "Resubmitted as" in original_page
    assert "Cancel operation" not in original_page
    assert f'href="/operations/{wanted.pk}/">#{wanted.pk}</a>' in resubmission_page
    assert "Resubmission of" in resubmission_page
    assert "Cancel operation" in resubmission_page
    client.post(f"/operations/{again.pk}/cancel/", {"reason": "2.16.0 is not wanted after all"})
    assert HostTask.objects.get(operation=again).state == TaskState.CANCELLED
