"""Every way a host task fails or is cancelled records a failure code next to its reason, and rollout
policy reads the code: rewording a reason changes no offboarding decision."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from importlib import import_module

import pytest
from django.apps import apps as django_apps
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from fleet.models import Pool
from opsplanner.models import HostTask, Operation, TaskState, WorkItem, WorkKind
from opsplanner.models.operations import FailureCode
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator
from tests.trains_builders import make_train
from trains.models import Upgrade, UpgradePhase, UpgradeState
from trains.selectors_web import phases_with_counts
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create, upgrade_phase_failures, upgrades_phase_failures

pytestmark = pytest.mark.django_db


def one_host_reboot(**fields: object) -> tuple[Pool, Operation]:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    fields.setdefault("max_attempts", 1)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r", **fields)
    return pool, operation


def failed_task(pool: Pool, operation: Operation, **drive_options: object) -> HostTask:
    drive(pool, until=lambda: HostTask.objects.get(operation=operation).state == TaskState.FAILED, **drive_options)
    return HostTask.objects.get(operation=operation)


def act_as_external(results: dict[str, tuple[str, dict]]) -> None:
    """Claim every ready external item and report the outcome given for its kind."""
    for item in work_items_claim(worker="ext-1", limit=100):
        outcome, result = results[item.kind]
        work_item_report(
            item_id=item.pk, worker="ext-1", key=f"k-{item.pk}", outcome=outcome, result=result, reason="said no"
        )


# --- each failing path sets its code ----------------------------------------------------------------
def test_a_refused_drain_fails_the_task_with_the_code_drain_failed() -> None:
    instant_simulator(refusing_host_fraction=1)
    pool, operation = one_host_reboot()
    task = failed_task(pool, operation)
    assert task.failure_code == FailureCode.DRAIN_FAILED
    assert task.failure_reason.startswith("drain failed")


def test_a_failed_execution_fails_the_task_with_the_code_execute_failed() -> None:
    instant_simulator(execute_failure_rate=1)
    pool, operation = one_host_reboot()
    assert failed_task(pool, operation).failure_code == FailureCode.EXECUTE_FAILED


def test_a_failed_verification_fails_the_task_with_the_code_check_failed() -> None:
    instant_simulator(verify_failure_rate=1)
    pool, operation = one_host_reboot()
    assert failed_task(pool, operation).failure_code == FailureCode.CHECK_FAILED


def test_a_failed_return_to_service_fails_the_task_with_the_code_return_failed() -> None:
    instant_simulator()
    pool, operation = one_host_reboot(executor="external", drainer="external")
    results = {
        WorkKind.DRAIN: ("done", {}),
        WorkKind.EXECUTE: ("done", {}),
        WorkKind.VERIFY: ("done", {"passed": True}),
        WorkKind.UNDRAIN: ("failed", {}),
    }
    task = failed_task(pool, operation, each_round=lambda: act_as_external(results))
    assert task.failure_code == FailureCode.RETURN_FAILED
    assert WorkItem.objects.filter(host_task=task, kind=WorkKind.UNDRAIN, state="failed").exists()


def test_an_executor_reporting_an_unknown_version_fails_the_task_with_the_code_unknown_version() -> None:
    instant_simulator()
    pool, operation = one_host_reboot(executor="external")
    results = {WorkKind.EXECUTE: ("done", {"versions": {"gpu-driver": "0.0.0-nowhere"}})}
    task = failed_task(pool, operation, each_round=lambda: act_as_external(results))
    assert task.failure_code == FailureCode.UNKNOWN_VERSION


def test_a_version_that_breaks_compatibility_at_the_gate_fails_the_task_with_the_code_not_returnable() -> None:
    instant_simulator()
    pool, operation = one_host_reboot(executor="external")
    results = {
        WorkKind.EXECUTE: ("done", {}),
        WorkKind.VERIFY: ("done", {"passed": True, "versions": {"gpu-driver": "535.183.01"}}),
    }
    task = failed_task(pool, operation, each_round=lambda: act_as_external(results))
    assert task.failure_code == FailureCode.NOT_RETURNABLE


def test_cancelling_an_operation_gives_its_pending_tasks_the_code_cancelled() -> None:
    _, operation = one_host_reboot()

    assert operation_cancel(operation_id=operation.pk, reason="not needed after all") == 1

    task = HostTask.objects.get(operation=operation)
    assert (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.CANCELLED)


def test_the_api_shows_a_tasks_failure_code_next_to_its_reason() -> None:
    instant_simulator(refusing_host_fraction=1)
    pool, operation = one_host_reboot()
    task = failed_task(pool, operation)

    body = role_client().get(f"/api/host-tasks/{task.pk}/").json()

    assert body["failure_code"] == "drain_failed"
    assert body["failure_reason"] == task.failure_reason


def test_the_tick_writes_the_code_in_the_same_update_that_fails_the_task() -> None:
    instant_simulator()
    pool, operation = one_host_reboot(drainer="external")
    pool_tick(pool_id=pool.pk)
    act_as_external({WorkKind.DRAIN: ("failed", {})})

    with CaptureQueriesContext(connection) as queries:
        pool_tick(pool_id=pool.pk)

    task_updates = [q["sql"] for q in queries if q["sql"].startswith('UPDATE "opsplanner_hosttask"')]
    assert len(task_updates) == 1
    assert '"failure_code"' in task_updates[0]
    assert '"failure_reason"' in task_updates[0]
    assert HostTask.objects.get(operation=operation).failure_code == FailureCode.DRAIN_FAILED


# --- the database keeps codes and states together -----------------------------------------------------
def test_the_database_refuses_a_failed_task_without_a_failure_code() -> None:
    instant_simulator(refusing_host_fraction=1)
    pool, operation = one_host_reboot()
    task = failed_task(pool, operation)
    with pytest.raises(IntegrityError, match="host_task_failure_code_fits_state"), transaction.atomic():
        HostTask.objects.filter(pk=task.pk).update(failure_code="")


def test_the_database_refuses_a_failure_code_on_a_task_that_did_not_fail() -> None:
    _, operation = one_host_reboot()
    with pytest.raises(IntegrityError, match="host_task_failure_code_fits_state"), transaction.atomic():
        HostTask.objects.filter(operation=operation).update(failure_code=FailureCode.EXECUTE_FAILED)


def test_the_migration_gives_existing_failures_the_code_their_reason_meant() -> None:
    instant_simulator(refusing_host_fraction=1)
    reasons = {
        "drain failed: refused": FailureCode.DRAIN_FAILED,
        "return to service failed: timed out": FailureCode.RETURN_FAILED,
        "verification failed: health: down": FailureCode.CHECK_FAILED,
        "not returned: gpu-driver 535 does not work with cuda 12": FailureCode.NOT_RETURNABLE,
        "executor reported versions not in the catalogue: bios 0.1": FailureCode.UNKNOWN_VERSION,
        "upgrade failed: simulated upgrade failure": FailureCode.EXECUTE_FAILED,
    }
    tasks = [failed_task(*one_host_reboot()) for _ in reasons]
    _, pending = one_host_reboot()
    operation_cancel(operation_id=pending.pk, reason="r")
    with connection.cursor() as cursor:  # rows from before the column (rolled back with the test)
        cursor.execute("ALTER TABLE opsplanner_hosttask DROP CONSTRAINT host_task_failure_code_fits_state")
    for task, reason in zip(tasks, reasons, strict=True):
        HostTask.objects.filter(pk=task.pk).update(failure_reason=reason, failure_code="")
    HostTask.objects.filter(operation=pending).update(failure_code="")

    import_module("opsplanner.migrations.0009_host_task_failure_code").backfill_failure_codes(django_apps, None)

    codes = dict(HostTask.objects.filter(state=TaskState.FAILED).values_list("failure_reason", "failure_code"))
    assert codes == reasons
    assert HostTask.objects.get(operation=pending).failure_code == FailureCode.CANCELLED


# --- rollout policy reads codes -----------------------------------------------------------------------
@dataclass
class Rollout:
    train_id: int
    upgrade: Upgrade
    phase: UpgradePhase

    def failures(self) -> int:
        return upgrade_phase_failures(self.upgrade, self.phase)

    def train_decides(self) -> str:
        train_tick(train_id=self.train_id)
        self.upgrade.refresh_from_db()
        return self.upgrade.state


def rollout_with_failed_tasks(**simulator: object) -> Rollout:
    """An upgrade whose first visit's tasks have all failed, before the train has looked at them."""
    instant_simulator(**simulator)
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, failure_buffer_hosts=6)
    train = make_train(pool)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=1)
    train_tick(train_id=train.pk)
    tasks = HostTask.objects.filter(operation__visit_link__upgrade=upgrade)
    assert tasks.count() >= 2
    drive(pool, until=lambda: not tasks.exclude(state=TaskState.FAILED).exists())
    return Rollout(train.pk, upgrade, upgrade.phases.get(position=upgrade.current_phase))


def refused_drains() -> Rollout:
    return rollout_with_failed_tasks(refusing_host_fraction=1)


def failed_upgrades() -> Rollout:
    return rollout_with_failed_tasks(execute_by_kind={"upgrade": {"failure_rate": 1.0}})


def reword_every_failure(reason: str) -> None:
    HostTask.objects.filter(state=TaskState.FAILED).update(failure_reason=reason)


def test_a_drain_failure_does_not_count_toward_offboarding_while_an_execute_failure_does() -> None:
    drained = refused_drains()
    codes = set(HostTask.objects.filter(state=TaskState.FAILED).values_list("failure_code", flat=True))
    assert codes == {FailureCode.DRAIN_FAILED}
    executed = failed_upgrades()

    assert drained.failures() == 0
    assert executed.failures() >= 2
    assert drained.train_decides() == UpgradeState.ACTIVE
    assert executed.train_decides() == UpgradeState.OFFBOARDED


def test_rewording_a_drain_failure_as_an_upgrade_failure_does_not_offboard_the_upgrade() -> None:
    rollout = refused_drains()
    reword_every_failure("gpu-driver upgrade failed: the executor crashed")

    assert rollout.failures() == 0
    assert rollout.train_decides() == UpgradeState.ACTIVE


def test_rewording_an_execute_failure_as_a_drain_failure_still_offboards_the_upgrade() -> None:
    rollout = failed_upgrades()
    failures = rollout.failures()
    reword_every_failure("drain failed: the drainer refused")

    assert rollout.failures() == failures
    assert rollout.train_decides() == UpgradeState.OFFBOARDED
    assert f"{failures} hosts failed" in rollout.upgrade.state_reason


# --- the one phase-failure count ----------------------------------------------------------------------
def test_the_tick_the_single_upgrade_count_and_the_page_count_the_same_failures() -> None:
    rollout = failed_upgrades()
    upgrade, phase = rollout.upgrade, rollout.phase
    failed = HostTask.objects.filter(operation__visit_link__upgrade=upgrade, state=TaskState.FAILED).count()
    shown = {p.pk: p.failures for p in phases_with_counts([upgrade.pk])}

    assert rollout.failures() == failed
    assert upgrades_phase_failures([upgrade], {upgrade.pk: phase}) == {upgrade.pk: failed}
    assert shown[phase.pk] == failed


def test_a_restarted_phase_counts_only_the_failures_since_its_restart() -> None:
    rollout = failed_upgrades()
    latest = HostTask.objects.filter(state=TaskState.FAILED).latest("finished_at").finished_at
    since = HostTask.objects.filter(state=TaskState.FAILED, finished_at__gte=latest).count()

    UpgradePhase.objects.filter(pk=rollout.phase.pk).update(started_at=latest)
    rollout.phase.refresh_from_db()
    assert rollout.failures() == since > 0
    assert {p.pk: p.failures for p in phases_with_counts([rollout.upgrade.pk])}[rollout.phase.pk] == since

    UpgradePhase.objects.filter(pk=rollout.phase.pk).update(started_at=latest + dt.timedelta(seconds=1))
    rollout.phase.refresh_from_db()
    assert rollout.failures() == 0
