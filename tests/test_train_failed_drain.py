"""One drain per host per cycle, also when a drain fails: a train's other pending work for a host
whose execute failed is left to the next cycle, not applied in a second drain once the host is
repaired and back in service."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F

from fleet.models import InstalledVersion
from opsplanner.models import Event, HostTask, OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import FAILING_DRIVER, cycle_ended, drains_per_host, make_train
from trains.models import Pace
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def drains_per_host_cycle() -> Counter[tuple[int, int]]:
    """The drains trains' tasks opened, per (host, cycle)."""
    return Counter(
        HostTask.objects.filter(drain_key=F("id"), operation__visit_link__isnull=False).values_list(
            "host_id", "operation__visit_link__visit__cycle_id"
        )
    )


@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_a_host_whose_execute_failed_is_not_drained_again_in_that_cycle(pace: str) -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    # With a planned buffer of one host, a sliding train releases its visit's hosts one at a time.
    buffer = 1 if pace == Pace.SLIDING else None
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=buffer, failure_buffer_hosts=4)
    train = make_train(pool, pace=pace)
    # Created first, so each drain applies it first: it fails on the first domain's hosts.
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    first = {host.pk for host in hosts[:2]}

    def mend_once_a_catch_up_failed() -> None:
        """The repaired hosts catch up once, fail again, and return; then the fault is mended."""
        if HostTask.objects.filter(operation__visit_link__catch_up=True, state=TaskState.FAILED).exists():
            instant_simulator()

    drive_trains(pool, until=lambda: cycle_ended(train, 1), each_round=mend_once_a_catch_up_failed)

    if pace == Pace.SLIDING:  # the hosts went a few at a time, as each came back
        assert Event.objects.filter(kind="train.visit_released").exists()
    assert set(drains_per_host_cycle().values()) == {1}
    broken = set(HostTask.objects.filter(state=TaskState.FAILED).values_list("host_id", flat=True))
    assert broken
    assert broken <= first
    for host_id in broken:  # repaired twice in one drain: after the drain's failure and the catch-up's
        repairs = HostTask.objects.filter(host_id=host_id, operation__kind=OperationKind.REPAIR).order_by("id")
        assert [r.state for r in repairs] == [TaskState.HANDED_OVER, TaskState.DONE]
        # Its bios was deferred twice, by each failure, and the second repair offered nothing more.
        deferred = HostTask.objects.filter(host_id=host_id, operation__component_version=bios.component_version)
        assert list(deferred.values_list("state", "failure_code")) == [(TaskState.CANCELLED, FailureCode.DEFERRED)] * 2

    # The next cycle takes every host still below a target again, once, and applies both.
    drive_trains(pool, until=lambda: cycle_ended(train, 2))

    assert set(drains_per_host_cycle().values()) == {1}
    assert {host_id for host_id, n in drains_per_host(pool).items() if n == 2} == broken
    for host in hosts:
        installed = set(InstalledVersion.objects.filter(host=host).values_list("component__name", "version__version"))
        assert {("gpu-driver", "560.35.03"), ("bios", "2.16.0")} <= installed


def test_ad_hoc_work_pending_for_a_failed_host_stays_pending_and_runs_after_the_repair() -> None:
    instant_simulator(execute_by_kind=FAILING_DRIVER)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1, failure_buffer_hosts=1)
    for component, version in [("gpu-driver", "560.35.03"), ("bios", "2.16.0")]:
        operation_submit(
            kind=OperationKind.UPGRADE, scope=f"hosts: {hosts[0].hostname}", component=component, version=version,
            reason="asked for now",
        )  # fmt: skip

    drive(pool)

    bios = HostTask.objects.get(operation__component_version__version="2.16.0")
    assert (bios.state, bios.failure_code) == (TaskState.DONE, "")


def test_a_host_whose_drain_failed_is_not_drained_again_in_that_cycle() -> None:
    # The drainer refuses every host: each drain fails and the host returns. Its visit's other
    # upgrade, admitted after that, tried a second drain in the cycle.
    instant_simulator(refusing_host_fraction=1)
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    assert set(drains_per_host_cycle().values()) == {1}
    # Its own hosts returning from the failed drains are not other work filling the buffer.
    assert not Event.objects.filter(kind="train.autostopped").exists()
    failed = HostTask.objects.filter(failure_code=FailureCode.DRAIN_FAILED)
    assert set(failed.values_list("host_id", flat=True)) == {host.pk for host in hosts}
    deferred = HostTask.objects.filter(operation__component_version=bios.component_version)
    assert set(deferred.values_list("state", "failure_code")) == {(TaskState.CANCELLED, FailureCode.DEFERRED)}
