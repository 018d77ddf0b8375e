"""Superseded versions skipped: a host that has not yet received version N of a component when N+1
arrives gets N+1 directly; the older upgrade counts it as superseded, not pending."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F

from fleet.models import Component, ComponentVersion, InstalledVersion, Pool
from opsplanner.models import HostTask
from tests.builders import make_fleet, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Upgrade, UpgradeState, Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def bios_2_18() -> ComponentVersion:
    bios = Component.objects.get(name="bios")
    return ComponentVersion.objects.filter(component=bios, version="2.18.0").first() or make_version(bios, "2.18.0")


def drains_per_host(pool: Pool) -> Counter[int]:
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def installed_bios(pool: Pool) -> set[str]:
    return set(
        InstalledVersion.objects.filter(host__pool=pool, component__name="bios").values_list(
            "version__version", flat=True
        )
    )


def test_a_host_that_has_not_received_n_when_n_plus_one_arrives_gets_n_plus_one_directly() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    older = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="first release")
    bios_2_18()
    newer = upgrade_create(pool=pool, component="bios", version="2.18.0", reason="fixed release")

    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists())

    assert installed_bios(pool) == {"2.18.0"}
    # Nobody flashed 2.16.0 on the way: the older upgrade's work was never submitted.
    assert not HostTask.objects.filter(operation__component_version__version="2.16.0").exists()
    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}
    for visit in Visit.objects.filter(train=train, state=VisitState.DONE):
        assert visit.plan["upgrades"] == [
            {"upgrade": newer.pk, "target": "bios 2.18.0", "phase": "all", "hosts": 2, "work_s": 30,
             "supersedes": {str(older.pk): 2}}
        ]  # fmt: skip
    older.refresh_from_db()
    assert older.state == UpgradeState.COMPLETED
    assert "or newer" in older.state_reason


def test_the_older_version_still_goes_where_the_newer_one_is_not_allowed() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="first release")
    bios_2_18()
    upgrade_create(
        pool=pool, component="bios", version="2.18.0", reason="fixed release, first rack only",
        scope=f"domain {pool.name}/rack-0001",
    )  # fmt: skip

    train_tick(train_id=train.pk)

    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert [u["target"] for u in first.plan["upgrades"]] == ["bios 2.18.0"]
    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists())
    by_rack = dict(
        InstalledVersion.objects.filter(host__pool=pool, component__name="bios").values_list(
            "host__domain__name", "version__version"
        )
    )
    assert by_rack == {"rack-0001": "2.18.0", "rack-0002": "2.16.0"}
    assert drains_per_host(pool) == {host.pk: 1 for host in hosts}


def test_a_newer_release_takes_the_queue_place_of_the_older_one_it_supersedes() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    # A budget for one upgrade per visit: 600 s overhead + 1200 s work against 3600 / 2 = 1800 s.
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600)
    older = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="urgent", priority=500, duration_s=1200
    )
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="routine", duration_s=1200)
    bios_2_18()
    newer = upgrade_create(pool=pool, component="bios", version="2.18.0", reason="fixed", duration_s=1200)

    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    # The fixed release inherits the urgent place: it goes before the routine driver upgrade.
    assert [u["upgrade"] for u in visit.plan["upgrades"]] == [newer.pk]
    assert visit.plan["upgrades"][0]["supersedes"] == {str(older.pk): 2}


def test_ad_hoc_operations_to_n_and_n_plus_one_on_one_host_apply_only_n_plus_one() -> None:
    from opsplanner.models import WorkItem, WorkKind
    from opsplanner.services.operations import operation_submit
    from tests.driving import drive

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    bios_2_18()
    for version in ("2.16.0", "2.18.0"):
        operation_submit(
            kind="upgrade", scope=f"hosts: {hosts[0].hostname}", component="bios", version=version,
            reason="ad hoc", actor="op",
        )  # fmt: skip

    drive(pool)

    assert installed_bios(pool) == {"2.18.0"}
    assert WorkItem.objects.filter(host=hosts[0], kind=WorkKind.EXECUTE).count() == 1


def test_a_higher_priority_n_plus_one_is_not_followed_by_n_in_the_same_drain() -> None:
    from opsplanner.services.operations import operation_submit
    from tests.driving import drive

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    bios_2_18()
    for version, priority in (("2.16.0", 100), ("2.18.0", 200)):
        operation_submit(
            kind="upgrade", scope=f"hosts: {hosts[0].hostname}", component="bios", version=version,
            priority=priority, reason="ad hoc", actor="op",
        )  # fmt: skip

    drive(pool)

    assert installed_bios(pool) == {"2.18.0"}


def test_an_upgrade_stays_unfinished_while_a_host_of_its_scope_runs_neither_its_target_nor_newer(
    django_assert_num_queries: object,
) -> None:
    from fleet.services import installed_version_set
    from trains.services.upgrades import hosts_below_target, upgrades_unfinished

    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)  # both run bios 2.14.0
    bios = {v.version: v for v in ComponentVersion.objects.filter(component__name="bios")}
    bios["2.18.0"] = bios_2_18()
    to_2_16 = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    to_2_18 = upgrade_create(pool=pool, component="bios", version="2.18.0", reason="rollout")
    scope = [h.pk for h in hosts]
    installed_version_set(host=hosts[0], version=bios["2.16.0"])
    installed_version_set(host=hosts[1], version=bios["2.18.0"])  # supersedes 2.16.0 there

    with django_assert_num_queries(1):  # type: ignore[operator]
        unfinished = upgrades_unfinished([to_2_16, to_2_18], scope)

    assert unfinished == {to_2_18.pk}, "2.16.0 is done: one host runs it, the other a newer release"
    assert {u.pk for u in (to_2_16, to_2_18) if hosts_below_target(u, scope).exists()} == unfinished
    assert upgrades_unfinished([to_2_16, to_2_18], []) == set(), "no hosts, nothing below target"


def test_a_withdrawn_newer_release_on_a_host_does_not_make_the_older_upgrade_done_there() -> None:
    from django.db import transaction

    from fleet.services import installed_version_set
    from tests.driving import busy
    from trains.services.offboarding import upgrade_offboard

    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    make_train(pool)
    bios = Component.objects.get(name="bios")
    make_version(bios, "2.18.0")
    newer = upgrade_create(pool=pool, component="bios", version="2.18.0", reason="n+1")
    # An earlier drain gave host 0 the new bios (it ran 2.14.0); then N+1 is offboarded: withdrawn,
    # and the host is to be rolled back.
    installed_version_set(host=hosts[0], version=ComponentVersion.objects.get(component=bios, version="2.18.0"))
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=newer.pk), reason="bad bios")
    older = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="n", scope=f"hosts: {hosts[0].hostname}"
    )

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=older.pk).state != UpgradeState.ACTIVE and not busy([pool]))

    older.refresh_from_db()
    runs = InstalledVersion.objects.get(host=hosts[0], component=bios).version.version
    assert (older.state, runs) == (UpgradeState.COMPLETED, "2.16.0"), older.state_reason
