"""Inventory services validate with clear messages, write their event, and write nothing on refusal."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from fleet import services
from fleet.models import ComponentLayer, Host, HostState, InstalledVersion, OptOutWindow, Pool
from fleet.services import HostTransitionError
from opsplanner.models import Event
from tests.builders import make_component, make_domain, make_host, make_pool, make_service, make_version

pytestmark = pytest.mark.django_db


def refused(call: Callable[[], object], message: str) -> ValidationError:
    """The call raises ValidationError containing message, and no row and no event was written."""
    events_before = Event.objects.count()
    with pytest.raises(ValidationError) as caught:
        call()
    assert message in " ".join(caught.value.messages), caught.value.messages
    assert Event.objects.count() == events_before
    return caught.value


def test_creating_a_pool_writes_an_event() -> None:
    pool = make_pool(name="web-east", workload_class="web")
    event = Event.objects.get(kind="pool.created")
    assert (event.subject_id, event.pool_id, event.actor) == (pool.pk, pool.pk, "system")


def test_it_refuses_a_pool_with_both_a_buffer_count_and_fraction() -> None:
    refused(
        lambda: services.pool_create(
            name="bad",
            workload_class="web",
            planned_buffer_hosts=3,
            planned_buffer_fraction=Decimal("0.1"),
            failure_buffer_hosts=1,
        ),
        "Give the planned buffer as a host count or as a fraction of the pool (exactly one).",
    )
    assert not Pool.objects.filter(name="bad").exists()


def test_it_refuses_a_pool_with_a_bad_name_or_workload_class() -> None:
    error = refused(
        lambda: services.pool_create(
            name="Bad Pool!", workload_class="gaming", failure_buffer_hosts=1, planned_buffer_hosts=1
        ),
        "lowercase letters",
    )
    assert "workload_class" in error.message_dict


def test_buffers_in_hosts_round_down_and_give_the_floor() -> None:
    pool = make_pool(planned_buffer_fraction=Decimal("0.05"), failure_buffer_hosts=3, failure_buffer_fraction=None)
    buffers = pool.buffers_for(110)
    assert (buffers.planned, buffers.failure, buffers.floor) == (5, 3, 102)


def test_it_refuses_a_second_domain_with_the_same_name_in_a_pool() -> None:
    pool = make_pool()
    services.domain_create(pool=pool, name="rack-0001")
    refused(lambda: services.domain_create(pool=pool, name="rack-0001"), "already has a domain with that name")
    services.domain_create(pool=make_pool(), name="rack-0001")  # another pool may use the name


def test_it_refuses_a_host_with_a_bad_hostname_or_too_many_gpus() -> None:
    domain = make_domain()
    refused(lambda: services.host_create(hostname="Bad_Host", domain=domain, sku="x"), "lowercase DNS name")
    refused(lambda: services.host_create(hostname="ok-1", domain=domain, sku="x", gpu_count=65), "64")
    assert not Host.objects.exists()


def test_a_host_takes_its_pool_from_its_domain_and_the_model_check_explains_a_mismatch() -> None:
    host = make_host()
    assert host.pool_id == host.domain.pool_id
    host.domain = make_domain(make_pool(name="elsewhere"))
    with pytest.raises(ValidationError, match="belongs to pool elsewhere"):
        host.full_clean()


def test_it_refuses_a_version_that_is_not_a_version() -> None:
    component = make_component()
    refused(lambda: services.component_version_create(component=component, version="latest"), "is not a version")


def test_installing_a_version_replaces_the_previous_one_and_records_both() -> None:
    host = make_host()
    driver = make_component(name="gpu-driver")
    old, new = make_version(driver, "550.127.05"), make_version(driver, "560.35.03")
    services.installed_version_set(host=host, version=old)
    services.installed_version_set(host=host, version=new, reason="train visit")
    assert InstalledVersion.objects.get(host=host, component=driver).version == new
    event = Event.objects.filter(kind="host.version_installed").first()
    assert event.data == {"component": "gpu-driver", "from": "550.127.05", "to": "560.35.03"}
    assert (event.host_id, event.reason) == (host.pk, "train visit")


def test_it_refuses_compatibility_rules_that_cannot_be_right() -> None:
    cuda = make_component(ComponentLayer.JOB_FACING, name="cuda")
    driver = make_component(name="driver")
    cuda_12 = make_version(cuda, "12.4.1")
    driver_550 = make_version(driver, "550.1")
    refused(
        lambda: services.compatibility_rule_create(
            job_facing_version=cuda_12, lower_component=driver, min_version="560", max_version="550"
        ),
        "550 is below the lowest version 560",
    )
    refused(
        lambda: services.compatibility_rule_create(
            job_facing_version=driver_550, lower_component=driver, min_version="1"
        ),
        "driver is not a job-facing component",
    )
    refused(
        lambda: services.compatibility_rule_create(job_facing_version=cuda_12, lower_component=cuda, min_version="1"),
        "cuda is not a lower-level component",
    )
    refused(
        lambda: services.compatibility_rule_create(job_facing_version=cuda_12, lower_component=driver),
        "Give at least one bound",
    )


def test_it_refuses_opt_out_windows_that_end_before_they_start_or_are_already_over() -> None:
    service = make_service()
    now = timezone.now()
    refused(
        lambda: services.optout_window_create(
            service=service, starts_at=now + dt.timedelta(hours=3), ends_at=now + dt.timedelta(hours=1), reason="x"
        ),
        "The end must be after the start.",
    )
    refused(
        lambda: services.optout_window_create(
            service=service, starts_at=now - dt.timedelta(hours=3), ends_at=now - dt.timedelta(hours=1), reason="x"
        ),
        "already over",
    )
    refused(
        lambda: services.optout_window_create(
            service=service, starts_at=now, ends_at=now + dt.timedelta(hours=1), reason=""
        ),
        "This field cannot be blank.",
    )
    assert not OptOutWindow.objects.exists()


def test_an_opt_out_window_can_be_cancelled_once(operator) -> None:
    service = make_service()
    now = timezone.now()
    window = services.optout_window_create(
        service=service, starts_at=now, ends_at=now + dt.timedelta(hours=4), reason="checkpoint", actor=operator
    )
    assert window.created_by == operator
    assert window.is_active_at(now + dt.timedelta(hours=1))
    assert services.optout_window_cancel(window_id=window.pk, reason="done early", actor=operator) is True
    assert services.optout_window_cancel(window_id=window.pk, reason="again", actor=operator) is False
    assert Event.objects.filter(kind="optout_window.cancelled").count() == 1
    window.refresh_from_db()
    assert not window.is_active_at(now + dt.timedelta(hours=1))


def test_it_refuses_a_reservation_larger_than_the_pool() -> None:
    pool = make_pool(name="tiny")
    make_host(make_domain(pool))
    service = make_service()
    now = timezone.now()
    refused(
        lambda: services.reservation_create(
            service=service,
            pool=pool,
            min_hosts_in_service=2,
            starts_at=now,
            ends_at=now + dt.timedelta(hours=1),
            reason="launch",
        ),
        "Pool tiny has only 1 hosts; cannot reserve 2.",
    )


def test_placing_a_service_twice_on_a_host_adds_it_once() -> None:
    service = make_service()
    first, second = make_host(), make_host()
    assert services.service_place(service=service, hosts=[first], running_jobs=2) == 1
    assert services.service_place(service=service, hosts=[first, second]) == 1
    assert set(service.hosts.values_list("pk", flat=True)) == {first.pk, second.pk}
    refused(lambda: services.service_place(service=service, hosts=[]), "Name at least one host.")


def test_a_host_moves_only_along_its_lifecycle_with_an_event_per_step() -> None:
    host = make_host()
    assert services.host_transition(
        host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.DRAINING, reason="train visit"
    )
    with pytest.raises(HostTransitionError, match="cannot go from draining to in_service"):
        services.host_transition(
            host_id=host.pk, expected=HostState.DRAINING, new=HostState.IN_SERVICE, reason="skip verification"
        )
    # A caller that still thinks the host is in service loses: nothing changes.
    assert not services.host_transition(
        host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.DRAINING, reason="stale"
    )
    events = Event.objects.filter(kind="host.state_changed", host_id=host.pk)
    assert [e.data for e in events] == [{"from": "in_service", "to": "draining"}]


@pytest.mark.django_db(transaction=True)
def test_of_many_racing_transitions_of_one_host_exactly_one_wins() -> None:
    host = make_host()
    racers = 8
    barrier = threading.Barrier(racers)
    results: list[bool] = []
    lock = threading.Lock()

    def race() -> None:
        try:
            barrier.wait()
            won = services.host_transition(
                host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.DRAINING, reason="race"
            )
            with lock:
                results.append(won)
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * (racers - 1) + [True]
    assert Event.objects.filter(kind="host.state_changed", host_id=host.pk).count() == 1
    assert Host.objects.get(pk=host.pk).state == HostState.DRAINING
