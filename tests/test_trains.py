"""Trains driven in-process round by round (train tick, pool tick, simulator) on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections import Counter

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import F

from fleet import services as fleet_services
from fleet.models import Host, HostState, InstalledVersion, Pool
from fleet.selectors.capacity import pool_capacity
from fleet.services import (
    installed_version_set,
    optout_window_cancel,
    optout_window_create,
    reservation_create,
    service_place,
)
from opsplanner import clock
from opsplanner.models import Approval, Event, HostTask, Operation, OperationSource, TaskState, WorkItem, WorkKind
from opsplanner.roles import Role
from opsplanner.services.approvals import approval_decide
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.builders import make_fleet, make_service, make_version
from tests.driving import busy, drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user, nic_firmware
from trains.models import Cycle, Train, TrainState, Upgrade, UpgradeState, Visit, VisitState
from trains.services import tick as train_tick_module
from trains.services.emergency import emergency_train_request
from trains.services.offboarding import upgrade_offboard
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.tick import train_tick
from trains.services.trains import train_resume
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def drains_per_host(pool: Pool) -> Counter[int]:
    """A task whose drain key is its own id opened a drain."""
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def domain_of(host_id: int) -> str:
    return Host.objects.get(pk=host_id).domain.name


def test_a_train_visits_every_domain_once_per_cycle_with_one_drain_per_host_for_three_upgrades() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=4)  # planned buffer: one domain (4 hosts)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
    train = make_train(pool)
    upgrades = [
        upgrade_create(pool=pool, component=component, version=version, reason="rollout")
        for component, version in [("gpu-driver", "560.35.03"), ("bios", "2.16.0"), ("nic-firmware", "22.4")]
    ]

    def capacity_holds() -> None:
        capacity = pool_capacity(pool)
        assert capacity.in_service >= capacity.total - 4 - capacity.failure_out
        out = set(Host.objects.filter(pool=pool).exclude(state=HostState.IN_SERVICE).values_list("domain", flat=True))
        assert len(out) <= 1, "the train had two domains out at once"

    drive_trains(
        pool,
        each_round=capacity_holds,
        until=lambda: Cycle.objects.filter(train=train, ended_at__isnull=False).exists(),
    )

    assert all(Upgrade.objects.get(pk=u.pk).state == UpgradeState.COMPLETED for u in upgrades)
    targets = {("gpu-driver", "560.35.03"), ("bios", "2.16.0"), ("nic-firmware", "22.4")}
    for host in hosts:
        installed = set(InstalledVersion.objects.filter(host=host).values_list("component__name", "version__version"))
        assert targets <= installed
    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    visits = Visit.objects.filter(train=train, cycle__number=1).order_by("started_at", "id")
    assert [v.domain.name for v in visits] == ["rack-0001", "rack-0002", "rack-0003"]
    assert {v.state for v in visits} == {VisitState.DONE}
    first = visits[0]
    assert len(first.plan["hosts"]) == 4
    assert len(first.plan["upgrades"]) == 3
    # Visits ran one after the other.
    for earlier, later in itertools.pairwise(visits):
        assert earlier.ended_at <= later.started_at
    assert Event.objects.filter(kind="train.cycle_completed", subject_id=first.cycle_id).exists()
    assert set(Operation.objects.filter(visit_link__visit__train=train).values_list("source", flat=True)) == {
        OperationSource.TRAIN
    }
    # Nothing left to do: the train idles instead of starting empty cycles.
    train_tick(train_id=train.pk)
    assert Cycle.objects.filter(train=train).count() == 1


def test_a_cycle_whose_last_visits_have_nothing_to_do_ends_in_the_tick_that_finds_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    first = sorted(h.hostname for h in hosts if h.domain.name == "rack-0001")
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", scope="hosts: " + ", ".join(first))

    for _ in range(50):
        train_tick(train_id=train.pk)  # the tick that ends the first visit starts the other two
        if Visit.objects.filter(train=train, domain__name="rack-0001", state=VisitState.DONE).exists():
            break
        pool_tick(pool_id=pool.pk)
        simulated_work_step()

    # The other domains had nothing pending: their visits ended as they started, and so did the
    # cycle, in that tick (not at the next tick something else happens).
    visits = Visit.objects.filter(train=train)
    assert set(visits.values_list("state", flat=True)) == {VisitState.DONE}
    assert visits.filter(outcome="nothing pending in this domain").count() == 2
    cycle = Cycle.objects.get(train=train)
    assert cycle.ended_at is not None
    assert cycle.ended_at == max(visits.values_list("ended_at", flat=True))


def test_an_opt_out_window_skips_a_domain_and_the_train_comes_back_to_it() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    service = make_service()
    service_place(service=service, hosts=[h for h in hosts if domain_of(h.pk) == "rack-0001"])
    now = clock.now()
    window = optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=1), reason="launch"
    )
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")

    def others_done() -> bool:
        return Visit.objects.filter(train=train, state=VisitState.DONE).count() == 2

    drive_trains(pool, until=others_done)
    skipped = Visit.objects.get(train=train, domain__name="rack-0001")
    assert skipped.state == VisitState.PLANNED
    assert skipped.skips == 1
    assert f"opt-out window #{window.pk} of service {service.name}" in skipped.skip_reason
    assert Event.objects.filter(kind="train.domain_skipped", subject_id=skipped.pk).count() == 1

    optout_window_cancel(window_id=window.pk, reason="launch moved")
    drive_trains(pool, until=lambda: Cycle.objects.filter(train=train, ended_at__isnull=False).exists())
    skipped.refresh_from_db()
    assert skipped.state == VisitState.DONE
    others = Visit.objects.filter(train=train).exclude(pk=skipped.pk)
    assert all(skipped.started_at >= other.ended_at for other in others)
    assert set(
        InstalledVersion.objects.filter(host__pool=pool, component__name="gpu-driver").values_list(
            "version__version", flat=True
        )
    ) == {"560.35.03"}


def test_a_train_autostops_when_failures_exhaust_the_failure_buffer_and_resumes_when_told() -> None:
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"failure_rate": 1.0}})
    pool, _ = make_fleet(domains=3, hosts_per_domain=3, failure_buffer_hosts=1)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)

    drive_trains(pool, until=lambda: Train.objects.get(pk=train.pk).state == TrainState.AUTOSTOPPED)
    train.refresh_from_db()
    assert "failure buffer of pool" in train.state_reason
    assert Event.objects.filter(kind="alert.train_autostopped", subject_id=train.pk).exists()
    # Stopped: the visit's remaining hosts are held, no further visit starts.
    drive_trains(pool, until=lambda: not busy([pool]))
    assert Visit.objects.filter(train=train, state=VisitState.RUNNING).count() <= 1
    assert not Visit.objects.filter(train=train, domain__name="rack-0002").exclude(state=VisitState.PLANNED).exists()
    held = HostTask.objects.filter(operation__visit_link__visit__train=train, state=TaskState.PENDING)
    assert all(reason.startswith("held: train") for reason in held.values_list("waiting_reason", flat=True))

    operator = make_user(Role.OPERATOR)
    train_resume(train_id=train.pk, reason="failures understood", actor=operator)
    train.refresh_from_db()
    assert train.state in (TrainState.RUNNING, TrainState.AUTOSTOPPED)
    assert Event.objects.filter(kind="train.resumed", subject_id=train.pk, actor=operator.username).exists()


def test_an_autostopped_train_resumes_itself_once_the_buffers_recovered_for_the_set_time() -> None:
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"failure_rate": 1.0}})
    pool, _ = make_fleet(domains=2, hosts_per_domain=1, failure_buffer_hosts=1)
    train = make_train(pool, auto_resume_after_s=0)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    drive_trains(
        pool,
        until=lambda: Event.objects.filter(kind="train.resumed", subject_id=train.pk, actor="train-scheduler").exists(),
    )
    assert Event.objects.filter(kind="train.autostopped", subject_id=train.pk).exists()


def test_an_upgrade_failing_on_thirty_percent_of_hosts_is_offboarded_in_its_canary_and_rolled_back() -> None:
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"failure_rate": 0.3}})
    pool, _ = make_fleet(domains=3, hosts_per_domain=30, planned_buffer_hosts=30, failure_buffer_hosts=35)
    make_train(pool)
    upgrade = upgrade_create(
        pool=pool,
        component="gpu-driver",
        version="560.35.03",
        reason="rollout",
        max_failures=1,
        phases=[
            {"name": "canary", "domain": "rack-0002", "min_successes": 30, "soak_s": 3600},
            {"name": "all", "percent": 100, "min_successes": 0},
        ],
    )
    drive_trains(
        pool,
        max_rounds=600,
        until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED and not busy([pool]),
    )
    upgrade.refresh_from_db()
    assert upgrade.current_phase == 0, "the canary must not graduate"
    assert "failed in phase canary" in upgrade.state_reason
    assert Event.objects.filter(kind="alert.upgrade_offboarded", subject_id=upgrade.pk).exists()
    # Only canary hosts were touched (30 of them at a 30% failure rate: two failures are all but certain),
    # the failed ones went to repair, none runs the bad version in service.
    touched = set(HostTask.objects.filter(operation__visit_link__upgrade=upgrade).values_list("host_id", flat=True))
    assert {domain_of(h) for h in touched} == {"rack-0002"}
    failed = set(
        HostTask.objects.filter(operation__visit_link__upgrade=upgrade, state=TaskState.FAILED).values_list(
            "host_id", flat=True
        )
    )
    assert len(failed) >= 2
    repaired = set(HostTask.objects.filter(operation__kind="repair").values_list("host_id", flat=True))
    assert failed <= repaired
    bad = InstalledVersion.objects.filter(host__pool=pool, version=upgrade.component_version)
    assert not bad.filter(host__state=HostState.IN_SERVICE).exists()
    assert upgrade.component_version.__class__.objects.get(pk=upgrade.component_version_id).withdrawn_at is not None
    # The train has nothing left to do with it.
    assert not HostTask.objects.filter(operation__visit_link__upgrade=upgrade, state=TaskState.PENDING).exists()


def test_an_emergency_train_waits_for_a_second_operator_and_never_goes_below_the_hard_floor() -> None:
    instant_simulator()
    requester, approver, viewer = make_user(), make_user(), make_user(Role.VIEWER)
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=1, failure_buffer_hosts=1)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=2)
    service = make_service()
    service_place(service=service, hosts=hosts[:1])
    now = clock.now()
    optout_window_create(service=service, starts_at=now, ends_at=now + dt.timedelta(hours=2), reason="big job")

    train = emergency_train_request(
        pool=pool, component="bios", version="2.16.0", reason="CVE-2026-0001", domains_at_once=2, actor=requester
    )
    assert train.state == TrainState.AWAITING_APPROVAL
    for _ in range(3):
        train_tick(train_id=train.pk)
    assert not Operation.objects.filter(source=OperationSource.EMERGENCY).exists()

    approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
    with pytest.raises(ValidationError, match="two-person rule"):
        approval_decide(approval_id=approval.pk, approve=True, reason="mine", actor=requester)
    with pytest.raises(ValidationError, match="Only an operator"):
        approval_decide(approval_id=approval.pk, approve=True, reason="looks fine", actor=viewer)
    assert Approval.objects.get(pk=approval.pk).state == "pending"
    approval_decide(approval_id=approval.pk, approve=True, reason="CVE confirmed", actor=approver)

    def above_hard_floor() -> None:
        assert pool_capacity(pool).in_service >= 2

    drive_trains(
        pool, each_round=above_hard_floor, until=lambda: Train.objects.get(pk=train.pk).state == TrainState.FINISHED
    )
    assert set(
        InstalledVersion.objects.filter(host__pool=pool, component__name="bios").values_list(
            "version__version", flat=True
        )
    ) == {"2.16.0"}
    assert set(Operation.objects.filter(visit_link__visit__train=train).values_list("source", flat=True)) == {
        OperationSource.EMERGENCY
    }
    started = Event.objects.filter(kind="train.visit_started", data__train=train.pk)
    assert started.count() == 2
    assert all(e.data["emergency"] for e in started)
    # More than the planned buffer (1 host) was out at once: the emergency used the room to the hard floor.
    peak = max(
        Counter(HostTask.objects.filter(operation__source="emergency").values_list("admitted_at", flat=True)).values()
    )
    assert peak > 1


def test_nobody_can_approve_their_own_request_even_bypassing_the_service() -> None:
    requester = make_user()
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    train = emergency_train_request(pool=pool, component="bios", version="2.16.0", reason="CVE", actor=requester)
    approval = Approval.objects.get(subject_id=train.pk)
    with pytest.raises(IntegrityError), transaction.atomic():
        Approval.objects.filter(pk=approval.pk).update(
            state="approved", decided_by=requester, decided_at=clock.now(), decider=requester.username
        )


def test_an_expired_approval_is_refused_and_cancels_the_emergency_train() -> None:
    requester, approver = make_user(), make_user()
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    train = emergency_train_request(pool=pool, component="bios", version="2.16.0", reason="CVE", actor=requester)
    approval = Approval.objects.get(subject_id=train.pk)
    Approval.objects.filter(pk=approval.pk).update(expires_at=clock.now() + dt.timedelta(microseconds=1))
    with pytest.raises(ValidationError, match="expired"):
        approval_decide(approval_id=approval.pk, approve=True, reason="late", actor=approver)
    from opsplanner.services.approvals import approvals_expire

    assert approvals_expire() == 1
    assert Train.objects.get(pk=train.pk).state == TrainState.CANCELLED
    assert Upgrade.objects.get(pk=train.upgrade_id).state == UpgradeState.CANCELLED


def test_a_driver_upgrade_incompatible_with_the_pinned_cuda_runtime_is_refused_at_creation() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    with pytest.raises(ValidationError) as refused:
        upgrade_create(pool=pool, component="gpu-driver", version="535.183.01", reason="downgrade")
    message = " ".join(refused.value.messages)
    assert "gpu-driver 535.183.01 does not work with cuda-runtime 12.4.1" in message
    assert "550.54.14" in message  # the rule's bound is named
    assert not Upgrade.objects.exists()


def test_a_host_whose_verification_reports_an_incompatible_version_never_returns_to_service() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    make_train(pool, executor="external")
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    def executor() -> None:
        for item in work_items_claim(worker="ext", limit=100):
            if item.kind == WorkKind.VERIFY:
                result = {"passed": True, "versions": {"gpu-driver": "535.183.01"}}
            else:
                result = {"versions": {item.params["component"]: item.params["version"]}} if item.params else {}
            work_item_report(item_id=item.pk, worker="ext", key=f"k{item.pk}", outcome="done", result=result)

    drive_trains(pool, each_round=executor, until=lambda: Host.objects.get(pk=hosts[0].pk).state == HostState.ESCALATED)
    assert not Event.objects.filter(host_id=hosts[0].pk, kind="host.state_changed", data__to="returning").exists()
    assert WorkItem.objects.filter(host_id=hosts[0].pk, kind=WorkKind.UNDRAIN).count() == 0


def test_a_multi_cycle_upgrade_takes_a_bounded_number_of_hosts_per_visit() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=3)
    train = make_train(pool)
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", multi_cycle=True, hosts_per_visit=2
    )
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED)
    per_visit = [len(v.plan["hosts"]) for v in Visit.objects.filter(train=train, state=VisitState.DONE)]
    assert max(per_visit) == 2
    assert Cycle.objects.filter(train=train).count() == 2  # 3 hosts per domain at 2 a visit: two cycles


def test_phases_gate_the_hosts_a_train_may_touch_until_the_canary_graduates() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = upgrade_create(
        pool=pool,
        component="bios",
        version="2.16.0",
        reason="rollout",
        phases=[
            {"name": "canary", "domain": "rack-0003", "min_successes": 2, "soak_s": 0},
            {"name": "all", "percent": 100, "min_successes": 0},
        ],
    )
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED)
    first_cycle = Visit.objects.filter(train=train, cycle__number=1).order_by("position")
    assert [len(v.plan["hosts"]) for v in first_cycle] == [0, 0, 2]  # only the canary domain
    assert Event.objects.filter(kind="upgrade.phase_graduated", subject_id=upgrade.pk).exists()
    second = Visit.objects.filter(train=train, cycle__number=2).order_by("position")
    assert [len(v.plan.get("hosts", [])) for v in second][:2] == [2, 2]


def test_a_cycle_forecast_to_miss_its_slo_raises_an_alert_with_the_cause() -> None:
    instant_simulator(execute_seconds=3600.0)
    pool, _ = make_fleet(domains=3, hosts_per_domain=1)
    train = make_train(pool, cycle_slo_s=300, visit_estimate_s=100)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)
    # The visit takes an hour: by the forecast the cycle ends long after its deadline.
    later = clock.now() + dt.timedelta(seconds=200)
    with clock.use_clock(lambda: later):
        train_tick(train_id=train.pk)
    alert = Event.objects.get(kind="alert.cycle_will_miss")
    assert "after its deadline" in alert.reason
    assert "the visit of rack-" in alert.reason
    assert "is forecast to run as long again" in alert.reason


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cycle_slo_s": 100, "visit_estimate_s": 60}, "cannot be met"),
        ({"domain_order": []}, "at least one domain"),
        ({"domain_order": ["rack-0001", "rack-0001"]}, "repeated: rack-0001"),
        ({"domain_order": ["rack-9999"]}, "no domain rack-9999"),
        ({"visit_concurrency": 0}, "at least one domain at a time"),
    ],
)
def test_a_bad_train_is_refused_with_the_reason_and_nothing_is_written(overrides, message) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    events = Event.objects.count()
    with pytest.raises(ValidationError, match=message):
        make_train(pool, **overrides)
    assert not Train.objects.exists()
    assert Event.objects.count() == events


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        (
            [{"name": "wide", "percent": 50}, {"name": "narrow", "percent": 10}, {"name": "all", "percent": 100}],
            "out of order",
        ),
        ([{"name": "all", "percent": 100}, {"name": "canary", "domain": "rack-0001"}], "out of order"),
        ([{"name": "half", "percent": 50}], "whole scope"),
        ([{"name": "canary", "domain": "rack-0001", "min_successes": 5}, {"percent": 100}], "cannot wait for 5"),
        ([{"name": "x", "domain": "rack-0001", "percent": 10}], "either one domain or a percentage"),
        ([], "at least one phase"),
    ],
)
def test_bad_phases_are_refused_and_nothing_is_written(phases, message) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    with pytest.raises(ValidationError, match=message):
        upgrade_create(pool=pool, component="bios", version="2.16.0", reason="r", phases=phases)
    assert not Upgrade.objects.exists()


def test_a_capacity_reservation_lowers_what_a_visit_may_take_and_the_refusal_names_it() -> None:
    instant_simulator(execute_seconds=3600.0)  # the first hosts stay out: the rest of the visit must wait
    pool, _ = make_fleet(domains=2, hosts_per_domain=4)
    service = make_service()
    now = clock.now()
    reservation = reservation_create(
        service=service,
        pool=pool,
        min_hosts_in_service=6,
        starts_at=now - dt.timedelta(minutes=1),
        ends_at=now + dt.timedelta(hours=4),
        reason="training run",
    )
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    for _ in range(3):
        train_tick(train_id=train.pk)
        pool_tick(pool_id=pool.pk)
    tasks = HostTask.objects.filter(operation__visit_link__visit__train=train)
    assert tasks.exclude(state=TaskState.PENDING).count() == 2  # 8 hosts, 6 reserved: two may go
    waiting = set(tasks.filter(state=TaskState.PENDING).values_list("waiting_reason", flat=True))
    assert waiting == {
        f"reservation #{reservation.pk} of service {service.name} keeps 6 hosts of pool {pool.name} in service "
        f"until {reservation.ends_at:%Y-%m-%d %H:%M} UTC"
    }


def test_an_offboarded_upgrade_comes_back_only_with_a_second_operators_approval() -> None:
    requester, approver = make_user(), make_user()
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    with transaction.atomic():
        assert upgrade_offboard(upgrade=upgrade, reason="too many failures")
    version = upgrade.component_version
    version.refresh_from_db()
    assert version.withdrawn_at is not None
    with pytest.raises(ValidationError, match="withdrawn"):
        upgrade_create(pool=pool, component="bios", version="2.16.0", reason="again")

    approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="vendor fixed it", actor=requester)
    with pytest.raises(ValidationError, match="two-person rule"):
        approval_decide(approval_id=approval.pk, approve=True, reason="mine", actor=requester)
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED
    approval_decide(approval_id=approval.pk, approve=True, reason="fix verified", actor=approver)
    upgrade.refresh_from_db()
    version.refresh_from_db()
    assert upgrade.state == UpgradeState.ACTIVE
    assert version.withdrawn_at is None
    assert Event.objects.filter(kind="upgrade.reonboarded", subject_id=upgrade.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_train_tick_in_progress_does_not_lock_the_pool_tick_out(monkeypatch) -> None:
    # Regression: the train tick's FOR UPDATE joined its pool and locked that row too, so the pool
    # tick (which skips a locked pool) could be starved for as long as the two ran in step.
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="ad hoc", host_ids=[hosts[0].pk])
    inside, release = threading.Event(), threading.Event()
    real_forecast = train_tick_module.trains_forecasts_with_visits

    def slow_forecast(*args, **kwargs):
        inside.set()
        release.wait(30)
        return real_forecast(*args, **kwargs)

    monkeypatch.setattr(train_tick_module, "trains_forecasts_with_visits", slow_forecast)
    reports = []

    def tick_the_train() -> None:
        try:
            train_tick(train_id=train.pk)
        finally:
            connection.close()

    def tick_the_pool_meanwhile() -> None:
        try:
            assert inside.wait(30), "the train tick never reached its forecast"
            reports.append(pool_tick(pool_id=pool.pk))
        finally:
            release.set()
            connection.close()

    threads = [threading.Thread(target=tick_the_train), threading.Thread(target=tick_the_pool_meanwhile)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(reports) == 1
    assert not reports[0].skipped
    assert HostTask.objects.get(host=hosts[0], operation__kind="reboot").state != TaskState.PENDING


def test_an_upgrade_superseded_by_a_newer_release_completes_without_taking_hosts_back_down() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2)
    bios = hosts[0].installed_versions.get(component__name="bios").component
    older = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="first release")
    newer = make_version(bios, "2.18.0")
    for host in hosts:  # the newer release reached every host first (another train, a repair)
        fleet_services.installed_version_set(host=host, version=newer)
    make_train(pool)

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=older.pk).state == UpgradeState.COMPLETED)

    assert set(InstalledVersion.objects.filter(component=bios).values_list("version__version", flat=True)) == {"2.18.0"}
    assert not HostTask.objects.filter(host__pool=pool).exists()  # nobody was drained to go back to 2.16.0
    assert "or newer" in Upgrade.objects.get(pk=older.pk).state_reason


def _queries_of_a_busy_train_tick(components: list[tuple[str, str]]) -> int:
    from django.db import connection as db
    from django.test.utils import CaptureQueriesContext

    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
    train = make_train(pool)
    for component, version in components:
        upgrade_create(pool=pool, component=component, version=version, reason="rollout")
    train_tick(train_id=train.pk)  # the first visit starts and takes the train's only slot
    assert Visit.objects.filter(train=train, state=VisitState.RUNNING).count() == 1
    with CaptureQueriesContext(db) as captured:
        report = train_tick(train_id=train.pk)
    assert report.events == []
    return len(captured)


def test_a_busy_train_tick_costs_the_same_queries_for_one_or_three_active_upgrades() -> None:
    one = _queries_of_a_busy_train_tick([("gpu-driver", "560.35.03")])
    Upgrade.objects.all().delete()
    Train.objects.all().delete()
    three = _queries_of_a_busy_train_tick([("gpu-driver", "560.35.03"), ("bios", "2.16.0"), ("nic-firmware", "22.4")])
    assert three == one


def test_a_pool_tick_committing_during_the_capacity_check_does_not_autostop_the_train(monkeypatch) -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=3)  # planned buffer: one domain (3 hosts)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    train_tick(train_id=train.pk)
    pool_tick(pool_id=pool.pk, kick=False)
    assert Host.objects.filter(pool=pool, state=HostState.DRAINING).count() == 3
    real_capacity = train_tick_module.pool_capacity

    def capacity_then_a_pool_tick_commits(checked: Pool):
        capacity = real_capacity(checked)
        # What a pool tick committing right now leaves behind (READ COMMITTED: the next statement sees
        # it): the visit's hosts back in service and its tasks done.
        HostTask.objects.filter(pool_id=pool.pk).exclude(state=TaskState.PENDING).update(state=TaskState.DONE)
        Host.objects.filter(pool=pool).update(state=HostState.IN_SERVICE)
        return capacity

    monkeypatch.setattr(train_tick_module, "pool_capacity", capacity_then_a_pool_tick_commits)
    train_tick(train_id=train.pk)

    assert Train.objects.get(pk=train.pk).state == TrainState.RUNNING
    assert not Event.objects.filter(kind="train.autostopped", subject_id=train.pk).exists()
