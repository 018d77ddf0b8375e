"""A multi-cycle upgrade that joins a running visit late takes its hosts_per_visit places on the
visit's hosts where it fits the budget, as a visit starting does (visits.domain_selection): a host
already carrying long work does not take the place and leave the upgrade out of the visit."""

from __future__ import annotations

import pytest

from fleet.models import Host, Pool
from fleet.services import installed_version_set
from opsplanner.models import HostTask
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train, nic_firmware
from trains.models import Pace, Train, Upgrade, Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def a_visit_with_one_busy_host(pace: str) -> tuple[Pool, Host, Train, Visit]:
    """A running visit of one domain's two hosts against a 3600 s budget (600 s overhead): the
    first by id carries a 2400 s driver and a 300 s bios (3300 s), the other the bios
    alone (returned with the pool, the train and the visit)."""
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
    busy, free = sorted(hosts, key=lambda h: h.pk)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600, pace=pace)
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver",
        scope=f"hosts: {busy.hostname}", priority=300, duration_s=2400,
    )  # fmt: skip
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=300)
    train_tick(train_id=train.pk)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert sorted(visit.plan["hosts"]) == [busy.pk, free.pk]
    return pool, free, train, visit


def nic_multi_cycle(pool: Pool) -> Upgrade:
    """900 s a host, one host a visit: 600 + 3600 s on the busy host, 600 + 1200 s on the other."""
    return upgrade_create(
        pool=pool, component="nic-firmware", version="22.4", reason="slow flash", duration_s=900,
        multi_cycle=True, hosts_per_visit=1,
    )  # fmt: skip


@pytest.mark.parametrize("pace", [Pace.DOMAIN, Pace.SLIDING])
def test_it_joins_a_late_multi_cycle_upgrade_on_the_host_where_it_fits_the_budget(pace: str) -> None:
    pool, free, train, visit = a_visit_with_one_busy_host(pace)

    late = nic_multi_cycle(pool)
    report = train_tick(train_id=train.pk)

    assert f"upgrade {late.pk} joined visit {visit.pk} on 1 hosts" in report.events
    assert list(HostTask.objects.filter(operation__visit_link__upgrade=late).values_list("host_id", flat=True)) == [
        free.pk
    ]
    visit.refresh_from_db()
    assert visit.plan["estimate_s"] == 600 + 2700  # still the busy host's chain


def test_it_leaves_a_late_upgrade_only_on_the_hosts_where_it_does_not_fit() -> None:
    # As a visit starting takes an upgrade on the hosts where it fits and leaves it on the others
    # for the next cycle (select_within_budget), a late one is not left on every host for one.
    pool, free, train, visit = a_visit_with_one_busy_host(Pace.DOMAIN)

    late = upgrade_create(pool=pool, component="nic-firmware", version="22.4", reason="fix", duration_s=900)
    report = train_tick(train_id=train.pk)

    assert f"upgrade {late.pk} joined visit {visit.pk} on 1 hosts" in report.events
    assert list(HostTask.objects.filter(operation__visit_link__upgrade=late).values_list("host_id", flat=True)) == [
        free.pk
    ]
