"""Visits sized to the promise: each visit takes the pending upgrades that fit its share of the cycle
SLO, in (priority, deadline, age) order; the rest waits for the next cycle, one drain per host per
cycle; a train whose upgrade cannot fit even alone says so at once, with the numbers."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import F

from fleet.models import Component, ComponentLayer, ComponentVersion, Pool
from fleet.services import installed_version_set
from opsplanner.models import Event, HostTask
from tests.builders import make_component, make_fleet, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train, nic_firmware
from trains.models import BudgetCode, Cycle, Train, Upgrade, UpgradeState, Visit, VisitState
from trains.services.budget import VisitSizing, select_within_budget
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

# Two domains, one visit at a time: each visit's budget is 3600 s. With 600 s of overhead and
# upgrades of 1200 s per host, a visit fits two upgrades (600 + 2 x 1200 = 3000), not three (4200).
SLO_S = 7200
WORK_S = 1200


def bmc() -> dict[str, ComponentVersion]:
    component = Component.objects.filter(name="bmc").first() or make_component(ComponentLayer.LOWER_LEVEL, name="bmc")
    return {
        v: ComponentVersion.objects.filter(component=component, version=v).first() or make_version(component, v)
        for v in ("1.0", "1.1")
    }


def four_components_fleet() -> Pool:
    """Two domains of two hosts that can take four upgrades: gpu-driver, bios, nic-firmware, bmc."""
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    nic, board = nic_firmware(), bmc()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
        installed_version_set(host=host, version=board["1.0"])
    return pool


TARGETS = [("gpu-driver", "560.35.03"), ("bios", "2.16.0"), ("nic-firmware", "22.4"), ("bmc", "1.1")]


def create_upgrades(pool: Pool, priorities: list[int]) -> list[Upgrade]:
    return [
        upgrade_create(pool=pool, component=c, version=v, reason="rollout", priority=p, duration_s=WORK_S)
        for (c, v), p in zip(TARGETS, priorities, strict=True)
    ]


def drains_per_host(pool: Pool) -> Counter[int]:
    return Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))


def test_a_visit_never_exceeds_its_budget_when_more_work_is_pending() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    create_upgrades(pool, [100, 100, 100, 100])

    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.plan["budget_s"] == 3600
    assert visit.plan["cost_s"] == 3000
    assert len(visit.plan["upgrades"]) == 2
    assert len(visit.plan["left"]) == 2
    started = Event.objects.get(kind="train.visit_started", subject_id=visit.pk)
    assert started.data["left"] == [u["upgrade"] for u in visit.plan["left"]]
    assert "wait for the next cycle" in started.reason


def test_leftover_work_is_taken_by_the_next_cycle_in_priority_order_with_one_drain_per_host_per_cycle() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    low, top, mid, high = create_upgrades(pool, [50, 400, 100, 300])

    drive_trains(pool, until=lambda: not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists())

    first, second = (
        [[u["upgrade"] for u in v.plan["upgrades"]] for v in Visit.objects.filter(cycle=c).order_by("position")]
        for c in Cycle.objects.filter(train=train).order_by("number")
    )
    assert first == [[top.pk, high.pk], [top.pk, high.pk]]
    assert second == [[mid.pk, low.pk], [mid.pk, low.pk]]
    for visit in Visit.objects.filter(train=train):
        assert visit.plan["cost_s"] <= visit.plan["budget_s"]
    assert set(drains_per_host(pool).values()) == {2}  # two cycles, one drain each


def test_a_deadline_moves_an_upgrade_ahead_of_older_ones_of_the_same_priority() -> None:
    import datetime as dt

    from opsplanner import clock

    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    first, second, third = (
        upgrade_create(pool=pool, component=c, version=v, reason="rollout", duration_s=WORK_S) for c, v in TARGETS[:3]
    )
    urgent = upgrade_create(
        pool=pool, component="bmc", version="1.1", reason="security fix", duration_s=WORK_S,
        deadline=clock.now() + dt.timedelta(days=30),
    )  # fmt: skip

    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert [u["upgrade"] for u in visit.plan["upgrades"]] == [urgent.pk, first.pk]
    assert {u["upgrade"] for u in visit.plan["left"]} == {second.pk, third.pk}


def test_an_upgrade_too_long_for_any_visit_is_said_at_once_with_the_numbers_and_still_applied() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)

    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=5400)

    train.refresh_from_db()
    assert train.budget_code == BudgetCode.UPGRADE_TOO_LONG
    assert "needs 6000 s per visit" in train.budget_reason
    assert "budget of 3600 s" in train.budget_reason
    assert "a cycle SLO of at least 12000 s" in train.budget_reason
    alert = Event.objects.get(kind="alert.train_visit_over_budget", subject_id=train.pk)
    assert alert.data["budget_s"] == 3600
    # The backlog keeps moving: the visit takes it alone, over its budget.
    train_tick(train_id=train.pk)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert [u["upgrade"] for u in visit.plan["upgrades"]] == [upgrade.pk]
    # Said once, not on every tick.
    train_tick(train_id=train.pk)
    assert Event.objects.filter(kind="alert.train_visit_over_budget").count() == 1


def test_a_domain_larger_than_the_buffer_runs_in_waves_and_the_advice_names_buffer_and_domain_size() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)

    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=2400)

    train = Train.objects.get(pk=train.pk)
    # Two waves of (600 + 2400) s: 6000 s against 3600 s; one wave fits.
    assert "needs 6000 s per visit (2 wave(s)" in train.budget_reason
    assert "a planned buffer of at least 4 hosts" in train.budget_reason
    assert "domains of at most 2 hosts" in train.budget_reason


def test_the_overrun_clears_when_the_upgrade_that_caused_it_is_gone() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="slow", duration_s=5400)
    Upgrade.objects.filter(pk=upgrade.pk).update(state=UpgradeState.CANCELLED)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="fast", duration_s=600)

    train.refresh_from_db()
    assert (train.budget_code, train.budget_reason) == (BudgetCode.NONE, "")
    assert Event.objects.filter(kind="train.visit_budget_fits", subject_id=train.pk).exists()


def test_first_fit_takes_the_first_candidate_alone_over_the_budget_and_skips_what_does_not_fit() -> None:
    sizing = VisitSizing(budget_s=1000, overhead_s=100, hosts_at_once=10, factor=1.0, domains=1, largest_domain=10)
    works = {"big": 2000, "mid": 500, "small": 300}

    alone = select_within_budget(["big", "small"], sizing=sizing, hosts_of=lambda _: {1}, work_of=works.__getitem__)
    fit = select_within_budget(
        ["mid", "big", "small"], sizing=sizing, hosts_of=lambda _: {1}, work_of=works.__getitem__
    )

    assert (alone.taken, alone.left, alone.over_budget) == (["big"], ["small"], True)
    assert (fit.taken, fit.left, fit.cost_s, fit.over_budget) == (["mid", "small"], ["big"], 900, False)


def test_the_trains_page_shows_why_the_visits_cannot_keep_the_cycle() -> None:
    from django.test import Client

    from opsplanner.roles import Role
    from tests.trains_builders import make_user

    pool = four_components_fleet()
    make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=5400)
    client = Client()
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/").content.decode()

    assert f'data-budget="{BudgetCode.UPGRADE_TOO_LONG}"' in page
    assert "budget of 3600 s" in page


def test_a_multi_cycle_upgrade_that_fits_its_hosts_per_visit_is_not_said_to_overrun() -> None:
    instant_simulator()
    # Budget 7200 s / 2 domains = 3600 s, 2 hosts at once: one wave of 600 + 2400 s fits, two do not.
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, cycle_slo_s=7200, visit_overhead_s=600)
    upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=2400,
        multi_cycle=True, hosts_per_visit=2,
    )  # fmt: skip
    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert len(visit.plan["hosts"]) == 2
    assert visit.plan["estimate_s"] <= visit.plan["budget_s"] == 3600
    train.refresh_from_db()
    assert (train.budget_code, train.budget_reason) == (BudgetCode.NONE, "")
    assert not Event.objects.filter(kind="alert.train_visit_over_budget").exists()


def test_the_overrun_names_the_visits_in_a_row_its_budget_divides_the_slo_by() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=4, hosts_per_domain=2, planned_buffer_hosts=4)
    train = make_train(pool, cycle_slo_s=7200, visit_overhead_s=600, visit_concurrency=2)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="slow flash", duration_s=5400)

    train.refresh_from_db()
    assert "against a budget of 3600 s (7200 s over 2 visits in a row: 4 domains, 2 at once)" in train.budget_reason


def test_a_lower_slo_no_active_upgrade_fits_is_said_as_it_is_set_and_cleared_as_it_is_raised() -> None:
    from tests.trains_builders import make_user
    from trains.services.trains import train_update

    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool, cycle_slo_s=7200, visit_overhead_s=600)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=2400)
    assert Train.objects.get(pk=train.pk).budget_code == BudgetCode.NONE  # 3000 s fits 3600 s

    train_update(train_id=train.pk, cycle_slo_s=4000, actor=make_user())  # 2000 s a visit

    train.refresh_from_db()
    assert train.budget_code == BudgetCode.UPGRADE_TOO_LONG
    assert "against a budget of 2000 s (4000 s over 2 domains)" in train.budget_reason
    assert Event.objects.filter(kind="alert.train_visit_over_budget", subject_id=train.pk).count() == 1

    train_update(train_id=train.pk, cycle_slo_s=7200, actor=make_user())

    train.refresh_from_db()
    assert (train.budget_code, train.budget_reason) == (BudgetCode.NONE, "")
    assert Event.objects.filter(kind="train.visit_budget_fits", subject_id=train.pk).exists()
