"""Operations go through admission, drain, work, verification and return, one drain per host."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import Count

from fleet import services as fleet_services
from fleet.models import Host, HostState, InstalledVersion
from fleet.selectors.capacity import pool_capacity
from opsplanner.models import (
    Event,
    HostTask,
    Lease,
    Operation,
    OperationState,
    TaskState,
    WaitingCode,
    WorkItem,
    WorkKind,
)
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.builders import make_fleet, make_service, make_version
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db


def upgrade(pool, version="560.35.03", component="gpu-driver", **fields):
    fields.setdefault("reason", "driver rollout")
    return operation_submit(kind="upgrade", component=component, version=version, scope=f"pool {pool.name}", **fields)


def installed(host, component="gpu-driver") -> str:
    return InstalledVersion.objects.get(host=host, component__name=component).version.version


def test_an_upgrade_reaches_every_host_without_exceeding_the_planned_buffer() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=5, planned_buffer_hosts=3)
    operation = upgrade(pool)
    peak = []

    drive(pool, each_round=lambda: peak.append(pool_capacity(pool).planned_out))

    assert max(peak) <= 3
    assert {installed(h) for h in hosts} == {"560.35.03"}
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
    assert set(operation.tasks.values_list("state", flat=True)) == {TaskState.DONE}
    assert Operation.objects.get(pk=operation.pk).state == OperationState.COMPLETED
    assert not Lease.objects.filter(active=True).exists()


def test_three_pending_upgrades_for_the_same_hosts_cost_one_drain_per_host() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=4)
    first = upgrade(pool, priority=300)
    upgrade(pool, component="bios", version="2.16.0", priority=200)
    reboot = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="kernel parameters", priority=100)

    drive(pool)

    drains = WorkItem.objects.filter(kind=WorkKind.DRAIN).values("host_id").annotate(n=Count("id"))
    assert {row["n"] for row in drains} == {1}
    assert len(drains) == 4
    assert {installed(h) for h in hosts} == {"560.35.03"}
    assert {installed(h, "bios") for h in hosts} == {"2.16.0"}
    # The first upgrade drained each host and handed it over; the last one verified and returned it.
    assert set(first.tasks.values_list("state", flat=True)) == {TaskState.HANDED_OVER}
    assert set(reboot.tasks.values_list("state", flat=True)) == {TaskState.DONE}
    assert WorkItem.objects.filter(kind=WorkKind.VERIFY).count() == 4 * 3


def test_overlapping_operations_run_one_after_the_other_in_priority_order() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    low = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="low", priority=10)
    high = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="high", priority=900)

    pool_tick(pool_id=pool.pk)

    assert HostTask.objects.get(operation=high).state == TaskState.DRAINING
    waiting = HostTask.objects.get(operation=low)
    assert waiting.state == TaskState.PENDING
    assert (waiting.waiting_code, waiting.waiting_reason) == (
        WaitingCode.QUEUED,
        f"queued behind operation #{high.pk} on this host",
    )
    pool_tick(pool_id=pool.pk)
    waiting.refresh_from_db()
    assert (waiting.waiting_code, waiting.waiting_reason) == (
        WaitingCode.HOST_HELD,
        f"host held by operation #{high.pk}",
    )

    drive(pool)
    first, second = HostTask.objects.get(operation=high), HostTask.objects.get(operation=low)
    assert first.finished_at <= second.admitted_at
    # One drain: the urgent reboot ran first and handed the drained host to the other one.
    assert (first.state, second.state) == (TaskState.HANDED_OVER, TaskState.DONE)
    assert WorkItem.objects.filter(kind=WorkKind.DRAIN).count() == 1


def test_a_full_planned_buffer_is_the_recorded_reason_for_waiting() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=1)
    upgrade(pool)

    pool_tick(pool_id=pool.pk)

    states = dict(HostTask.objects.values("state").annotate(n=Count("id")).values_list("state", "n"))
    assert states == {TaskState.DRAINING: 1, TaskState.PENDING: 3}
    reasons = set(HostTask.objects.filter(state=TaskState.PENDING).values_list("waiting_code", "waiting_reason"))
    assert reasons == {(WaitingCode.PLANNED_BUFFER, f"planned buffer of pool {pool.name} is full (1 hosts)")}


def test_an_opt_out_window_keeps_its_hosts_in_service_and_says_so() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    service = make_service(name="llm-pretrain")
    fleet_services.service_place(service=service, hosts=[hosts[0]])
    now = dt.datetime.now(dt.UTC)
    window = fleet_services.optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=2), reason="ckpt"
    )
    upgrade(pool)

    pool_tick(pool_id=pool.pk)

    held_back = HostTask.objects.get(host=hosts[0])
    assert held_back.state == TaskState.PENDING
    assert held_back.waiting_code == WaitingCode.OPTOUT
    assert held_back.waiting_reason.startswith(f"opt-out window #{window.pk} of service llm-pretrain until")
    assert HostTask.objects.get(host=hosts[1]).state == TaskState.DRAINING


def test_an_emergency_ignores_opt_out_windows() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    service = make_service()
    fleet_services.service_place(service=service, hosts=hosts)
    now = dt.datetime.now(dt.UTC)
    fleet_services.optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=2), reason="x"
    )
    upgrade(pool, source="emergency")
    pool_tick(pool_id=pool.pk)
    assert HostTask.objects.get().state == TaskState.DRAINING


def test_a_capacity_reservation_lowers_what_may_go_out_and_is_named() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=4)
    now = dt.datetime.now(dt.UTC)
    reservation = fleet_services.reservation_create(
        service=make_service(name="launch"),
        pool=pool,
        min_hosts_in_service=5,
        starts_at=now - dt.timedelta(minutes=1),
        ends_at=now + dt.timedelta(hours=1),
        reason="launch day",
    )
    upgrade(pool)

    pool_tick(pool_id=pool.pk)

    assert HostTask.objects.filter(state=TaskState.DRAINING).count() == 1
    waiting = HostTask.objects.filter(state=TaskState.PENDING).first()
    assert waiting.waiting_code == WaitingCode.RESERVATION
    assert f"reservation #{reservation.pk} of service launch keeps 5 hosts" in waiting.waiting_reason


def test_a_failed_execution_sends_the_host_to_repair_and_back() -> None:
    instant_simulator(execute_failure_rate=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation = upgrade(pool, max_attempts=1)

    def repaired_once() -> bool:
        return Event.objects.filter(kind="operation.submitted", data__kind="repair").exists()

    drive(pool, until=repaired_once)
    assert HostTask.objects.get(operation=operation).state == TaskState.FAILED
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.REPAIR
    assert pool_capacity(pool).failure_out == 1

    instant_simulator()  # the repair itself succeeds
    drive(pool)
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
    assert installed(hosts[0]) == "550.127.05"  # the failed upgrade left the old version


def test_a_host_that_fails_repair_three_times_is_escalated_and_stays_out() -> None:
    instant_simulator(execute_failure_rate=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r", max_attempts=1)
    drive(pool)
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.ESCALATED
    assert Event.objects.filter(kind="host.escalated", host_id=hosts[0].pk).exists()
    assert not Lease.objects.filter(active=True).exists()


def test_a_failed_verification_keeps_the_host_out_of_service() -> None:
    instant_simulator(verify_failure_rate=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation = upgrade(pool)
    drive(pool, until=lambda: HostTask.objects.get(operation=operation).state == TaskState.FAILED)
    task = HostTask.objects.get(operation=operation)
    assert task.failure_reason.startswith("verification failed: ")
    assert Host.objects.get(pk=hosts[0].pk).state in (HostState.FAILED, HostState.REPAIR)


def test_a_refused_drain_fails_the_task_with_the_reason_and_returns_the_host() -> None:
    instant_simulator(refusing_host_fraction=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation = upgrade(pool)
    drive(pool)
    task = HostTask.objects.get(operation=operation)
    assert task.state == TaskState.FAILED
    assert task.failure_reason == f"drain failed: the simulated drainer refuses host {hosts[0].pk}"
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE


def test_a_version_reported_at_verification_that_breaks_compatibility_never_returns() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r", executor="external")

    def health_check_finds_an_old_driver(item: WorkItem) -> dict:
        if item.kind == WorkKind.VERIFY and item.verify_class == "health":
            return {"passed": True, "versions": {"gpu-driver": "535.183.01"}}
        return {"passed": True} if item.kind == WorkKind.VERIFY else {}

    drive(
        pool,
        each_round=lambda: run_external_items(health_check_finds_an_old_driver),
        until=lambda: HostTask.objects.get(operation=operation).state == TaskState.FAILED,
    )
    task = HostTask.objects.get(operation=operation)
    assert "gpu-driver 535.183.01 does not work with cuda-runtime 12.4.1" in task.failure_reason
    drive(pool)  # repairs cannot fix a version: the host is escalated and never returns
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.ESCALATED


def run_external_items(result_for) -> None:
    """Act as an external executor: claim every ready external item and report it done."""
    for item in work_items_claim(worker="ext-1", limit=100):
        work_item_report(item_id=item.pk, worker="ext-1", key=f"k-{item.pk}", outcome="done", result=result_for(item))


def test_the_simulator_fails_only_the_operation_kinds_it_is_told_to() -> None:
    instant_simulator(execute_by_kind={"upgrade": {"failure_rate": 1}})
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    failing = operation_submit(
        kind="upgrade",
        component="gpu-driver",
        version="560.35.03",
        max_attempts=1,
        scope=f"hosts: {hosts[0].hostname}",
        reason="r",
    )
    fine = operation_submit(kind="reboot", scope=f"hosts: {hosts[1].hostname}", reason="r")
    drive(pool, until=lambda: HostTask.objects.get(operation=failing).state == TaskState.FAILED)
    drive(pool, until=lambda: HostTask.objects.get(operation=fine).state == TaskState.DONE)
    assert HostTask.objects.get(operation=failing).failure_reason == "upgrade failed: simulated upgrade failure"


def test_a_bad_simulator_profile_is_refused() -> None:
    from django.core.exceptions import ValidationError

    from opsplanner.models import SimulatorProfile

    profile = SimulatorProfile.current()
    profile.execute_by_kind = {"upgrade": {"failure_rate": 2}}
    with pytest.raises(ValidationError, match="failure_rate is between 0 and 1"):
        profile.full_clean()
    profile.execute_by_kind = {"teleport": {}}
    with pytest.raises(ValidationError, match="'teleport' is not an operation kind"):
        profile.full_clean()


def test_a_check_finishing_while_the_tick_runs_is_acted_on_once_by_the_next_tick(monkeypatch) -> None:
    """Regression: the last verification finished between the tick's reads; the tick must not run
    the pre-return gate for it (the next one does), or a later tick would run it twice."""
    import opsplanner.services.tick.advance as advance

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r", executor="external")

    def execute_only() -> None:
        for item in work_items_claim(worker="ext", kinds=["execute"], limit=10):
            work_item_report(item_id=item.pk, worker="ext", key=f"e{item.pk}", outcome="done")

    drive(pool, each_round=execute_only, until=lambda: WorkItem.objects.filter(kind=WorkKind.VERIFY).count() == 3)
    checks = list(work_items_claim(worker="ext", kinds=["verify"], limit=3))
    for item in checks[:2]:
        work_item_report(item_id=item.pk, worker="ext", key=f"v{item.pk}", outcome="done", result={"passed": True})
    original = advance.task_refs_by_id

    def third_check_lands_meanwhile(ids):
        monkeypatch.setattr(advance, "task_refs_by_id", original)
        work_item_report(item_id=checks[2].pk, worker="ext", key="v3", outcome="done", result={"passed": True})
        return original(ids)

    monkeypatch.setattr(advance, "task_refs_by_id", third_check_lands_meanwhile)
    pool_tick(pool_id=pool.pk)
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.VERIFYING  # not yet: the third is not consumed
    pool_tick(pool_id=pool.pk)
    assert Host.objects.get(pk=hosts[0].pk).state in (HostState.RETURNING, HostState.IN_SERVICE)
    assert not Event.objects.filter(kind="tick.rolled_back").exists()
    drive(pool, each_round=execute_only)
    assert HostTask.objects.get(operation=operation).state == TaskState.DONE


def test_an_upgrade_that_became_incompatible_since_submission_waits_and_says_why() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    upgrade(pool)  # driver 560.35.03: fine with cuda 12.4.1
    cuda = InstalledVersion.objects.get(host=hosts[0], component__name="cuda-runtime").component
    cuda_128 = fleet_services.component_version_create(component=cuda, version="12.8.0")
    driver = InstalledVersion.objects.get(host=hosts[0], component__name="gpu-driver").component
    fleet_services.compatibility_rule_create(job_facing_version=cuda_128, lower_component=driver, min_version="570")
    fleet_services.installed_version_set(host=hosts[0], version=cuda_128)  # the host moved on meanwhile

    pool_tick(pool_id=pool.pk)

    waiting = HostTask.objects.get(host=hosts[0])
    assert waiting.state == TaskState.PENDING
    assert waiting.waiting_code == WaitingCode.INCOMPATIBLE
    assert waiting.waiting_reason == (
        "incompatible: gpu-driver 560.35.03 does not work with cuda-runtime 12.8.0 (needs [570, any])"
    )
    assert HostTask.objects.get(host=hosts[1]).state == TaskState.DRAINING


def test_a_tick_delivered_twice_changes_nothing_the_second_time() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=2)
    upgrade(pool)
    pool_tick(pool_id=pool.pk)
    snapshot = (
        list(HostTask.objects.order_by("id").values_list("id", "state", "waiting_reason", "state_changed_at")),
        list(Host.objects.order_by("id").values_list("id", "state")),
        Event.objects.count(),
        WorkItem.objects.count(),
    )
    report = pool_tick(pool_id=pool.pk)  # the same task again, nothing finished in between
    assert sum(report.counts[k] for k in report.counts if k != "waiting") == 0
    assert snapshot == (
        list(HostTask.objects.order_by("id").values_list("id", "state", "waiting_reason", "state_changed_at")),
        list(Host.objects.order_by("id").values_list("id", "state")),
        Event.objects.count(),
        WorkItem.objects.count(),
    )


def test_a_host_that_fails_work_done_without_a_drain_is_repaired_verified_and_returned() -> None:
    instant_simulator(execute_by_kind={"verification": {"failure_rate": 1}})
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    check = operation_submit(
        kind="verification", scope=f"hosts: {hosts[0].hostname}", reason="r", needs_drain=False, max_attempts=1
    )
    drive(pool)  # check_invariants runs every round: no stuck host on the way
    assert HostTask.objects.get(operation=check).state == TaskState.FAILED
    repair = HostTask.objects.get(host=hosts[0], operation__kind="repair")
    assert repair.state == TaskState.DONE
    assert WorkItem.objects.filter(host_task=repair, kind=WorkKind.VERIFY, result__passed=True).count() == 3
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE


def test_two_upgrades_of_one_component_for_a_host_return_it_at_the_newest_one() -> None:
    # The older target, even applied last in (priority, age) order, is superseded: not applied.
    # Going down a version is a rollback's (the repair flow's), see tests/test_superseded_versions.py.
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    upgrade(pool, version="560.35.03", priority=500)
    older = upgrade(pool, version="550.127.05", priority=100, reason="roll back the canary")
    drive(pool)
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
    assert installed(hosts[0]) == "560.35.03"
    assert older.tasks.get().failure_code == "superseded"
    assert WorkItem.objects.filter(kind=WorkKind.DRAIN).count() == 1


def test_a_pool_whose_only_activity_is_an_unclaimed_return_is_still_ticked() -> None:
    from opsplanner.services.tick.run import pools_with_work

    pool, _ = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external")
    pool_tick(pool_id=pool.pk)
    (drain,) = work_items_claim(worker="drainer", limit=1)
    work_item_report(item_id=drain.pk, worker="drainer", key="d", outcome="failed", reason="jobs would not move")
    pool_tick(pool_id=pool.pk)
    assert not HostTask.objects.filter(state__in=["pending", "admitted", "draining", "running", "verifying"]).exists()
    assert WorkItem.objects.get(kind=WorkKind.UNDRAIN).state == "ready"
    assert pool.pk in pools_with_work()  # so its undrain's deadline is still watched


def test_the_sweep_closes_an_operation_whose_last_tasks_finished_in_two_pools_at_once() -> None:
    from opsplanner.services.tick.run import operations_close_finished

    _first, a = make_fleet(domains=1, hosts_per_domain=1)
    _second, b = make_fleet(domains=1, hosts_per_domain=1)
    operation = operation_submit(kind="reboot", scope=f"hosts: {a[0].hostname}, {b[0].hostname}", reason="r")
    HostTask.objects.filter(operation=operation).update(state=TaskState.DONE)  # as two racing ticks left it
    assert operations_close_finished() == 1
    assert Operation.objects.get(pk=operation.pk).state == OperationState.COMPLETED
    assert Event.objects.filter(kind="operation.completed", subject_id=operation.pk).exists()


def test_a_host_whose_check_fails_after_two_upgrades_of_one_component_returns_from_repair_at_the_newer() -> None:
    """One drain applies bios 2.16.0, hands over to 2.17.0, and a failed check sends the host to
    repair: the repaired host runs 2.17.0, which this drain applied, so it returns rather than being
    sent back to repair for "2.17.0 where the target is 2.16.0" until it is escalated."""
    from fleet.models import Component

    instant_simulator(verify_failure_rate=1)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, planned_buffer_hosts=1)
    make_version(Component.objects.get(name="bios"), "2.17.0")
    upgrade(pool, component="bios", version="2.16.0", priority=200)
    upgrade(pool, component="bios", version="2.17.0", priority=100)

    def repairing() -> bool:
        return Host.objects.get(pk=hosts[0].pk).state == HostState.REPAIR

    drive(pool, until=repairing)
    assert installed(hosts[0], "bios") == "2.17.0"
    assert HostTask.objects.filter(host=hosts[0], state=TaskState.HANDED_OVER).count() == 1

    instant_simulator()  # the repair and its checks succeed
    drive(pool)
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
    assert installed(hosts[0], "bios") == "2.17.0"
    assert not Event.objects.filter(kind="host.escalated").exists()
