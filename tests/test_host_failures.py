"""A host that breaks in service goes to repair through the failure buffer and comes back verified."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleet.models import Host, HostState
from opsplanner.models import Event, HostTask, Lease, OperationKind, TaskState, WorkItem, WorkKind
from opsplanner.services.failures import host_failure_report
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db


def test_a_host_that_breaks_in_service_is_repaired_verified_and_returned() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    broken = hosts[0]

    repair = host_failure_report(host_id=broken.pk, reason="GPU fell off the bus", actor="monitor")

    assert repair.kind == OperationKind.REPAIR
    assert Host.objects.get(pk=broken.pk).state == HostState.FAILED
    pool_tick(pool_id=pool.pk)
    assert Host.objects.get(pk=broken.pk).state == HostState.REPAIR
    assert HostTask.objects.get(operation=repair).state == TaskState.RUNNING
    drive(pool)
    assert Host.objects.get(pk=broken.pk).state == HostState.IN_SERVICE
    assert HostTask.objects.get(operation=repair).state == TaskState.DONE
    kinds = set(WorkItem.objects.filter(host_task__operation=repair).values_list("kind", flat=True))
    assert kinds == {WorkKind.EXECUTE, WorkKind.VERIFY, WorkKind.UNDRAIN}  # no drain: it was already out
    assert not Lease.objects.filter(active=True).exists()


def test_a_broken_hosts_repair_does_not_use_the_planned_buffer() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=1, failure_buffer_hosts=2)
    operation_submit(kind="reboot", scope=f"hosts: {hosts[1].hostname}", reason="kernel patch")
    host_failure_report(host_id=hosts[0].pk, reason="PSU failed", actor="monitor")

    pool_tick(pool_id=pool.pk)

    states = dict(Host.objects.filter(pool=pool).values_list("hostname", "state"))
    assert states[hosts[0].hostname] == HostState.REPAIR
    assert states[hosts[1].hostname] == HostState.DRAINING  # the reboot still got the one planned slot


def test_it_refuses_to_fail_a_host_under_maintenance_and_writes_nothing() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="patch")
    pool_tick(pool_id=pool.pk)
    events = Event.objects.count()

    with pytest.raises(ValidationError, match=f"held by operation #{operation.pk}"):
        host_failure_report(host_id=hosts[0].pk, reason="looks broken", actor="monitor")

    assert Event.objects.count() == events
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.DRAINING


def test_it_refuses_an_unknown_host_and_a_missing_reason() -> None:
    with pytest.raises(ValidationError, match="no host #999999"):
        host_failure_report(host_id=999_999, reason="broken")
    _, hosts = make_fleet(domains=1, hosts_per_domain=1)
    with pytest.raises(ValidationError, match="Say what is wrong"):
        host_failure_report(host_id=hosts[0].pk, reason="  ")
    assert Host.objects.get(pk=hosts[0].pk).state == HostState.IN_SERVICE
