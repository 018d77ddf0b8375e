"""Train services racing the ticks, in real threads on PostgreSQL: a pause waits for a pool tick
judging its queue (it committed beside it, and the tick admitted the paused train's hosts after
the pause returned), and a version's withdrawal beside the train tick offboarding its upgrade
finishes (they took the version's and the upgrade's rows in opposite orders and deadlocked).
The windows are widened by a wait injected in one thread only."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from fleet.models import ComponentVersion, WithdrawnBy
from fleet.services.catalogue import component_version_withdraw
from opsplanner.models import Event, HostTask, TaskState
from opsplanner.services.tick import admission, pool_tick
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator
from tests.trains_builders import make_train
from trains.models import Train, TrainState, Upgrade, UpgradeState
from trains.services.tick import train_tick
from trains.services.trains import train_pause
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db(transaction=True)


def only_in(thread_name: str, before: Callable[[], None], original: Callable[..., Any]) -> Callable[..., Any]:
    """`original`, with `before()` run first in the thread named `thread_name`."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == thread_name:
            before()
        return original(*args, **kwargs)

    return wrapped


def named_threads(errors: list[BaseException], **targets: Callable[[], None]) -> list[threading.Thread]:
    def body(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(target,), name=name) for name, target in targets.items()]
    for thread in threads:
        thread.start()
    return threads


def test_a_pause_waits_for_a_pool_tick_judging_its_queue_and_no_host_is_admitted_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios")
    train_tick(train_id=train.pk)  # visit 1 starts: its 3 tasks wait in the core's queue
    read, go, paused = threading.Event(), threading.Event(), threading.Event()

    def hold_after_reading() -> None:
        read.set()
        go.wait(10)

    monkeypatch.setattr(admission, "_read_obstacles", only_in("tick", hold_after_reading, admission._read_obstacles))

    def pause() -> None:
        read.wait(10)
        train_pause(train_id=train.pk, reason="stop now: incident", actor="alice")
        paused.set()

    errors: list[BaseException] = []
    threads = named_threads(errors, tick=lambda: pool_tick(pool_id=pool.pk), pause=pause)
    assert read.wait(10)
    assert not paused.wait(1.0)  # the pause waits for the tick that judges the queue
    go.set()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert Train.objects.get(pk=train.pk).state == TrainState.PAUSED
    pause_event = Event.objects.get(kind="train.paused").pk
    admitted_after = Event.objects.filter(kind="task.state_changed", data__to=TaskState.ADMITTED, pk__gt=pause_event)
    assert not admitted_after.exists()
    pool_tick(pool_id=pool.pk)  # and no tick admits the paused train's work afterwards
    assert not Event.objects.filter(kind="task.state_changed", data__to=TaskState.ADMITTED, pk__gt=pause_event).exists()


def test_a_withdrawal_beside_the_train_tick_offboarding_the_same_upgrade_finishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instant_simulator(execute_by_kind={"upgrade:bios:2.16.0": {"failure_rate": 1.0}})
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
    train = make_train(pool)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios", max_failures=0)
    train_tick(train_id=train.pk)
    drive(pool, until=lambda: HostTask.objects.filter(pool_id=pool.pk, state=TaskState.FAILED).exists())
    offboarding = threading.Event()

    def hold_in_the_offboarding() -> None:
        offboarding.set()
        time.sleep(1.0)

    monkeypatch.setattr(ComponentVersion, "save", only_in("tick", hold_in_the_offboarding, ComponentVersion.save))

    def withdraw() -> None:
        offboarding.wait(10)
        component_version_withdraw(version_id=upgrade.component_version_id, reason="bricks hosts", actor="alice")

    errors: list[BaseException] = []
    for thread in named_threads(errors, tick=lambda: train_tick(train_id=train.pk), withdraw=withdraw):
        thread.join(60)

    assert errors == []
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED
    assert ComponentVersion.objects.get(pk=upgrade.component_version_id).withdrawn_at is not None


def as_the_train_tick_writes_an_upgrade(pool_id: int, upgrade_id: int, holding: threading.Event) -> None:
    """The train tick's lock order: the pool's tick lock (a late join, a catch-up), then an upgrade's
    row (its completion, graduation or promise), here with a pause between the two."""
    from django.db import transaction

    from fleet.models import Pool

    with transaction.atomic():
        Pool.objects.select_for_update(no_key=True).filter(pk=pool_id).values_list("pk").first()
        holding.set()
        time.sleep(1.0)
        Upgrade.objects.filter(pk=upgrade_id).update(priority=150)


@pytest.mark.parametrize("by", ["withdrawal", "offboarding"])
def test_an_operator_taking_an_upgrade_out_beside_the_train_tick_writing_it_finishes(by: str) -> None:
    # Offboarding wrote the upgrade's row, then cancelled its pending work under the pool's lock:
    # beside a tick holding the pool and about to write the upgrade, one of the two deadlocked.
    from django.db import transaction

    from trains.services.offboarding import upgrade_offboard

    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
    train = make_train(pool)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios")
    train_tick(train_id=train.pk)  # its visit's tasks are pending: the offboarding cancels them
    holding = threading.Event()

    def take_it_out() -> None:
        holding.wait(10)
        if by == "withdrawal":
            component_version_withdraw(version_id=upgrade.component_version_id, reason="bricks hosts", actor="alice")
            return
        with transaction.atomic():
            assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks hosts", actor="alice")

    errors: list[BaseException] = []
    tick = lambda: as_the_train_tick_writes_an_upgrade(pool.pk, upgrade.pk, holding)  # noqa: E731
    for thread in named_threads(errors, tick=tick, operator=take_it_out):
        thread.join(60)

    assert errors == []
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED


def test_a_re_onboarding_approved_beside_a_withdrawal_of_its_version_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Re-onboarding took the upgrade's row, then the version's, then (cancelling the rollbacks its
    # offboarding queued) the pool's; the withdrawal takes the pools, then the version: deadlocked.
    from django.db import transaction

    from opsplanner.services.approvals import approval_decide
    from tests.test_offboard_rollback import rollout_until_a_host_returns
    from tests.trains_builders import make_user
    from trains.services import reonboarding
    from trains.services.offboarding import upgrade_offboard

    _, upgrade, _ = rollout_until_a_host_returns(domains=2, hosts_per_domain=3)
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")
    approval = reonboarding.upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="fixed", actor=make_user())
    approver = make_user()
    holding = threading.Event()

    def hold_once_locked() -> None:
        holding.set()
        time.sleep(1.0)

    monkeypatch.setattr(
        reonboarding,
        "_withdrawal_made_elsewhere_refuse",
        only_in("reonboard", hold_once_locked, reonboarding._withdrawal_made_elsewhere_refuse),
    )

    def withdraw() -> None:
        holding.wait(10)
        component_version_withdraw(version_id=upgrade.component_version_id, reason="bricks hosts", actor="alice")

    def reonboard() -> None:
        approval_decide(approval_id=approval.pk, approve=True, reason="fix verified", actor=approver)

    errors: list[BaseException] = []
    for thread in named_threads(errors, reonboard=reonboard, withdraw=withdraw):
        thread.join(60)

    assert errors == []
    # Re-onboarded first, then withdrawn by the operator: offboarded again, the version theirs.
    assert Event.objects.filter(kind="upgrade.reonboarded", subject_id=upgrade.pk).exists()
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED
    assert ComponentVersion.objects.get(pk=upgrade.component_version_id).withdrawn_by == WithdrawnBy.OPERATOR
