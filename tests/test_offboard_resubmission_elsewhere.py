"""An offboarding from a pool's tick takes no other pool's lock, so its cancel leaves the resubmissions
of its work whose tasks are in another pool (their hosts moved pools since): an event on each says
so, and they are cancelled after the tick commits, outside it (a worker's task carrying the
original's id, or in-process without workers, as in the simulator). Cancelling them again changes
nothing."""

from __future__ import annotations

import pytest
from django.db import transaction

from opsplanner.models import Event, Operation, OperationState, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.services.housekeeping import resubmissions_left_sweep
from opsplanner.services.operation_cancel import resubmissions_left_cancel
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_items_claim
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator
from tests.test_resubmissions_shown_and_cancelled import events_of
from tests.test_superseded_versions import bios_upgrade
from tests.test_withdrawn_before_install import adhoc_installs_ready
from tests.test_withdrawn_install_claim import withdrawn_past_the_stop
from trains.models import Upgrade
from trains.services.offboarding import upgrade_offboard
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def an_install_waiting_with_a_resubmission_in_another_pool() -> tuple[Operation, Operation, Upgrade]:
    """An operator's bios 2.16.0 in pool A whose install waits, ready, for an executor (an offboarding
    of 2.16.0 stops it and cancels the operation), asked again for a host now in pool B (never ticked
    here: its task waits), and an upgrade of pool A to 2.16.0. The original, its resubmission and the
    upgrade."""
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    _, elsewhere = make_fleet(domains=1, hosts_per_domain=1)
    wanted = bios_upgrade(hosts, "2.16.0")
    installs = WorkItem.objects.filter(host_task__operation=wanted, kind=WorkKind.EXECUTE, state=WorkState.READY)
    for _ in range(20):
        pool_tick(pool_id=pool.pk, kick=False)
        if installs.exists():
            break
        simulated_work_step()
    assert installs.exists()
    again = bios_upgrade(elsewhere, "2.16.0", resubmission_of=wanted.pk)  # by hand: its host moved pools
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="the rest of the pool")
    return wanted, again, upgrade


def test_an_offboarding_leaves_a_resubmission_in_another_pool_to_after_its_commit_with_an_event_saying_so(
    django_capture_on_commit_callbacks,
) -> None:
    wanted, again, upgrade = an_install_waiting_with_a_resubmission_in_another_pool()

    with django_capture_on_commit_callbacks(execute=False) as after_commit, transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")

    assert Operation.objects.get(pk=wanted.pk).cancelled_at is not None  # its install stopped, it closes cancelled
    assert Operation.objects.get(pk=again.pk).state == OperationState.OPEN  # the tick took no lock of its pool
    [deferred] = events_of(again, "operation.cancel_deferred")
    assert deferred.data == {"with": wanted.pk, "within_pool": upgrade.pool_id}
    # One follow-up, carrying the original's id (the live pages' announcements aside).
    assert [getattr(callback, "args", None) for callback in after_commit].count((wanted.pk,)) == 1


def test_the_resubmission_an_offboarding_left_is_cancelled_after_its_commit_and_again_changes_nothing(
    django_capture_on_commit_callbacks,
) -> None:
    wanted, again, upgrade = an_install_waiting_with_a_resubmission_in_another_pool()

    # No workers in this process (KICK_TASKS off, as in the simulator): cancelled here after the commit.
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")

    again.refresh_from_db()
    assert again.state == OperationState.CANCELLED
    assert again.tasks.get().state == TaskState.CANCELLED
    [cancelled] = events_of(again, "operation.cancelled")
    assert cancelled.data == {"tasks": 1, "with": wanted.pk}
    events = Event.objects.count()
    assert resubmissions_left_cancel(operation_id=wanted.pk) == 0  # delivered twice
    assert Event.objects.count() == events


def test_an_open_operation_never_cancelled_has_nothing_cancelled_by_a_stray_delivery() -> None:
    wanted, again, _ = an_install_waiting_with_a_resubmission_in_another_pool()

    assert resubmissions_left_cancel(operation_id=wanted.pk) == 0

    assert Operation.objects.get(pk=again.pk).state == OperationState.OPEN
    assert Operation.objects.get(pk=wanted.pk).state == OperationState.OPEN


def test_a_resubmission_whose_follow_up_was_lost_is_cancelled_by_the_housekeeping_sweep_once(
    django_capture_on_commit_callbacks,
) -> None:
    wanted, again, upgrade = an_install_waiting_with_a_resubmission_in_another_pool()
    # The follow-up lost (a crash, or the broker down, between the tick's commit and the enqueue).
    with django_capture_on_commit_callbacks(execute=False), transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")
    assert Operation.objects.get(pk=again.pk).state == OperationState.OPEN

    assert resubmissions_left_sweep() == 1

    again.refresh_from_db()
    assert again.state == OperationState.CANCELLED
    assert [e.data for e in events_of(again, "operation.cancelled")] == [{"tasks": 1, "with": wanted.pk}]
    assert resubmissions_left_sweep() == 0  # the next sweep finds nothing open


def test_the_sweep_leaves_the_resubmission_of_an_operation_closed_cancelled_for_its_stopped_install() -> None:
    # Closed cancelled by the tick (a claim stopped its install: tick/closing.py), not by a cancel
    # that left its resubmission to after its commit: nothing was deferred, and the sweep's reason
    # ("a tick of another pool cancelled it") would be false.
    pool, wanted = adhoc_installs_ready(executor="external")
    _, elsewhere = make_fleet(domains=1, hosts_per_domain=1)
    again = bios_upgrade(elsewhere, "2.16.0", resubmission_of=wanted.pk)
    withdrawn_past_the_stop()
    assert work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=10) == []
    drive(pool, until=lambda: Operation.objects.get(pk=wanted.pk).state != OperationState.OPEN)
    assert Operation.objects.get(pk=wanted.pk).cancelled_at is not None

    assert resubmissions_left_sweep() == 0

    assert Operation.objects.get(pk=again.pk).state == OperationState.OPEN
    assert events_of(again, "operation.cancelled") == []
