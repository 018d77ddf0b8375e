"""The sliding pace: hosts return as each finishes and hosts of the next domain start, never more
than a visit's worth out (the domain size x visit_concurrency, or the planned buffer if smaller)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet.models import PLANNED_OUT_STATES, Host, Pool
from opsplanner import clock
from opsplanner.models import Event, HostTask, WorkItem, WorkKind, WorkState
from opsplanner.roles import Role
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from simulation.config import SimulationConfig
from simulation.engine import policy_run
from simulation.measure import run_measure
from simulation.world import workload_draw
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.driving import in_threads, instant_simulator
from tests.test_web_trains_forms import train_form
from tests.trains_builders import make_train, make_user
from trains.models import Cycle, Pace, Train, TrainState, Upgrade, UpgradeState, Visit, VisitOperation, VisitState
from trains.selectors import train_forecast
from trains.services.budget import measured_correction, sliding_visit_ratios
from trains.services.pace import ActiveUpgrade, sliding_allowance, train_hosts_out, visit_release
from trains.services.tick import train_tick
from trains.services.trains import train_pause, train_resume, train_update
from trains.services.upgrades import upgrade_create, upgrades_phases

pytestmark = pytest.mark.django_db

STEP = dt.timedelta(seconds=60)
SLOW_FACTOR = 12  # a slow host's work takes twelve ticks, a fast one's one


@dataclass
class Run:
    """What a driven train did, tick by tick."""

    out: list[int] = field(default_factory=list)  # hosts of the pool out for planned work
    train_out: list[int] = field(default_factory=list)  # hosts the train has out or released
    first_out: dict[int, int] = field(default_factory=dict)  # host -> first tick it was out
    back: dict[int, int] = field(default_factory=dict)  # host -> tick it was back in service after being out


def slow_down(hosts: set[int], slowed: set[int]) -> None:
    """The slow hosts' executions take SLOW_FACTOR times as long (each item slowed once)."""
    extra = STEP * (SLOW_FACTOR - 1)
    items = WorkItem.objects.filter(host_id__in=hosts, kind=WorkKind.EXECUTE, state=WorkState.RUNNING).exclude(
        pk__in=slowed
    )
    ids = set(items.values_list("id", flat=True))
    WorkItem.objects.filter(pk__in=ids).update(
        due_at=F("due_at") + extra, lease_expires_at=F("lease_expires_at") + extra, deadline_at=F("deadline_at") + extra
    )
    slowed |= ids


def drive(pool: Pool, train: Train, *, slow: set[int] = frozenset(), max_ticks: int = 200) -> Run:
    """Train tick, pool tick, simulated work, one virtual minute apart, until the train's upgrades
    are done; what was out is recorded after every tick."""
    instant_simulator(execute_seconds=60.0)
    run = Run()
    slowed: set[int] = set()
    moment = [clock.now()]
    with clock.use_clock(lambda: moment[0]):
        for tick in range(max_ticks):
            moment[0] += STEP
            train_tick(train_id=train.pk)
            pool_tick(pool_id=pool.pk, kick=False)
            simulated_work_step()
            slow_down(set(slow), slowed)
            states = dict(Host.objects.filter(pool=pool).values_list("id", "state"))
            out = {h for h, state in states.items() if state in PLANNED_OUT_STATES}
            run.out.append(len(out))
            run.train_out.append(train_hosts_out(train))
            for host in out:
                run.first_out.setdefault(host, tick)
            for host in run.first_out.keys() - out:
                run.back.setdefault(host, tick)
            if not Upgrade.objects.filter(pool=pool, state=UpgradeState.ACTIVE).exists():
                return run
    stuck = list(
        HostTask.objects.filter(pool_id=pool.pk).values_list("host_id", "state", "failure_code", "failure_reason")
    )
    visits = list(Visit.objects.filter(train=train).values_list("domain__name", "state", "plan"))
    raise AssertionError(f"the upgrades were not done in {max_ticks} ticks: {run.out}; {stuck}; {visits}")


def sliding_fleet(**train_fields: object) -> tuple[Pool, list[Host], Train]:
    pool, hosts = make_fleet(domains=3, hosts_per_domain=4)  # planned buffer: one domain, 4 hosts
    train = make_train(pool, pace=Pace.SLIDING, **train_fields)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    return pool, hosts, train


def domain_of(hosts: list[Host], index: int) -> set[int]:
    return {h.pk for h in hosts if h.domain.name == f"rack-{index:04d}"}


def test_a_sliding_train_never_has_more_hosts_out_than_a_visits_worth_at_any_tick() -> None:
    pool, hosts, train = sliding_fleet()
    slow = {min(domain_of(hosts, 1)), min(domain_of(hosts, 2))}
    allowed = sliding_allowance(train)
    assert allowed == 4

    run = drive(pool, train, slow=slow)

    assert max(run.out) <= allowed, run.out
    assert max(run.train_out) <= allowed, run.train_out
    assert max(run.out) == allowed  # it used what it was allowed
    assert set(run.first_out) == {h.pk for h in hosts}


def test_a_slow_host_does_not_hold_back_the_next_domains_hosts() -> None:
    pool, hosts, train = sliding_fleet()
    slow = min(domain_of(hosts, 1))

    run = drive(pool, train, slow={slow})

    next_domain_started = min(run.first_out[h] for h in domain_of(hosts, 2))
    assert next_domain_started < run.back[slow]
    # While the slow host was out, hosts of the next domains used the room the fast ones left.
    assert max(run.out[run.first_out[slow] : run.back[slow]]) == 4
    # More than one operation per upgrade for a visit: its hosts were released as room came.
    visit = Visit.objects.get(train=train, domain__name="rack-0002")
    assert VisitOperation.objects.filter(visit=visit).count() > 1


def test_a_domain_paced_train_waits_for_its_slowest_host_as_before() -> None:
    pool, hosts = make_fleet(domains=3, hosts_per_domain=4)
    train = make_train(pool)
    assert train.pace == Pace.DOMAIN
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    slow = min(domain_of(hosts, 1))

    run = drive(pool, train, slow={slow})

    assert min(run.first_out[h] for h in domain_of(hosts, 2)) > run.back[slow]
    assert max(run.out) <= 4
    # One operation per upgrade and visit, every host of the visit at once.
    for visit in Visit.objects.filter(train=train):
        assert VisitOperation.objects.filter(visit=visit).count() == 1
        assert "unreleased" not in visit.plan


def test_every_domain_is_visited_once_per_cycle_by_a_sliding_train_with_one_drain_per_host() -> None:
    pool, hosts, train = sliding_fleet()

    drive(pool, train, slow={min(domain_of(hosts, 2))})
    train_tick(train_id=train.pk)  # the last visit ends, then the cycle

    cycle = Cycle.objects.get(train=train)
    visits = list(Visit.objects.filter(cycle=cycle).values_list("domain__name", "state"))
    assert sorted(visits) == [(f"rack-{i:04d}", VisitState.DONE) for i in (1, 2, 3)]
    assert cycle.ended_at is not None
    drains = Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))
    assert drains == {h.pk: 1 for h in hosts}
    for visit in Visit.objects.filter(cycle=cycle):
        assert visit.plan["unreleased"] == []
        assert visit.plan["released"] == 4


def test_a_sliding_train_measures_its_visits_by_their_hosts_time_not_by_their_overlapping_spans() -> None:
    # Each host plans 240 s: the overhead 120 s and the upgrade's default work 120 s.
    pool, hosts, train = sliding_fleet(visit_estimate_s=240, visit_overhead_s=120)
    run = drive(pool, train, slow={min(domain_of(hosts, 1))})
    train_tick(train_id=train.pk)
    done = Visit.objects.filter(train=train, state=VisitState.DONE)
    assert done.count() == 3

    # Each domain's hosts' time out, from the host states seen tick by tick (a virtual minute each),
    # against their planned time; of three visits the correction covers the highest.
    ratios = [
        sum((run.back[h] - run.first_out[h]) * STEP.total_seconds() for h in domain_of(hosts, index)) / (4 * 240)
        for index in (1, 2, 3)
    ]
    assert ratios[0] > max(ratios[1:])  # the slow host's domain
    assert measured_correction(train).factor == pytest.approx(ratios[0])
    # The tail: the slowest host (the slow one) against its own plan, over the correction.
    slow = min(domain_of(hosts, 1))
    slowest = (run.back[slow] - run.first_out[slow]) * STEP.total_seconds() / 240
    assert measured_correction(train).tail == pytest.approx(slowest / ratios[0])
    assert measured_correction(train).tail > 1.5
    # The forecast counts what each visit added after the one before it ended, not their overlap.
    forecast = train_forecast(train)
    spans = [(v.ended_at - v.started_at).total_seconds() for v in done]
    assert forecast.factor == pytest.approx(ratios[0])
    assert forecast.visit_seconds < sum(spans) / len(spans)


def test_a_sliding_visit_keeps_its_hosts_time_as_it_ends_and_the_correction_reads_it_without_measuring_again(
    django_assert_num_queries,
) -> None:
    pool, hosts, train = sliding_fleet(visit_estimate_s=240, visit_overhead_s=120)
    drive(pool, train, slow={min(domain_of(hosts, 1))})
    train_tick(train_id=train.pk)
    done = list(Visit.objects.filter(train=train, state=VisitState.DONE))
    assert len(done) == 3
    measured = sliding_visit_ratios({visit.pk: 120 for visit in done})
    assert {visit.pk: tuple(visit.plan["host_time"]) for visit in done} == {pk: tuple(r) for pk, r in measured.items()}

    cycle = done[0].cycle.number
    with django_assert_num_queries(1):  # the recent visits, with what they kept; no task is read
        correction = measured_correction(train, cycle=cycle)
    assert correction.factor == pytest.approx(max(r.total for r in measured.values()))
    kept = done[0]
    Visit.objects.filter(pk=kept.pk).update(plan={**kept.plan, "host_time": [5.0, 5.0]})
    assert measured_correction(train).factor == pytest.approx(5.0)  # what the visit kept is what counts
    assert train_forecast(train).factor == pytest.approx(5.0)


def test_a_sliding_visit_leaves_for_the_next_cycle_what_the_time_left_after_the_hosts_still_out_cannot_cover() -> None:
    # Three domains of four hosts, a 3000 s cycle: 1000 s a visit; each host plans 120 s of overhead
    # and 600 s of bios, 720 s.
    pool, hosts, train = sliding_fleet(cycle_slo_s=3000, visit_overhead_s=120)
    Upgrade.objects.filter(pool=pool).update(duration_s=600)
    instant_simulator(execute_seconds=60.0)
    slow, slowed = set(sorted(domain_of(hosts, 1))[1:]), set()  # three of the first visit's hosts
    moment = [clock.now()]
    with clock.use_clock(lambda: moment[0]):
        train_tick(train_id=train.pk)  # the first visit releases its four hosts, 720 s each
        first = Visit.objects.get(train=train, state=VisitState.RUNNING)
        assert first.plan["estimate_s"] == 720
        # The cycle fell behind: 1500 s left. The next visit starts when the first host comes back,
        # with over 1200 s left: 600 s each for the last two visits, or over 1080 s for bios alone
        # (the other visit down to its overhead) if the time left were theirs. It is not: the three
        # slow hosts still out may take 720 s, which leaves under 300 s each, or 480 s for bios alone.
        Cycle.objects.filter(train=train).update(deadline_at=moment[0] + dt.timedelta(seconds=1500))
        for _ in range(20):
            moment[0] += STEP
            pool_tick(pool_id=pool.pk, kick=False)
            simulated_work_step()
            slow_down(slow, slowed)
            train_tick(train_id=train.pk)
            if not Visit.objects.filter(train=train, state=VisitState.PLANNED, position=first.position + 1).exists():
                break
    second = Visit.objects.get(train=train, position=first.position + 1)
    assert second.state == VisitState.DONE
    assert second.outcome.startswith("nothing fits the time left in the cycle")
    assert second.plan["budget_s"] < 300
    assert not VisitOperation.objects.filter(visit=second).exists()
    assert train_hosts_out(train) == 3  # the slow hosts of the first visit, still out


def test_the_allowance_is_a_visits_worth_or_the_planned_buffer_whichever_is_smaller() -> None:
    pool, _ = make_fleet(domains=3, hosts_per_domain=4, planned_buffer_hosts=10)
    train = make_train(pool, pace=Pace.SLIDING, visit_concurrency=2)
    assert sliding_allowance(train) == 8  # two domains of four
    small, _ = make_fleet(domains=3, hosts_per_domain=4, planned_buffer_hosts=3)
    assert sliding_allowance(make_train(small, pace=Pace.SLIDING)) == 3  # the buffer


def test_a_sliding_train_within_a_smaller_planned_buffer_stays_inside_it() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=3)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")

    run = drive(pool, train, slow={min(domain_of(hosts, 1))})

    assert max(run.out) <= 3
    assert max(run.train_out) <= 3


def test_a_paused_sliding_train_releases_no_more_hosts_until_it_resumes() -> None:
    pool, hosts, train = sliding_fleet()
    train_tick(train_id=train.pk)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.plan["released"] == 4
    assert visit.plan["unreleased"] == []
    train_pause(train_id=train.pk, reason="change freeze", actor=None)

    instant_simulator()
    for _ in range(6):
        train_tick(train_id=train.pk)
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()

    assert Visit.objects.filter(train=train).exclude(state=VisitState.PLANNED).count() == 1
    assert not Host.objects.filter(pool=pool, state__in=PLANNED_OUT_STATES).exists()  # its operations are held
    train_resume(train_id=train.pk, reason="freeze over", actor=None)
    run = drive(pool, train)
    assert Train.objects.get(pk=train.pk).state == TrainState.RUNNING
    assert max(run.out) <= 4
    assert set(run.first_out) == {h.pk for h in hosts}


def test_an_upgrade_created_mid_visit_joins_the_hosts_a_sliding_visit_has_not_released_yet() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.plan["released"] == 2
    assert len(visit.plan["unreleased"][0]["hosts"]) == 2

    late = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="driver fix")
    train_tick(train_id=train.pk)

    visit.refresh_from_db()
    joined = [e for e in visit.plan["unreleased"] if e["upgrade"] == late.pk]
    assert joined
    assert set(joined[0]["hosts"]) == set(visit.plan["unreleased"][0]["hosts"])
    run = drive(pool, train)
    assert max(run.out) <= 2
    drains = Counter(HostTask.objects.filter(pool_id=pool.pk, drain_key=F("id")).values_list("host_id", flat=True))
    assert drains == {h.pk: 1 for h in hosts}  # both upgrades, one drain per host


def test_a_train_switched_from_sliding_to_domain_hands_over_the_rest_of_its_visit_at_once() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)

    train_update(train_id=train.pk, pace=Pace.DOMAIN, actor=None)
    train_tick(train_id=train.pk)

    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.plan["unreleased"] == []
    assert visit.plan["released"] == 4


def test_a_train_refuses_an_unknown_pace() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    with pytest.raises(ValidationError, match="pace"):
        make_train(pool, pace="galloping")


def test_an_operator_creates_a_sliding_train_through_the_form_and_changes_its_pace_back() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    client = Client()
    client.force_login(make_user(Role.OPERATOR))

    response = client.post("/trains/new/", train_form(pool.name, pace="sliding"))

    train = Train.objects.get(pool=pool)
    assert response.status_code == 302
    assert train.pace == Pace.SLIDING
    page = client.get("/trains/").content.decode()
    assert 'data-pace="sliding"' in page
    edit = {"cycle_slo_s": str(train.cycle_slo_s), "visit_concurrency": "1", "domain_order": "rack-0001\nrack-0002"}
    response = client.post(f"/trains/{train.pk}/edit/", {**edit, "pace": "domain"})
    train.refresh_from_db()
    assert train.pace == Pace.DOMAIN
    event = Event.objects.get(kind="train.updated", subject_id=train.pk)
    assert event.data["after"] == {"pace": "domain"}


def test_the_api_creates_a_sliding_train_shows_its_pace_and_refuses_an_unknown_one() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    client = role_client()

    refused = client.post("/api/trains/", {"pool": pool.pk, "name": "t1", "cycle_slo_s": 86400, "pace": "fast"})
    created = client.post(
        "/api/trains/", {"pool": pool.pk, "name": "t1", "cycle_slo_s": 86400, "pace": "sliding"}, format="json"
    )

    assert refused.status_code == 400
    assert "pace" in refused.content.decode()
    assert created.status_code == 201, created.content
    assert created.json()["pace"] == "sliding"
    assert client.get(f"/api/trains/{created.json()['id']}/").json()["pace"] == "sliding"


def test_the_simulator_runs_the_sliding_pace_as_a_policy_beside_the_domain_pace() -> None:

    config = SimulationConfig(
        hosts=80,
        pools=1,
        hosts_per_domain=10,
        days=3,
        upgrades_per_week=0,
        upgrades_at_start=2,
        host_failures_per_day=0,
        upgrade_failure_rate=0,
        verify_failure_rate=0,
        optout_windows_per_week=0,
        cycle_slo_hours=48,
        policies=("trains", "trains-sliding"),
    )
    sliding = run_measure(config, policy_run(config, workload_draw(config), "trains-sliding"))

    assert sliding["violations"] == []
    assert Train.objects.get().pace == Pace.SLIDING
    assert sum(pool["drains"] for pool in sliding["pools"]) == 80  # one drain per host, as the domain pace
    rollouts = [r for pool in sliding["pools"] for r in pool["rollouts"]]
    assert len(rollouts) == 2
    assert all(r[3] is not None for r in rollouts), rollouts


@pytest.mark.django_db(transaction=True)
def test_two_train_ticks_at_once_release_no_more_than_the_room_the_returned_hosts_left() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, pace=Pace.SLIDING)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)
    instant_simulator()
    for _ in range(6):  # the first two hosts go out and come back
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
    assert train_hosts_out(train) == 0

    errors = in_threads(lambda: train_tick(train_id=train.pk), lambda: train_tick(train_id=train.pk))

    assert errors == []
    assert train_hosts_out(train) == 2
    visit = Visit.objects.get(train=train, domain__name="rack-0001")
    assert visit.plan["released"] == 4


def _release_queries(upgrades: list[tuple[str, str]]) -> int:
    """Queries of releasing two hosts of a sliding visit that takes `upgrades` on every host."""
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, planned_buffer_hosts=2)
    train = make_train(pool, pace=Pace.SLIDING)
    for component, version in upgrades:
        upgrade_create(pool=pool, component=component, version=version, reason="rollout")
    train_tick(train_id=train.pk)  # the visit starts and releases its first two hosts
    visit = Visit.objects.select_related("domain").get(train=train, state=VisitState.RUNNING)
    rows = list(Upgrade.objects.filter(pool=pool).select_related("component_version__component"))
    phases = upgrades_phases(rows)
    active = {u.pk: ActiveUpgrade(upgrade=u, phases=phases[u.pk]) for u in rows}
    with CaptureQueriesContext(connection) as captured:
        assert visit_release(train=train, visit=visit, active=active, limit=2) == 2
    taken = VisitOperation.objects.filter(visit=visit).values_list("operation__tasks__host_id", "upgrade_id")
    assert len(set(taken)) == 4 * len(upgrades)  # each of the four hosts takes every upgrade
    return len(captured.captured_queries)


def test_a_sliding_release_submits_every_upgrade_its_hosts_take_together_in_queries_that_do_not_grow_with_them() -> (
    None
):
    one = _release_queries([("bios", "2.16.0")])
    two = _release_queries([("bios", "2.16.0"), ("gpu-driver", "560.35.03")])
    assert one == two
