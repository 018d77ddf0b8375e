"""Visits sized to keep the cycle: the measured correction covers the slow visits (a visit lasts as long
as its slowest host), is measured against the uncorrected cost so it settles on the truth, and a cycle
behind its deadline gives the visits still to start only the time left."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest
from django.utils import timezone

from fleet.models import Pool
from fleet.services import installed_version_set
from opsplanner import clock
from tests.builders import make_fleet
from tests.driving import drive, drive_trains, instant_simulator
from tests.test_train_budget import (
    SLO_S,
    TARGETS,
    WORK_S,
    bmc,
    create_upgrades,
    drains_per_host,
    four_components_fleet,
)
from tests.test_train_late_joiners import a_visit_draining
from tests.trains_builders import make_train, nic_firmware
from trains.models import Cycle, Pace, Train, Visit, VisitOperation, VisitState
from trains.selectors_forecast import ForecastCode, upgrades_forecasts
from trains.services.budget import (
    FACTOR_BOUNDS,
    HostTimeRatios,
    MeasuredVisit,
    Selection,
    VisitSizing,
    correction_from,
    factor_from,
    measured_correction,
    select_within_budget,
    sizing_within_cycle,
    sliding_in_flight_s,
)
from trains.services.cycles import IDLE_AFTER_EMPTY_CYCLE
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def past_visits(train: Train, pool: Pool, *, planned: list[dict], took_s: float) -> None:
    """Two finished cycles of visits over the pool's two domains, each planned as given, each `took_s` long."""
    domains = list(pool.domains.order_by("position").values_list("id", flat=True))
    start = timezone.now() - dt.timedelta(days=2)
    for number in (1, 2):
        cycle = Cycle.objects.create(
            train=train, number=number, started_at=start, ended_at=start, deadline_at=start + dt.timedelta(hours=2)
        )
        for position, domain_id in enumerate(domains, start=1):
            plan = planned[(number - 1) * len(domains) + position - 1]
            Visit.objects.create(
                train=train, cycle=cycle, domain_id=domain_id, position=position, state=VisitState.DONE,
                started_at=start, ended_at=start + dt.timedelta(seconds=took_s), plan=plan,
            )  # fmt: skip
            start += dt.timedelta(seconds=took_s)


def test_the_correction_covers_the_slow_visits_not_only_the_average_one() -> None:
    ratios = [1.0] * 8 + [1.5, 2.0]

    assert factor_from(ratios) == 1.5  # nine visits in ten stay at or under it
    assert factor_from(ratios) > sum(ratios) / len(ratios)
    assert factor_from([1.2, 1.4, 1.3]) == 1.4
    assert factor_from([1.2, 1.4]) == 1.0  # too few measured: the estimates stand
    assert factor_from([50.0] * 5) == FACTOR_BOUNDS[1]


def test_the_correction_is_measured_against_the_uncorrected_cost_so_it_settles_on_the_truth() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    # Visits planned at 1000 s before the correction, 2000 s with it, that really took 2000 s: the
    # correction is 2 (measured against the corrected cost it fell back to 1, then rose again, and
    # settled at the square root of the truth).
    past_visits(train, pool, planned=[{"cost_s": 1000, "factor": 2.0, "estimate_s": 2000}] * 4, took_s=2000)

    assert measured_correction(train).factor == pytest.approx(2.0)


def test_a_visit_after_slow_visits_is_sized_so_its_corrected_estimate_stays_under_the_budget() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    # Slow hosts made the recent visits take twice their cost (the slowest host sets a visit's length).
    past_visits(train, pool, planned=[{"cost_s": 1500, "hosts": [1]}] * 4, took_s=3000)
    create_upgrades(pool, [100, 100, 100, 100])

    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.plan["factor"] == pytest.approx(2.0)
    assert len(visit.plan["upgrades"]) == 1  # 2 x (600 + 1200) = 3600 fits; a second upgrade would not
    assert visit.plan["estimate_s"] == 3600 <= visit.plan["budget_s"]
    assert visit.plan["cost_s"] == 1800  # before the correction: what the next visits are measured against


def test_a_small_visit_is_estimated_with_the_fixed_time_a_slow_host_adds_not_only_a_ratio() -> None:
    # Recent visits took 1.5 times their cost, or 1000 s a wave beyond it (a slow host's longer drain).
    sizing = VisitSizing(
        budget_s=3600, overhead_s=600, hosts_at_once=1, factor=1.5, domains=2, largest_domain=2, extra_s=1000
    )

    assert sizing.cost_s(2, [3400]) == 2 * 4000 * 1.5  # a large visit: the ratio is the longer
    assert sizing.cost_s(2, [200]) == 2 * (800 + 1000)  # a small one: the fixed extra is
    for works in ([3400], [200], [0]):
        estimate = sizing.cost_s(2, works)
        assert sizing.uncorrected_s(2, estimate) == pytest.approx(2 * (600 + works[0]))
    unmeasured = replace(sizing, extra_s=None)
    assert unmeasured.cost_s(2, [200]) == 2 * 800 * 1.5
    assert unmeasured.uncorrected_s(2, 2400) == 1600
    # Visits of 2000 s waves that took half: faster than planned, the visits still pack more.
    faster = replace(sizing, factor=0.5, extra_s=-1000)
    assert faster.cost_s(2, [1400]) == 2 * 2000 * 0.5
    assert faster.cost_s(2, [200]) == 2 * 800 * 0.5


def test_the_correction_measures_what_a_domain_visits_wave_took_beyond_its_cost() -> None:
    start = timezone.now()

    def visit(
        pk: int, cost: float, took: float, *, waves: int | None = 1, released: int | None = None
    ) -> MeasuredVisit:
        return MeasuredVisit(pk, 1, start, start + dt.timedelta(seconds=took), cost, released, None, waves)

    # A slow host adds about 1000 s to each visit, whatever its size.
    visits = [visit(1, 4000, 5000), visit(2, 1000, 2100), visit(3, 2000, 2900, waves=None)]
    correction = correction_from(visits, {})
    assert correction.factor == pytest.approx(2.1)  # the small visit ran at the highest ratio
    assert correction.extra_s == pytest.approx(1100)
    two_waves = correction_from([visit(pk, 4000, 6000, waves=2) for pk in (1, 2, 3)], {})
    assert two_waves.extra_s == pytest.approx(1000)  # per wave
    assert correction_from(visits[:2], {}).extra_s is None  # too few measured
    # One odd visit cannot make the extra absurd: it is bounded as the ratio is.
    stuck = correction_from([visit(pk, 1000, 1_000_000) for pk in (1, 2, 3)], {})
    assert (stuck.factor, stuck.extra_s) == (FACTOR_BOUNDS[1], (FACTOR_BOUNDS[1] - 1) * 1000)
    # A sliding visit counts by its hosts' time: it sets no extra.
    sliding = [visit(pk, 4000, 9000, released=2) for pk in (1, 2, 3)]
    by_hosts = {pk: HostTimeRatios(total=1.2, slowest=2.0) for pk in (1, 2, 3)}
    factor, tail, extra = correction_from(sliding, by_hosts)
    assert (factor, tail, extra) == (1.2, pytest.approx(2.0 / 1.2), None)


def test_a_visit_after_visits_slowed_by_a_fixed_extra_takes_less_than_the_ratio_alone_would_let_it() -> None:
    pool = four_components_fleet()  # two domains of two hosts, both out at once: one wave a visit
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    # Visits planned at 2000 s that took 4000 s: twice their cost, or 2000 s more.
    past_visits(train, pool, planned=[{"cost_s": 2000, "hosts": [1], "waves": 1}] * 4, took_s=4000)
    for component, version in TARGETS:
        upgrade_create(pool=pool, component=component, version=version, reason="rollout", duration_s=600)

    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    # 600 s overhead and one 600 s upgrade take 3200 s (1200 + 2000): it fits the 3600 s budget, a
    # second would not (3800 s). With the ratio alone two would have (2 x 1800 s), and run over it.
    assert len(visit.plan["upgrades"]) == 1
    assert (visit.plan["factor"], visit.plan["extra_s"], visit.plan["waves"]) == (2.0, 2000, 1)
    assert visit.plan["estimate_s"] == 3200 <= visit.plan["budget_s"]
    assert visit.plan["cost_s"] == 1200  # before the correction: what the next visits are measured against


def test_a_train_that_sized_itself_to_a_standstill_falls_back_to_its_estimates_after_its_empty_cycles() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    # A host stuck draining: the last visits took ten times their cost. Every visit is now estimated
    # over what the cycle can give it, so visits take nothing and nothing new is measured.
    past_visits(train, pool, planned=[{"cost_s": 700, "hosts": [1], "waves": 1}] * 4, took_s=7000)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=WORK_S)
    assert measured_correction(train).factor == FACTOR_BOUNDS[1]

    train_tick(train_id=train.pk)

    empty = Cycle.objects.get(train=train, number=3)
    assert empty.ended_at is not None
    assert [v.outcome for v in empty.visits.all()] == ["nothing fits the time left in the cycle: 1 upgrades wait"] * 2
    assert not VisitOperation.objects.filter(upgrade=upgrade).exists()
    # After a cycle that took nothing the train idles a while rather than open one at every tick.
    train_tick(train_id=train.pk)
    assert not Cycle.objects.filter(train=train, number=4).exists()
    # Its next cycle no longer counts the visits of cycle 1 (MEASURED_CYCLES): too few measured, the
    # estimates stand, and the upgrade is taken.
    later = empty.ended_at + IDLE_AFTER_EMPTY_CYCLE
    with clock.use_clock(lambda: later):
        train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert (visit.cycle.number, visit.plan["factor"]) == (4, 1.0)
    assert [u["upgrade"] for u in visit.plan["upgrades"]] == [upgrade.pk]
    assert measured_correction(train, cycle=2).factor == FACTOR_BOUNDS[1]  # as the cycles were then


def test_a_cycle_behind_its_deadline_gives_the_visits_still_to_start_only_the_time_left() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    create_upgrades(pool, [100, 100, 100, 100])
    train_tick(train_id=train.pk)
    first = Visit.objects.get(train=train, state=VisitState.RUNNING)
    # The first visit ran long: only 2200 s are left before the deadline for the second.
    Cycle.objects.filter(pk=first.cycle_id).update(deadline_at=timezone.now() + dt.timedelta(seconds=2200))

    drive_trains(pool, until=lambda: Visit.objects.filter(cycle=first.cycle, started_at__isnull=False).count() == 2)

    second = Visit.objects.get(cycle=first.cycle, started_at__isnull=False, pk__gt=first.pk)
    assert first.plan["budget_s"] == 3600
    assert len(first.plan["upgrades"]) == 2
    assert 2000 < second.plan["budget_s"] <= 2200
    assert [u["upgrade"] for u in second.plan["upgrades"]] == [first.plan["upgrades"][0]["upgrade"]]  # 1800 s fits
    assert max(drains_per_host(pool).values()) == 1


def test_a_cycle_budget_never_grows_a_visit_beyond_its_share_of_the_slo() -> None:
    train = Train(cycle_slo_s=SLO_S, visit_concurrency=1)
    sizing = VisitSizing(budget_s=3600, overhead_s=600, hosts_at_once=2, factor=1.0, domains=2, largest_domain=2)

    assert sizing_within_cycle(sizing, train=train, seconds_left=7200, visits_left=1).budget_s == 3600
    assert sizing_within_cycle(sizing, train=train, seconds_left=5000, visits_left=2).budget_s == 2500
    assert sizing_within_cycle(sizing, train=train, seconds_left=-60, visits_left=2).budget_s == 0
    pair = Train(cycle_slo_s=SLO_S, visit_concurrency=2)  # two visits at once share the time left two by two
    assert sizing_within_cycle(sizing, train=pair, seconds_left=5000, visits_left=4).budget_s == 2500
    # Three visits two at a time run as two in a row; the last, beside a free lane, has only the time left.
    assert sizing_within_cycle(sizing, train=pair, seconds_left=5000, visits_left=3).budget_s == 2500
    assert sizing_within_cycle(sizing, train=pair, seconds_left=2400, visits_left=1).budget_s == 2400


def test_visits_that_do_not_divide_among_the_lanes_keep_a_cycle_at_its_lower_bound() -> None:
    # Three domains, two at a time: two visits in a row, so each has half the SLO (the lower bound
    # is two visit estimates); a share of SLO x 2 / 3 made the cycle 9600 s against 7200 s.
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2, planned_buffer_hosts=4)
    for host in hosts:
        installed_version_set(host=host, version=nic_firmware()["22.1"])
        installed_version_set(host=host, version=bmc()["1.0"])
    start = timezone.now()
    now = [start]
    with clock.use_clock(lambda: now[0]):
        train = make_train(pool, cycle_slo_s=SLO_S, visit_estimate_s=3600, visit_overhead_s=600, visit_concurrency=2)
        for component, version in TARGETS:
            upgrade_create(pool=pool, component=component, version=version, reason="rollout", duration_s=1400)
        train_tick(train_id=train.pk)
        cycle = Cycle.objects.get(train=train, number=1)
        first = list(Visit.objects.filter(cycle=cycle, state=VisitState.RUNNING))
        drive(pool)
        # The first two visits took what they were given; the third starts with what is left.
        now[0] = start + dt.timedelta(seconds=max(v.plan["estimate_s"] for v in first))
        train_tick(train_id=train.pk)
        last = Visit.objects.get(cycle=cycle, state=VisitState.RUNNING)

    assert len(first) == 2
    assert {v.plan["budget_s"] for v in first} == {SLO_S // 2}
    assert all(v.plan["estimate_s"] <= SLO_S // 2 for v in first)
    assert last.started_at is not None
    assert last.plan["estimate_s"] <= (cycle.deadline_at - last.started_at).total_seconds()


def test_a_late_upgrade_joins_a_visit_only_within_the_budget_the_visit_was_given() -> None:
    # 600 s overhead + 1200 s of bios: a late 1200 s upgrade fits the SLO's share (3600 s) ...
    pool, _, train, visit = a_visit_draining(cycle_slo_s=SLO_S, visit_overhead_s=600)
    # ... but not the 2000 s this visit was given by a cycle behind its deadline.
    Visit.objects.filter(pk=visit.pk).update(plan={**visit.plan, "budget_s": 2000})

    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="fix", duration_s=1200)
    train_tick(train_id=train.pk)

    assert not VisitOperation.objects.filter(visit=visit, upgrade=late).exists()
    visit.refresh_from_db()
    assert visit.plan["late_seen"] == [late.pk]


Steps = list[tuple[str, set[int], int]]  # (name, hosts, work s)


def select_narrowed(steps: Steps, sizing: VisitSizing) -> Selection:
    """select_within_budget as the train tick calls it: a step may be narrowed to the hosts where it fits."""
    return select_within_budget(
        steps, sizing=sizing, hosts_of=lambda s: s[1], work_of=lambda s: s[2], restrict=lambda s, h: (s[0], h, s[2])
    )


def test_a_long_upgrade_retried_on_one_host_does_not_keep_the_other_hosts_from_their_upgrades() -> None:
    sizing = VisitSizing(budget_s=3000, overhead_s=600, hosts_at_once=40, factor=1.0, domains=1, largest_domain=40)
    # The oldest upgrade is long and left on one host (its first try failed there); the newer ones
    # are pending on all four hosts, that host included.
    steps = [("retry", {1}, 2000), ("bios", {1, 2, 3, 4}, 500), ("bmc", {1, 2, 3, 4}, 500)]

    selection = select_narrowed(steps, sizing)

    assert selection.taken == [("retry", {1}, 2000), ("bios", {2, 3, 4}, 500), ("bmc", {2, 3, 4}, 500)]
    assert selection.left == [("bios", {1}, 500), ("bmc", {1}, 500)]  # host 1 takes them next cycle
    assert selection.cost_s == 2600  # its busiest host: 600 s overhead + the 2000 s retry
    assert not selection.over_budget
    without = select_within_budget(steps, sizing=sizing, hosts_of=lambda s: s[1], work_of=lambda s: s[2])
    assert [s[0] for s in without.taken] == ["retry"]  # not narrowed: the whole domain waited a cycle


def test_beside_a_first_upgrade_that_overruns_the_budget_a_visit_takes_what_does_not_make_it_longer() -> None:
    sizing = VisitSizing(budget_s=3000, overhead_s=600, hosts_at_once=40, factor=1.0, domains=1, largest_domain=40)
    # The oldest upgrade, long, is left on hosts 1 and 2 and stretches the visit to 4600 s; hosts 3
    # and 4 are idle that long and have 4000 s for other work.
    steps = [("kernel", {1, 2}, 4000), ("bios", {1, 2, 3, 4}, 500), ("bmc", {3, 4}, 500), ("os", {3, 4}, 4000)]

    selection = select_narrowed(steps, sizing)

    assert selection.taken == [("kernel", {1, 2}, 4000), ("bios", {3, 4}, 500), ("bmc", {3, 4}, 500)]
    assert selection.left == [("bios", {1, 2}, 500), ("os", {3, 4}, 4000)]  # either would make it longer
    assert (selection.cost_s, selection.over_budget) == (4600, True)


def test_beside_a_first_upgrade_that_overruns_the_budget_a_sliding_visits_other_hosts_take_what_fits_their_budget() -> (
    None
):
    sizing = VisitSizing(
        budget_s=3000,
        overhead_s=600,
        hosts_at_once=40,
        factor=1.0,
        domains=1,
        largest_domain=40,
        waits_for_busiest=False,
    )
    # The kernel keeps hosts 1 and 2 out 4600 s. A sliding visit's other hosts return as each
    # finishes, so each may take up to the budget of its own work, and no more: not the 4600 s the
    # kernel hosts are out (that would keep them from making room for the next domain's).
    steps = [("kernel", {1, 2}, 4000), ("bios", {1, 2, 3, 4}, 500), ("bmc", {3, 4}, 500), ("os", {3, 4}, 4000)]

    narrowed = select_narrowed(steps, sizing)
    whole = select_within_budget(steps, sizing=sizing, hosts_of=lambda s: s[1], work_of=lambda s: s[2])

    assert narrowed.taken == [("kernel", {1, 2}, 4000), ("bios", {3, 4}, 500), ("bmc", {3, 4}, 500)]
    assert narrowed.left == [("bios", {1, 2}, 500), ("os", {3, 4}, 4000)]
    assert (narrowed.cost_s, narrowed.over_budget) == (4600, True)  # the visit's longest host, as before
    # Unnarrowed (the forecast): bmc fits each of its hosts and is taken whole; bios is not.
    assert [s[0] for s in whole.taken] == ["kernel", "bmc"]


def test_an_upgrade_too_long_for_its_visit_runs_only_where_the_rest_of_the_cycle_can_give_the_time() -> None:
    train = Train(cycle_slo_s=SLO_S, visit_concurrency=1)
    sizing = VisitSizing(budget_s=3600, overhead_s=600, hosts_at_once=2, factor=1.0, domains=2, largest_domain=2)
    steps = [("long", {1, 2}, 5000), ("short", {1, 2}, 600)]

    def taken(seconds_left: float, visits_left: int) -> list[str]:
        share = sizing_within_cycle(sizing, train=train, seconds_left=seconds_left, visits_left=visits_left)
        return [
            s[0]
            for s in select_within_budget(steps, sizing=share, hosts_of=lambda s: s[1], work_of=lambda s: s[2]).taken
        ]

    # 7200 s left for two visits: this one may take 6600 s (the other down to its 600 s overhead).
    assert sizing_within_cycle(sizing, train=train, seconds_left=7200, visits_left=2).stretch_s == 6600
    assert taken(7200, 2) == ["long"]  # 5600 s: over its 3600 s share, within what the cycle gives
    # 5000 s left: the long one (5600 s) would break the cycle; the visit takes what fits its budget.
    assert taken(5000, 2) == ["short"]
    assert taken(5000, 1) == ["short"]
    # Past the deadline (a cycle already missed) and for an emergency train: the first is always taken.
    assert sizing_within_cycle(sizing, train=train, seconds_left=-60, visits_left=2).stretch_s is None
    assert taken(-60, 2) == ["long"]
    urgent = Train(cycle_slo_s=SLO_S, visit_concurrency=1, emergency=True)
    assert sizing_within_cycle(sizing, train=urgent, seconds_left=5000, visits_left=2).stretch_s is None


def test_the_time_a_sliding_trains_hosts_still_out_may_take_is_not_given_to_the_visits_still_to_start() -> None:
    train = Train(cycle_slo_s=SLO_S, visit_concurrency=1, pace=Pace.SLIDING)
    sizing = VisitSizing(budget_s=3600, overhead_s=600, hosts_at_once=2, factor=1.0, domains=2, largest_domain=2)
    # Two running visits: one host of the first takes 3000 s (two waves of 6000 s), of the second 2500 s.
    running = [{"hosts": [1, 2, 3], "estimate_s": 6000}, {"hosts": [4, 5], "estimate_s": 2500}, {"hosts": []}]
    assert sliding_in_flight_s(sizing, running) == 3000
    assert sliding_in_flight_s(sizing, []) == 0

    # 7200 s left, 3000 s of them for the hosts still out: 2100 s for each of the last two visits,
    # and an upgrade too long for that may take 3600 s (the other visit down to its overhead).
    share = sizing_within_cycle(sizing, train=train, seconds_left=7200, visits_left=2, in_flight_s=3000)
    assert (share.budget_s, share.stretch_s) == (2100, 3600)
    # Hosts out longer than the time left: nothing more fits, where the deadline has not passed yet.
    none_left = sizing_within_cycle(sizing, train=train, seconds_left=2000, visits_left=1, in_flight_s=3000)
    assert (none_left.budget_s, none_left.stretch_s) == (0, 0)


def test_a_sliding_trains_last_visit_and_its_hosts_still_out_are_sized_for_its_slowest_hosts() -> None:
    train = Train(cycle_slo_s=SLO_S, visit_concurrency=1, pace=Pace.SLIDING)
    # Its slowest hosts took 1.5 times their corrected estimate.
    sizing = VisitSizing(
        budget_s=3600, overhead_s=600, hosts_at_once=2, factor=1.0, domains=2, largest_domain=2, tail=1.5
    )
    assert sliding_in_flight_s(sizing, [{"hosts": [1, 2], "estimate_s": 2000}]) == 3000

    # 4500 s left after the hosts still out: the last visit's slowest host must be back by then,
    # and an upgrade too long for its share may not take more either.
    last = sizing_within_cycle(sizing, train=train, seconds_left=7500, visits_left=1, in_flight_s=3000)
    assert (last.budget_s, last.stretch_s) == (3000, 3000)
    # Before the last visit, the hosts flow: each visit gets its share of the time left.
    assert sizing_within_cycle(sizing, train=train, seconds_left=7500, visits_left=2, in_flight_s=3000).budget_s == (
        2250
    )
    # A domain-paced train's visit is measured by its span, its slowest host included: no tail.
    domain = Train(cycle_slo_s=SLO_S, visit_concurrency=1)
    assert sizing_within_cycle(sizing, train=domain, seconds_left=6000, visits_left=1).budget_s == 3600


def test_a_train_keeps_its_cycle_and_leaves_an_upgrade_no_visit_can_fit_for_a_cycle_with_the_time() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    # 600 s + 7000 s per visit: more than the whole cycle (7200 s) can give any visit of it.
    long = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="slow", duration_s=7000)
    short = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="quick", duration_s=WORK_S)

    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert [u["upgrade"] for u in visit.plan["upgrades"]] == [short.pk]
    assert visit.plan["left"] == [{"upgrade": long.pk, "hosts": 2}]
    assert not VisitOperation.objects.filter(upgrade=long).exists()
    # The forecast plays the visits forward by the same rule: no cycle of this train has the time.
    forecasts = upgrades_forecasts([long, short])
    assert forecasts[long.pk].code == ForecastCode.BEYOND_HORIZON
    assert forecasts[short.pk].code == ForecastCode.SCHEDULED
