"""One drain per host per cycle, also when a drain fails: a host whose execute failed is repaired
without returning to service and takes up the train's work still pending for it, the failed upgrade
retried once, in the same drain. Where the pool has no room for it then, it returns, and its train
work is left to the next cycle, not applied in a second drain."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
from django.db.models import F

from fleet.models import CapacityReservation, Host, HostState, InstalledVersion, Pool
from fleet.selectors.capacity import pool_capacity
from opsplanner import clock
from opsplanner.models import Event, HostTask, OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet, make_service
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Cycle, Train
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

FAILING = {"upgrade:gpu-driver:560.35.03": {"failure_rate": 1.0}}


def drains_per_host(pool: Pool) -> Counter[int]:
    """A task whose drain key is its own id opened a drain (a repair inherits its drain's key)."""
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def cycle_ended(train: Train, number: int) -> bool:
    return Cycle.objects.filter(train=train, number=number, ended_at__isnull=False).exists()


def tasks_of(component: str, version: str) -> dict[int, list[tuple[str, str]]]:
    """{host: (state, failure code) of each of its tasks for the target, oldest first}."""
    rows: dict[int, list[tuple[str, str]]] = {}
    for host_id, state, code in (
        HostTask.objects.filter(operation__component_version__component__name=component,
                                operation__component_version__version=version)
        .order_by("id").values_list("host_id", "state", "failure_code")
    ):  # fmt: skip
        rows.setdefault(host_id, []).append((state, code))
    return rows


def test_a_repaired_host_takes_up_its_train_work_and_one_retry_of_the_failed_upgrade_in_the_same_drain() -> None:
    instant_simulator(execute_by_kind=FAILING)
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, failure_buffer_hosts=4)
    train = make_train(pool)
    # Created first, so each drain applies it first: it fails on every host, and again on its retry.
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    failed = (TaskState.FAILED, FailureCode.EXECUTE_FAILED)
    assert tasks_of("gpu-driver", "560.35.03") == {host.pk: [failed, failed] for host in hosts}  # one retry each
    # applied after the repair, then handed over to the retry (created after it)
    assert tasks_of("bios", "2.16.0") == {host.pk: [(TaskState.HANDED_OVER, "")] for host in hosts}
    repaired = HostTask.objects.filter(operation__kind=OperationKind.REPAIR)
    assert Counter(repaired.values_list("host_id", flat=True)) == {host.pk: 2 for host in hosts}
    assert Event.objects.filter(kind="train.visit_retry").count() == len(hosts)

    # The fault is mended: the next cycle takes every host again, once, and applies the driver.
    instant_simulator()
    drive_trains(pool, until=lambda: cycle_ended(train, 2))

    assert drains_per_host(pool) == {host.pk: 2 for host in hosts}
    for host in hosts:
        installed = set(InstalledVersion.objects.filter(host=host).values_list("component__name", "version__version"))
        assert {("gpu-driver", "560.35.03"), ("bios", "2.16.0")} <= installed


def test_a_retry_that_succeeds_completes_the_rollout_in_the_cycle_of_the_failure() -> None:
    instant_simulator(execute_by_kind=FAILING)
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, failure_buffer_hosts=4)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)

    def mend_once_a_host_is_under_repair() -> None:
        if Host.objects.filter(pool=pool, state=HostState.REPAIR).exists():
            instant_simulator()  # the retry after the repair succeeds

    drive_trains(pool, until=lambda: cycle_ended(train, 1), each_round=mend_once_a_host_is_under_repair)

    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    tasks = tasks_of("gpu-driver", "560.35.03")
    retried = [host_id for host_id, rows in tasks.items() if rows[0] == (TaskState.FAILED, FailureCode.EXECUTE_FAILED)]
    assert retried  # the fault struck before it was mended
    for host_id in retried:
        assert tasks[host_id][1:] == [(TaskState.DONE, "")]
    for host in hosts:
        assert InstalledVersion.objects.filter(host=host, component__name="gpu-driver").get().version.version == (
            "560.35.03"
        )


def test_a_repaired_host_without_room_returns_and_its_train_work_waits_for_the_next_cycle() -> None:
    instant_simulator(execute_by_kind=FAILING)
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, failure_buffer_hosts=4)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    job = make_service(name="launch")

    def reserve_every_host_in_service_once_one_is_under_repair() -> None:
        if not CapacityReservation.objects.exists() and Host.objects.filter(pool=pool, state=HostState.REPAIR):
            CapacityReservation.objects.create(
                service=job, pool=pool, starts_at=clock.now() - dt.timedelta(minutes=1),
                ends_at=clock.now() + dt.timedelta(hours=1), reason="launch",
                min_hosts_in_service=pool_capacity(pool).in_service,
            )  # fmt: skip

    drive_trains(
        pool,
        until=lambda: cycle_ended(train, 1),
        each_round=reserve_every_host_in_service_once_one_is_under_repair,
    )

    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    deferred = HostTask.objects.filter(operation__component_version=bios.component_version)
    assert (TaskState.CANCELLED, FailureCode.DEFERRED) in set(deferred.values_list("state", "failure_code"))
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}


def test_ad_hoc_work_pending_for_a_failed_host_stays_pending_and_runs_after_the_repair() -> None:
    instant_simulator(execute_by_kind=FAILING)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, failure_buffer_hosts=1)
    for component, version in [("gpu-driver", "560.35.03"), ("bios", "2.16.0")]:
        operation_submit(
            kind=OperationKind.UPGRADE, scope=f"hosts: {hosts[0].hostname}", component=component, version=version,
            reason="asked for now",
        )  # fmt: skip

    drive(pool)

    bios = HostTask.objects.get(operation__component_version__version="2.16.0")
    assert (bios.state, bios.failure_code) == (TaskState.DONE, "")
