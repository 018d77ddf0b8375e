"""Late joiners: an upgrade created while a visit runs is applied to the visit's hosts that are
still drained or not yet started, in the same drain, when it fits the visit's budget."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from fleet.models import ComponentVersion, Host, HostState, Pool
from fleet.services import installed_version_set
from opsplanner.models import Event, HostTask
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train, nic_firmware
from trains.models import Train, Upgrade, UpgradeState, Visit, VisitOperation, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def drains_per_host(pool: Pool) -> Counter[int]:
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def a_visit_draining(**train_fields: object) -> tuple[Pool, list[Host], Train, Visit]:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool, **train_fields)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    train_tick(train_id=train.pk)
    pool_tick(pool_id=pool.pk, kick=False)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert Host.objects.filter(pk__in=visit.plan["hosts"], state=HostState.DRAINING).count() == 2
    return pool, hosts, train, visit


def test_an_upgrade_created_mid_visit_joins_the_drained_hosts_in_the_same_drain() -> None:
    pool, hosts, train, visit = a_visit_draining()

    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver fix")
    report = train_tick(train_id=train.pk)

    assert f"upgrade {late.pk} joined visit {visit.pk} on 2 hosts" in report.events
    link = VisitOperation.objects.get(visit=visit, upgrade=late)
    assert set(link.operation.tasks.values_list("host_id", flat=True)) == set(visit.plan["hosts"])
    visit.refresh_from_db()
    assert visit.plan["upgrades"][-1]["joined"] is True
    assert Event.objects.filter(kind="train.visit_joined", subject_id=visit.pk, data__upgrade=late.pk).exists()
    # Joining twice is not joining again.
    train_tick(train_id=train.pk)
    assert VisitOperation.objects.filter(visit=visit, upgrade=late).count() == 1

    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists())

    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    for host_id in visit.plan["hosts"]:  # both upgrades in the one drain
        keys = set(HostTask.objects.filter(host_id=host_id).values_list("drain_key", flat=True))
        assert len(keys) == 1
        assert HostTask.objects.filter(host_id=host_id).count() == 2


def busy_tick_queries(train: Train) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert train_tick(train_id=train.pk).events == []
    return len(captured)


def test_an_upgrade_created_mid_visit_that_does_not_fit_its_budget_waits_and_is_considered_once() -> None:
    # A budget for one upgrade per visit: 600 s overhead + 1200 s work against 3600 / 2 = 1800 s.
    pool, _, train, visit = a_visit_draining(cycle_slo_s=3600, visit_overhead_s=600)
    quiet = busy_tick_queries(train)

    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="fix", duration_s=1200)
    train_tick(train_id=train.pk)

    assert not VisitOperation.objects.filter(visit=visit, upgrade=late).exists()
    assert not Event.objects.filter(kind="train.visit_joined").exists()
    visit.refresh_from_db()
    assert visit.plan["late_seen"] == [late.pk]
    # Considered once: the busy ticks after it cost what they cost before it came.
    assert busy_tick_queries(train) == quiet


def test_a_late_upgrade_skips_hosts_of_the_visit_already_on_their_way_back() -> None:
    pool, _, train, visit = a_visit_draining()
    leaving, staying = sorted(visit.plan["hosts"])
    # One host's work is applied and it is being verified: it no longer takes work in this drain.
    HostTask.objects.filter(host_id=leaving, operation__visit_link__visit=visit).update(state="verifying")

    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver fix")
    train_tick(train_id=train.pk)

    link = VisitOperation.objects.get(visit=visit, upgrade=late)
    assert list(link.operation.tasks.values_list("host_id", flat=True)) == [staying]


def test_a_multi_cycle_upgrade_that_joins_late_keeps_its_bound_of_hosts_per_visit() -> None:
    pool, _, train, visit = a_visit_draining()

    late = upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="slow flash", multi_cycle=True, hosts_per_visit=1
    )
    report = train_tick(train_id=train.pk)

    assert f"upgrade {late.pk} joined visit {visit.pk} on 1 hosts" in report.events
    assert HostTask.objects.filter(operation__visit_link__upgrade=late).count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_that_commits_while_a_visit_starts_joins_that_visit() -> None:
    # upgrade_create stamps its row, then checks and forecasts before it commits; a train tick that
    # starts a visit meanwhile cannot see it, though it was created before the visit started.
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    created, commit = threading.Event(), threading.Event()

    def an_operator_creates_an_upgrade() -> None:
        try:
            with transaction.atomic():
                upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver fix")
                created.set()
                commit.wait(30)
        finally:
            connection.close()

    operator = threading.Thread(target=an_operator_creates_an_upgrade)
    operator.start()
    assert created.wait(30)
    train_tick(train_id=train.pk)  # starts the first visit with the bios alone
    commit.set()
    operator.join(30)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    late = Upgrade.objects.get(pool=pool, component_version__component__name="gpu-driver")
    pool_tick(pool_id=pool.pk, kick=False)
    train_tick(train_id=train.pk)

    assert late.created_at < visit.started_at  # stamped before the visit started, committed after
    assert VisitOperation.objects.filter(visit=visit, upgrade=late).exists()
    assert late.pk not in Visit.objects.get(pk=visit.pk).plan["considered"]


def visit_of_two_upgrades_on_different_hosts(work_s: int) -> tuple[Pool, Visit]:
    """A running visit of rack-0001's two hosts: bios on the first, nic firmware on the second, each
    `work_s`; a budget of 3600 s (7200 s over 2 domains), 600 s overhead."""
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
    first, second = hosts[0], hosts[1]  # rack-0001
    installed_version_set(host=first, version=nic["22.4"])  # needs only bios
    installed_version_set(host=second, version=ComponentVersion.objects.get(component__name="bios", version="2.16.0"))
    train = make_train(pool, cycle_slo_s=7200, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=work_s)
    upgrade_create(pool=pool, component="nic-firmware", version="22.4", reason="rollout", duration_s=work_s)
    train_tick(train_id=train.pk)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert sorted(visit.plan["hosts"]) == sorted([first.pk, second.pk])
    assert visit.plan["estimate_s"] == 600 + work_s  # the hosts' chains are apart
    return pool, visit


def test_a_late_upgrade_that_fits_beside_the_busiest_hosts_work_joins_the_visit() -> None:
    pool, visit = visit_of_two_upgrades_on_different_hosts(1200)

    # 1200 s more on each host: each chain 2400 s, 600 + 2400 = 3000 s within 3600 s.
    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="fix", duration_s=1200)
    train_tick(train_id=visit.train_id)

    assert VisitOperation.objects.filter(visit=visit, upgrade=late).exists()


def test_a_late_join_records_the_cost_of_the_busiest_hosts_work_not_of_every_upgrade_on_every_host() -> None:
    pool, visit = visit_of_two_upgrades_on_different_hosts(600)

    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="fix", duration_s=600)
    train_tick(train_id=visit.train_id)

    visit.refresh_from_db()
    assert VisitOperation.objects.filter(visit=visit, upgrade=late).exists()
    # Each host applies two upgrades: 600 + 2 x 600 = 1800 s. The plan's cost is what the next
    # visits' correction is measured against; recorded higher, the visit "ran faster than planned".
    assert visit.plan["cost_s"] == 1800
