"""Trains end to end with real Celery processes: two workers and the beat (tick, trains tick and the
simulated adapters all run as periodic tasks), on Redis and PostgreSQL. No eager mode."""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from django.core.exceptions import ValidationError
from django.db.models import F

from fleet.models import Host, HostState, InstalledVersion, Pool
from fleet.selectors.capacity import pool_capacity
from fleet.services import installed_version_set, optout_window_create, service_place
from opsplanner import clock
from opsplanner.models import Approval, Event, HostTask, OperationSource, TaskState, WorkerHeartbeat
from opsplanner.roles import Role
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.approvals import approval_decide
from tests.builders import make_fleet, make_service
from tests.driving import busy, instant_simulator
from tests.processes import WorkerProcess, start_beat, start_worker, wait_for
from tests.trains_builders import make_train, make_user, nic_firmware
from trains.models import Cycle, Train, TrainState, Upgrade, UpgradeState, Visit, VisitState
from trains.services.emergency import emergency_train_request
from trains.services.upgrades import upgrade_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.workers]
ENV = {"TICK_SECONDS": "1"}


@pytest.fixture(scope="module")
def celery_processes(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[list[WorkerProcess]]:
    tmp_path = tmp_path_factory.mktemp("trains-workers")
    with django_db_blocker.unblock():
        first = start_worker(tmp_path, extra_env=ENV)
        second = start_worker(tmp_path, queue=first.queue, extra_env=ENV)
        beat = start_beat(tmp_path, queue=first.queue, extra_env=ENV)
        processes = [first, second, beat]
        try:
            wait_for(
                lambda: WorkerHeartbeat.objects.filter(worker__in=[first.name, second.name]).count() == 2,
                timeout=60,
                what="two workers",
            )
            yield processes
        finally:
            for process in processes:
                process.stop()


def watch(pool: Pool, *, domain_size: int, done: object, emergency_floor: int | None = None) -> object:
    """A wait_for condition that checks the invariants and the train's capacity promise each poll."""

    def condition() -> bool:
        assert check_invariants() == [], "an invariant broke while the workers ran"
        capacity = pool_capacity(pool)
        if emergency_floor is None:
            assert capacity.in_service >= capacity.total - domain_size - capacity.failure_out
        else:
            assert capacity.in_service >= emergency_floor
        return bool(done())  # type: ignore[operator]

    return condition


def test_a_train_run_by_workers_visits_each_domain_once_with_one_drain_and_comes_back_after_an_opt_out(
    celery_processes,
) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=3)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
    service = make_service()
    service_place(service=service, hosts=[h for h in hosts if h.domain.name == "rack-0001"])
    now = clock.now()
    optout_window_create(service=service, starts_at=now, ends_at=now + dt.timedelta(seconds=8), reason="demo")
    # The upgrades exist before the train does: the beat ticks trains every second, and a train
    # created first could start its first visit with only some of them, then drain that domain
    # again in a second cycle for the rest (seen once: one rack drained twice).
    for component, version in [("gpu-driver", "560.35.03"), ("bios", "2.16.0"), ("nic-firmware", "22.4")]:
        upgrade_create(pool=pool, component=component, version=version, reason="rollout")
    train = make_train(pool)

    def first_cycle_and_upgrades_done() -> bool:
        # The train tick that closes the cycle may complete the upgrades one tick later.
        return (
            Cycle.objects.filter(train=train, ended_at__isnull=False).exists()
            and not Upgrade.objects.filter(pool=pool).exclude(state=UpgradeState.COMPLETED).exists()
        )

    wait_for(
        watch(pool, domain_size=3, done=first_cycle_and_upgrades_done),
        timeout=120,
        what="the first cycle and the upgrades",
        interval=0.3,
    )
    visits = list(Visit.objects.filter(train=train, cycle__number=1).order_by("started_at"))
    # rack-0001 was skipped while its window was open, and visited later in the same cycle.
    assert visits[0].domain.name == "rack-0002"
    assert sorted(v.domain.name for v in visits) == ["rack-0001", "rack-0002", "rack-0003"]
    came_back = next(v for v in visits if v.domain.name == "rack-0001")
    assert came_back.skips == 1
    assert came_back.started_at >= visits[0].ended_at
    assert "opt-out window" in Event.objects.get(kind="train.domain_skipped").reason
    drains = Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))
    assert drains == {host.pk: 1 for host in hosts}
    assert set(Upgrade.objects.values_list("state", flat=True)) == {UpgradeState.COMPLETED}
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}


def test_workers_autostop_a_train_when_failures_exhaust_the_failure_buffer(celery_processes) -> None:
    # Repairs take a while (as they do): the broken hosts stay out long enough to exhaust the buffer.
    instant_simulator(
        execute_by_kind={"upgrade:bios:2.16.0": {"failure_rate": 1.0}, "repair": {"seconds": 20, "failure_rate": 0}}
    )
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=1)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", max_failures=100)
    wait_for(
        watch(pool, domain_size=2, done=lambda: Train.objects.get(pk=train.pk).state == TrainState.AUTOSTOPPED),
        timeout=90,
        what="the autostop",
    )
    assert "failure buffer" in Train.objects.get(pk=train.pk).state_reason
    wait_for(lambda: not busy([pool]), timeout=90, what="the pool to settle")
    assert not Visit.objects.filter(train=train, domain__name="rack-0003").exclude(state=VisitState.PLANNED).exists()


def test_workers_offboard_an_upgrade_failing_on_thirty_percent_of_its_canary(celery_processes) -> None:
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"failure_rate": 0.3}})
    pool, _ = make_fleet(domains=2, hosts_per_domain=30, planned_buffer_hosts=30, failure_buffer_hosts=35)
    make_train(pool)
    upgrade = upgrade_create(
        pool=pool,
        component="gpu-driver",
        version="560.35.03",
        reason="rollout",
        max_failures=1,
        phases=[
            {"name": "canary", "domain": "rack-0001", "min_successes": 30, "soak_s": 600},
            {"name": "all", "percent": 100, "min_successes": 0},
        ],
    )

    def offboarded_and_settled() -> bool:
        return Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED and not busy([pool])

    wait_for(watch(pool, domain_size=30, done=offboarded_and_settled), timeout=180, what="the offboarding")
    upgrade.refresh_from_db()
    assert upgrade.current_phase == 0
    in_service_bad = InstalledVersion.objects.filter(
        host__pool=pool, version=upgrade.component_version, host__state=HostState.IN_SERVICE
    )
    assert not in_service_bad.exists()
    assert not HostTask.objects.filter(operation__visit_link__upgrade=upgrade, host__domain__name="rack-0002").exists()


def test_an_emergency_train_run_by_workers_moves_only_after_a_second_operator_approves(celery_processes) -> None:
    instant_simulator()
    requester, approver = make_user(Role.OPERATOR), make_user(Role.OPERATOR)
    pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=1, failure_buffer_hosts=1)
    Pool.objects.filter(pk=pool.pk).update(hard_floor_hosts=1)
    train = emergency_train_request(
        pool=pool, component="bios", version="2.16.0", reason="CVE-2026-0002", domains_at_once=2, actor=requester
    )
    wait_for(lambda: Event.objects.filter(kind="approval.requested").exists(), timeout=5, what="the request")
    ticks_before = Event.objects.filter(kind="tick.rolled_back").count()
    time.sleep(3)  # several beats: nothing may move before the approval
    assert not HostTask.objects.filter(operation__source=OperationSource.EMERGENCY).exists()
    assert Train.objects.get(pk=train.pk).state == TrainState.AWAITING_APPROVAL
    approval = Approval.objects.get(subject_id=train.pk, subject_type="trains.train")
    with pytest.raises(ValidationError, match="two-person rule"):
        approval_decide(approval_id=approval.pk, approve=True, reason="self", actor=requester)
    approval_decide(approval_id=approval.pk, approve=True, reason="confirmed", actor=approver)
    wait_for(
        watch(
            pool,
            domain_size=4,
            emergency_floor=1,
            done=lambda: Train.objects.get(pk=train.pk).state == TrainState.FINISHED,
        ),
        timeout=90,
        what="the emergency train",
    )
    assert set(
        InstalledVersion.objects.filter(host__pool=pool, component__name="bios").values_list(
            "version__version", flat=True
        )
    ) == {"2.16.0"}
    assert Event.objects.filter(kind="tick.rolled_back").count() == ticks_before
    assert not HostTask.objects.filter(state=TaskState.FAILED).exists()
