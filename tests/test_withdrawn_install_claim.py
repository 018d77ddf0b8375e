"""An install of a withdrawn version that the withdrawal's stop missed is never handed to an executor.

The stop (`installs_stop`) ends the installs no executor has claimed, but two windows left some
ready: another pool's tick that read the version before an offboarding committed makes its installs
ready after the stop, and a row another transaction held too long is left to it. Before, an executor
then claimed one, the host installed the withdrawn version, failed the pre-return gate and went
through repair. Now every claim path stops such an install as the withdrawal would (failed
unclaimed, not run), the tick ends its task not applied, and the others are handed out as usual
(tests/test_withdrawn_before_install.py for the stop itself)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable

import pytest
from django.db import connection, transaction

from fleet.models import ComponentVersion, Host, Pool, WithdrawnBy
from fleet.services.catalogue import component_version_release, component_version_withdraw
from opsplanner import clock
from opsplanner.models import Event, HostTask, Operation, OperationState, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.models.work_items import NOT_RUN_KEY, NotRunCode, VerifyClass
from opsplanner.roles import Role
from opsplanner.services.tick import pool_tick
from opsplanner.services.tick.closing import operations_close_finished
from opsplanner.services.work_items import (
    work_item_claim_next,
    work_item_report,
    work_item_report_claim_next,
    work_items_claim,
    work_items_claim_waiting,
)
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.driving import drive
from tests.test_withdrawn_before_install import (
    adhoc_drained,
    adhoc_installs_ready,
    all_in_service,
    assert_never_broken,
    assert_not_applied,
    hosts_running,
)
from tests.trains_builders import make_train
from trains.models import Upgrade
from trains.services.offboarding import upgrade_offboard
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def withdrawn_past_the_stop(component: str = "bios", version: str = "2.16.0") -> None:
    """The version withdrawn, its ready installs left ready: as the windows the stop misses leave them."""
    ComponentVersion.objects.filter(component__name=component, version=version).update(
        withdrawn_at=clock.now(), withdrawn_reason="bricks NICs", withdrawn_by=WithdrawnBy.OPERATOR
    )


def installs_of(operation: Operation) -> list[WorkItem]:
    return list(WorkItem.objects.filter(host_task__operation=operation, kind=WorkKind.EXECUTE).order_by("id"))


def assert_stopped_unclaimed(operation: Operation) -> None:
    for item in installs_of(operation):
        assert (item.state, item.attempts, item.claimed_by) == (WorkState.FAILED, 0, "")
        assert item.result == {NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN}
        assert item.outcome_reason == (
            "its install was stopped before any executor claimed it: its target was withdrawn (bricks NICs)"
        )
        failed = Event.objects.get(kind="work_item.failed", subject_id=item.pk)
        assert failed.data == {"from": WorkState.READY, "to": WorkState.FAILED, "never_claimed": True}
    assert not Event.objects.filter(kind="work_item.claimed", subject_id__in=[i.pk for i in installs_of(operation)])


def assert_ends_not_applied(pool: Pool, operation: Operation) -> None:
    drive(pool, until=lambda: all_in_service(pool))
    assert hosts_running("2.16.0") == set()
    assert_not_applied(list(operation.tasks.all()), "bios 2.16.0")
    assert_never_broken()


def test_a_claim_does_not_hand_out_an_install_whose_target_was_withdrawn_past_the_stop() -> None:
    pool, operation = adhoc_installs_ready(executor="external")
    withdrawn_past_the_stop()

    assert work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=10) == []

    assert_stopped_unclaimed(operation)
    assert_ends_not_applied(pool, operation)


def test_the_simulated_executor_never_installs_a_target_withdrawn_past_the_stop() -> None:
    pool, operation = adhoc_installs_ready()
    withdrawn_past_the_stop()

    assert_ends_not_applied(pool, operation)
    assert_stopped_unclaimed(operation)


def test_a_long_poll_does_not_hand_out_an_install_whose_target_was_withdrawn() -> None:
    _, operation = adhoc_installs_ready(executor="external")
    withdrawn_past_the_stop()

    assert work_items_claim_waiting(worker="agent", wait_seconds=0, kinds=[WorkKind.EXECUTE]) == []
    assert_stopped_unclaimed(operation)


def test_claiming_a_hosts_next_item_does_not_hand_out_an_install_whose_target_was_withdrawn() -> None:
    pool, operation = adhoc_installs_ready(executor="external")
    first, second = installs_of(operation)
    withdrawn_past_the_stop()

    assert work_item_claim_next(worker="agent", hosts=[(first.host_id, "external")]) == [None]
    # A report that claims the next item of its host (an item of the host's task, running for us).
    check = WorkItem.objects.create(
        kind=WorkKind.VERIFY,
        verify_class=VerifyClass.HEALTH,
        host_id=second.host_id,
        host_task_id=second.host_task_id,
        pool_id=pool.pk,
        adapter="external",
        state=WorkState.RUNNING,
        claimed_by="agent",
        claimed_at=clock.now(),
        attempts=1,
    )
    reported, following = work_item_report_claim_next(
        item_id=check.pk, worker="agent", key="k", outcome="done", result={"passed": True}
    )
    assert (reported.state, following) == (WorkState.DONE, None)
    assert_stopped_unclaimed(operation)


def test_the_api_claim_hands_out_the_other_items_and_not_the_withdrawn_ones() -> None:
    _, bios = adhoc_installs_ready(executor="external")
    _, driver = adhoc_installs_ready(executor="external", component="gpu-driver", version="560.35.03")
    withdrawn_past_the_stop()  # bios: its installs come first by id
    executor = role_client(Role.EXECUTOR)

    answer = executor.post("/api/work-items/claim/", {"kinds": ["execute"], "limit": 1}, format="json")

    assert answer.status_code == 200, answer.content
    (item,) = answer.json()
    assert (item["id"], item["state"], item["params"]["version"]) == (installs_of(driver)[0].pk, "running", "560.35.03")
    assert_stopped_unclaimed(bios)
    rest = executor.post("/api/work-items/claim/", {"kinds": ["execute"], "limit": 10}, format="json").json()
    assert [item["id"] for item in rest] == [installs_of(driver)[1].pk]


def test_an_install_given_back_after_a_claim_runs_on_though_its_target_is_withdrawn() -> None:
    # It may have started on the host: as for the stop, only an install no executor claimed is stopped.
    pool, _ = adhoc_installs_ready(executor="external", size=1)
    (claimed,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], lease_seconds=1)
    later = clock.now() + dt.timedelta(minutes=5)
    with clock.use_clock(lambda: later):
        pool_tick(pool_id=pool.pk, kick=False)  # its lease ran out: ready again, attempt 1 done
    assert WorkItem.objects.get(pk=claimed.pk).state == WorkState.READY
    withdrawn_past_the_stop()

    (again,) = work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE])

    assert (again.pk, again.state, again.attempts) == (claimed.pk, WorkState.RUNNING, 2)


@pytest.mark.django_db(transaction=True)
def test_an_install_another_pools_tick_makes_ready_during_an_offboarding_is_never_claimed() -> None:
    # Window (a): the offboarding locks its own pool only; pool B's tick reads the version before the
    # offboarding commits and makes its installs ready after the stop looked. A claim after the
    # commit used to hand them out.
    pool_b, operation = adhoc_drained(executor="external")
    pool_a, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    make_train(pool_a)
    upgrade = upgrade_create(pool=pool_a, component="bios", version="2.16.0", reason="release")
    offboarded, ticked, errors = threading.Event(), threading.Event(), []

    def offboard() -> None:
        try:
            with transaction.atomic():
                upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")
                offboarded.set()
                assert ticked.wait(10), "pool B's tick waited for the offboarding"
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    def tick_b() -> None:
        try:
            assert offboarded.wait(10)
            pool_tick(pool_id=pool_b.pk, kick=False)
            ticked.set()
        except Exception as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=offboard), threading.Thread(target=tick_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert {item.state for item in installs_of(operation)} == {WorkState.READY}  # missed by the stop

    assert work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=10) == []

    assert {item.state for item in installs_of(operation)} == {WorkState.FAILED}
    drive(pool_b, until=lambda: all_in_service(pool_b))
    assert not set(Host.objects.filter(pool=pool_b).values_list("pk", flat=True)) & hosts_running("2.16.0")
    assert {task.state for task in HostTask.objects.filter(operation=operation)} == {TaskState.CANCELLED}
    assert_never_broken()


STOPPED_WHY = "its install was stopped before any executor claimed it: its target was withdrawn (bricks NICs)"


def test_an_operation_whose_installs_a_claim_stopped_closes_cancelled_saying_why() -> None:
    # The claim cannot cancel it (it holds item rows, takes no pool lock): the tick that ends its
    # tasks does, as the withdrawal cancels the operations whose installs it stops.
    pool, operation = adhoc_installs_ready(executor="external")
    withdrawn_past_the_stop()
    assert work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=10) == []

    assert_ends_not_applied(pool, operation)

    operation.refresh_from_db()
    assert operation.state == OperationState.CANCELLED  # it installed nothing: not "completed"
    assert operation.cancelled_at is not None
    assert operation.closed_at is not None
    cancelled = Event.objects.get(kind="operation.cancelled", subject_id=operation.pk)
    assert (cancelled.reason, cancelled.data) == (STOPPED_WHY, {NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN})
    assert not Event.objects.filter(kind="operation.completed", subject_id=operation.pk).exists()


def test_the_sweep_over_pools_closes_such_an_operation_cancelled_too() -> None:
    # An operation over several pools whose last tasks finished in two ticks at once is closed by the
    # sweep, not by a pool's tick: the same rule. Reopened here as the tick left it then.
    pool, operation = adhoc_installs_ready(executor="external")
    withdrawn_past_the_stop()
    assert work_items_claim(worker="agent", kinds=[WorkKind.EXECUTE], limit=10) == []
    assert_ends_not_applied(pool, operation)
    Operation.objects.filter(pk=operation.pk).update(state=OperationState.OPEN, closed_at=None, cancelled_at=None)
    by_the_tick = Event.objects.get(kind="operation.cancelled", subject_id=operation.pk)

    assert operations_close_finished() == 1

    operation.refresh_from_db()
    assert operation.state == OperationState.CANCELLED
    cancelled = Event.objects.exclude(pk=by_the_tick.pk).get(kind="operation.cancelled", subject_id=operation.pk)
    assert (cancelled.reason, cancelled.data) == (STOPPED_WHY, {NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN})


def stopped_by_a_claim(version: ComponentVersion) -> None:
    withdrawn_past_the_stop()
    assert work_items_claim(worker="sim", adapter="simulated", kinds=[WorkKind.EXECUTE], limit=10) == []


def stopped_by_the_withdrawal(version: ComponentVersion) -> None:
    component_version_withdraw(version_id=version.pk, reason="bricks NICs")


@pytest.mark.parametrize("stop", [stopped_by_a_claim, stopped_by_the_withdrawal])
def test_an_operation_applied_on_one_host_whose_other_install_was_stopped_closes_cancelled(
    stop: Callable[[ComponentVersion], None],
) -> None:
    # The withdrawal cancels the operations whose installs it stops whatever their other hosts did;
    # one whose install a claim stopped closes the same way.
    pool, operation = adhoc_installs_ready()
    (claimed,) = work_items_claim(worker="sim", adapter="simulated", kinds=[WorkKind.EXECUTE], limit=1)
    work_item_report(
        item_id=claimed.pk, worker="sim", key="k", outcome="done", attempt=1, result={"versions": {"bios": "2.16.0"}}
    )
    bios = ComponentVersion.objects.get(component__name="bios", version="2.16.0")
    stop(bios)
    component_version_release(version_id=bios.pk, reason="a false alarm")  # the applied host passes the gate

    drive(pool, until=lambda: all_in_service(pool) and not Operation.objects.filter(state="open").exists())

    applied = HostTask.objects.get(pk=claimed.host_task_id)
    (stopped,) = operation.tasks.exclude(pk=applied.pk)
    assert (applied.state, stopped.state) == (TaskState.DONE, TaskState.CANCELLED)
    assert hosts_running("2.16.0") == {applied.host_id}
    operation.refresh_from_db()
    assert operation.state == OperationState.CANCELLED
    assert not Event.objects.filter(kind="operation.completed", subject_id=operation.pk).exists()


def test_an_operation_whose_installs_passed_their_deadline_unclaimed_after_the_withdrawal_closes_cancelled() -> None:
    # The other install the tick ends not applied (tick/advance.py _never_ran): made ready past the
    # stop, no executor came before its deadline. It installed nothing either: cancelled, as stopped.
    pool, operation = adhoc_installs_ready(executor="external")
    withdrawn_past_the_stop()
    later = clock.now() + dt.timedelta(days=1)
    with clock.use_clock(lambda: later):
        drive(pool, until=lambda: all_in_service(pool))

    assert hosts_running("2.16.0") == set()
    assert_not_applied(list(operation.tasks.all()), "bios 2.16.0")
    operation.refresh_from_db()
    assert operation.state == OperationState.CANCELLED  # it was "completed"
    cancelled = Event.objects.get(kind="operation.cancelled", subject_id=operation.pk)
    assert cancelled.data == {NOT_RUN_KEY: NotRunCode.TARGET_WITHDRAWN}
    late = "execute did not finish within its deadline of 5400 s, never claimed: bios 2.16.0 is withdrawn: bricks NICs"
    assert cancelled.reason == late
    assert not Event.objects.filter(kind="operation.completed", subject_id=operation.pk).exists()
