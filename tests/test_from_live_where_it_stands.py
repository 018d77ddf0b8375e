"""What-if on the live fleet goes on from where the live pool stands: a train in the middle of a cycle
goes on from there (before, the lane opened a cycle of its own at the first stop: it visited again
the domains just visited live, left the others for last, and judged a new cycle's deadline instead
of the live one), and a percentage phase covers the hosts it covers live. The lanes run in this
process, on the test database (tests/from_live_helpers.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet.models import Pool
from opsplanner import clock
from simulation.from_live import live_snapshot
from tests.builders import make_fleet
from tests.from_live_helpers import forecast, policy
from trains.models import Cycle, Train, Visit, VisitState

pytestmark = pytest.mark.django_db

LIVE_CYCLE = 4


def mid_cycle_pool() -> Pool:
    """3 racks of 2 hosts, a train (24 h SLO) in its cycle 4, opened 10 h ago, with racks 1 and 2
    visited, and a pending upgrade of bios to 2.16.0 on every host (it arrived after those visits)."""
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=3, hosts_per_domain=2, failure_buffer_hosts=1, pool_name="live-c")
    train = train_create(pool=pool, name="train-live-c", cycle_slo_s=24 * 3600, visit_estimate_s=3600, actor="test")
    now = clock.now().replace(microsecond=0)
    started, deadline = now - dt.timedelta(hours=10), now + dt.timedelta(hours=14)
    cycle = Cycle.objects.create(train=train, number=LIVE_CYCLE, started_at=started, deadline_at=deadline)
    for stop in train.stops.order_by("position"):
        visited = stop.position < 2
        Visit.objects.create(
            train=train, cycle=cycle, domain_id=stop.domain_id, position=stop.position,
            state=VisitState.DONE if visited else VisitState.PLANNED,
            started_at=now - dt.timedelta(hours=9 - 2 * stop.position) if visited else None,
            ended_at=now - dt.timedelta(hours=8 - 2 * stop.position) if visited else None,
        )  # fmt: skip
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test")
    return pool


def test_it_snapshots_where_the_live_train_stands_in_its_open_cycle() -> None:
    pool = mid_cycle_pool()

    (train,) = live_snapshot(pool.name, clock.now())[0]["trains"]

    cycle = train["open_cycle"]
    assert cycle["number"] == LIVE_CYCLE
    assert [v["domain"] for v in cycle["visited"]] == ["rack-0001", "rack-0002"]


def test_the_forecast_visits_the_domains_the_live_cycle_has_not_reached_first(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = mid_cycle_pool()
    live_deadline = Cycle.objects.get().deadline_at

    result = forecast(monkeypatch, pool)

    start = dt.datetime.fromisoformat(result["start_at"])
    played = list(
        Visit.objects.filter(started_at__gte=start, plan__cost_s__gt=0)
        .order_by("started_at", "id")
        .values_list("cycle__number", "domain__name")
    )
    # The live cycle ends with rack 3; the next one comes back to racks 1 and 2.
    assert played == [(LIVE_CYCLE, "rack-0003"), (LIVE_CYCLE + 1, "rack-0001"), (LIVE_CYCLE + 1, "rack-0002")]
    copied = Cycle.objects.get(number=LIVE_CYCLE, train=Train.objects.get())
    assert copied.deadline_at == live_deadline
    assert copied.ended_at is not None
    assert copied.ended_at <= live_deadline
    (upgrade,) = policy(result, "trains")["upgrades"]
    assert upgrade["reach_24h"] == 1.0


def test_the_forecast_says_it_goes_on_from_the_live_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    result = forecast(monkeypatch, mid_cycle_pool())

    (note,) = policy(result, "trains")["notes"]
    assert note.startswith(f"train train-live-c is in cycle {LIVE_CYCLE} on the live fleet, 2 domains visited: ")


def test_a_train_with_no_cycle_open_live_starts_its_first_in_the_forecast(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = mid_cycle_pool()
    Cycle.objects.all().delete()

    result = forecast(monkeypatch, pool)

    assert min(Cycle.objects.values_list("number", flat=True)) == 1
    assert policy(result, "trains")["notes"] == []


def test_the_sliding_pace_also_goes_on_from_the_live_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    result = forecast(monkeypatch, mid_cycle_pool(), "trains-sliding")

    start = dt.datetime.fromisoformat(result["start_at"])
    first = Visit.objects.filter(started_at__gte=start).order_by("started_at", "id").first()
    assert first is not None
    assert (first.cycle.number, first.domain.name) == (LIVE_CYCLE, "rack-0003")
    (upgrade,) = policy(result, "trains-sliding")["upgrades"]
    assert upgrade["reach_24h"] == 1.0


def test_a_percentage_phase_covers_the_same_hosts_in_the_forecast_as_live(monkeypatch: pytest.MonkeyPatch) -> None:
    # A percentage phase takes the first hosts of its scope by id. The lane created the hosts rack by
    # rack, so where live ids interleave racks it played the phase on other hosts than live.
    from fleet.models import Host, InstalledVersion
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, failure_buffer_hosts=1, pool_name="live-q")
    rack_1, rack_2 = hosts[0].domain_id, hosts[2].domain_id
    Host.objects.filter(pk=hosts[1].pk).update(domain_id=rack_2)  # live ids now alternate racks
    Host.objects.filter(pk=hosts[2].pk).update(domain_id=rack_1)
    train_create(pool=pool, name="train-live-q", cycle_slo_s=24 * 3600, visit_estimate_s=3600, actor="test")
    upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="firmware fix", actor="test",
        phases=[{"name": "half", "percent": 50, "min_successes": 2, "soak_s": 3 * 86_400},
                {"name": "rest", "percent": 100, "min_successes": 0}],
    )  # fmt: skip
    first_half = {hosts[0].hostname, hosts[1].hostname}  # the first 50% by live id

    forecast(monkeypatch, pool)

    reached = set(
        InstalledVersion.objects.filter(component__name="bios", version__version="2.16.0").values_list(
            "host__hostname", flat=True
        )
    )
    assert reached == first_half  # the rest waits for the soak, past the forecast's day
