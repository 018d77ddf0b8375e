"""One drain per host per cycle, also when a drain fails: a train's other pending work for a host
whose execute failed is left to the next cycle, not applied in a second drain once the host is
repaired and back in service."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F

from fleet.models import InstalledVersion, Pool
from opsplanner.models import Event, HostTask, OperationKind, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Cycle, Pace, Train
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

FAILING = {"upgrade:gpu-driver:560.35.03": {"failure_rate": 1.0}}


def drains_per_host(pool: Pool) -> Counter[int]:
    """A task whose drain key is its own id opened a drain (a repair inherits its drain's key)."""
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def cycle_ended(train: Train, number: int) -> bool:
    return Cycle.objects.filter(train=train, number=number, ended_at__isnull=False).exists()


@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_a_host_whose_execute_failed_is_not_drained_again_in_that_cycle(pace: str) -> None:
    instant_simulator(execute_by_kind=FAILING)
    # With a planned buffer of one host, a sliding train releases its visit's hosts one at a time.
    buffer = 1 if pace == Pace.SLIDING else None
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=buffer, failure_buffer_hosts=4)
    train = make_train(pool, pace=pace)
    # Created first, so each drain applies it first: it fails on every host.
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    drive_trains(pool, until=lambda: cycle_ended(train, 1))

    if pace == Pace.SLIDING:  # the hosts went a few at a time, as each came back
        assert Event.objects.filter(kind="train.visit_released").exists()
    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    deferred = HostTask.objects.filter(operation__component_version=bios.component_version)
    assert set(deferred.values_list("state", "failure_code")) == {(TaskState.CANCELLED, FailureCode.DEFERRED)}
    assert set(deferred.values_list("host_id", flat=True)) == {host.pk for host in hosts}
    repaired = HostTask.objects.filter(operation__kind=OperationKind.REPAIR).values_list("host_id", flat=True)
    assert sorted(repaired) == sorted(host.pk for host in hosts)

    # The fault is mended: the next cycle takes every host again, once, and applies both.
    instant_simulator()
    drive_trains(pool, until=lambda: cycle_ended(train, 2))

    assert drains_per_host(pool) == {host.pk: 2 for host in hosts}
    for host in hosts:
        installed = set(InstalledVersion.objects.filter(host=host).values_list("component__name", "version__version"))
        assert {("gpu-driver", "560.35.03"), ("bios", "2.16.0")} <= installed


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
