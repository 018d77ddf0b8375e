"""The database itself rejects inventory data that would break the model, whoever writes it.

These writes go around full_clean on purpose (raw ORM calls), as a buggy caller or a hand-written
SQL statement would; each must raise and leave nothing behind.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    ComponentLayer,
    Host,
    InstalledVersion,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
)
from tests.builders import make_component, make_domain, make_host, make_pool, make_service, make_version

pytestmark = pytest.mark.django_db


def rejected(write: Callable[[], object], model: type) -> None:
    """The write raises IntegrityError and the table holds as many rows as before."""
    before = model.objects.count()
    with pytest.raises(IntegrityError), transaction.atomic():
        write()
    assert model.objects.count() == before


def test_it_refuses_a_host_whose_domain_belongs_to_another_pool() -> None:
    east, west = make_pool(), make_pool()
    west_rack = make_domain(west)
    rejected(
        lambda: Host.objects.create(hostname="stray-1", pool=east, domain=west_rack, sku="cpu"),
        Host,
    )


def test_it_refuses_moving_a_host_into_a_domain_of_another_pool() -> None:
    host = make_host()
    other_rack = make_domain(make_pool())
    with pytest.raises(IntegrityError), transaction.atomic():
        Host.objects.filter(pk=host.pk).update(domain=other_rack)
    host.refresh_from_db()
    assert host.domain.pool_id == host.pool_id


def test_it_refuses_moving_a_domain_with_hosts_to_another_pool() -> None:
    host = make_host()
    other = make_pool()
    with pytest.raises(IntegrityError), transaction.atomic():
        MaintenanceDomain.objects.filter(pk=host.domain_id).update(pool=other)
    assert MaintenanceDomain.objects.get(pk=host.domain_id).pool_id == host.pool_id


def test_it_refuses_an_installed_version_of_another_component() -> None:
    host = make_host()
    bios, kernel = make_component(), make_component()
    kernel_version = make_version(kernel, "6.1.94")
    rejected(
        lambda: InstalledVersion.objects.create(host=host, component=bios, version=kernel_version),
        InstalledVersion,
    )


def test_it_refuses_two_installed_versions_of_one_component_on_one_host() -> None:
    host = make_host()
    bios = make_component()
    old, new = make_version(bios, "2.14.0"), make_version(bios, "2.15.1")
    InstalledVersion.objects.create(host=host, component=bios, version=old)
    rejected(lambda: InstalledVersion.objects.create(host=host, component=bios, version=new), InstalledVersion)


def test_it_refuses_an_opt_out_window_that_ends_before_it_starts() -> None:
    service = make_service()
    start = timezone.now() + dt.timedelta(hours=2)
    rejected(
        lambda: OptOutWindow.objects.create(service=service, starts_at=start, ends_at=start, reason="x"),
        OptOutWindow,
    )


def test_it_refuses_a_reservation_that_ends_before_it_starts_or_reserves_nothing() -> None:
    service, pool = make_service(), make_pool()
    start = timezone.now() + dt.timedelta(hours=2)

    def window(**fields: object) -> Callable[[], object]:
        values = {"service": service, "pool": pool, "starts_at": start, "ends_at": start + dt.timedelta(hours=1)}
        values.update({"min_hosts_in_service": 1, "reason": "launch"})
        values.update(fields)
        return lambda: CapacityReservation.objects.create(**values)

    rejected(window(ends_at=start - dt.timedelta(minutes=1)), CapacityReservation)
    rejected(window(min_hosts_in_service=0), CapacityReservation)
    rejected(window(reason=""), CapacityReservation)


@pytest.mark.parametrize(
    "buffers",
    [
        {"planned_buffer_hosts": 2, "planned_buffer_fraction": Decimal("0.1"), "failure_buffer_hosts": 1},
        {"failure_buffer_hosts": 1},
        {"planned_buffer_fraction": Decimal("1.0"), "failure_buffer_hosts": 1},
        {"planned_buffer_fraction": Decimal("-0.1"), "failure_buffer_hosts": 1},
        {"planned_buffer_fraction": Decimal("0.6"), "failure_buffer_fraction": Decimal("0.4")},
    ],
    ids=["count-and-fraction", "no-planned-buffer", "fraction-of-one", "negative-fraction", "buffers-take-all"],
)
def test_it_refuses_a_pool_whose_buffers_are_not_one_count_or_one_fraction_below_the_whole(
    buffers: dict[str, object],
) -> None:
    rejected(lambda: Pool.objects.create(name="bad-pool", workload_class="web", **buffers), Pool)


def test_it_refuses_a_compatibility_rule_whose_range_is_upside_down() -> None:
    cuda = make_component(ComponentLayer.JOB_FACING)
    driver = make_component()
    cuda_12 = make_version(cuda, "12.4.1")
    rejected(
        lambda: CompatibilityRule.objects.create(
            job_facing_version=cuda_12,
            lower_component=driver,
            min_version="560.0",
            min_key="000000560.000000000.000000000.000000000.000000000.000000000~",
            max_version="550.0",
            max_key="000000550.000000000.000000000.000000000.000000000.000000000~",
        ),
        CompatibilityRule,
    )


def test_it_refuses_an_unknown_host_state() -> None:
    host = make_host()
    with pytest.raises(IntegrityError), transaction.atomic():
        Host.objects.filter(pk=host.pk).update(state="on_fire")
    host.refresh_from_db()
    assert host.state == "in_service"
