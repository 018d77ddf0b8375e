"""The home page lists the fleet; health endpoints say whether the web and the workers are alive."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from fleet import services
from fleet.models import HostState
from opsplanner.models import WorkerHeartbeat
from opsplanner.roles import Role
from tests.builders import make_domain, make_host, make_pool

pytestmark = pytest.mark.django_db


def test_the_home_page_asks_for_a_login(client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/"


def test_a_wrong_password_is_refused_with_a_message(client, operator) -> None:
    response = client.post("/login/", {"username": "op", "password": "wrong"})
    assert response.status_code == 200
    assert "did not match" in response.content.decode()


def test_the_home_page_lists_each_pool_with_its_hosts_by_state(client, operator) -> None:
    pool = make_pool(name="ai-train-east")
    domain = make_domain(pool)
    hosts = [make_host(domain) for _ in range(4)]
    services.host_transition(host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.DRAINING, reason="t")
    services.host_transition(host_id=hosts[1].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="t")
    make_pool(name="web-central")
    client.force_login(operator)

    response = client.get("/")

    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="pool-ai-train-east"' in page
    assert 'id="pool-web-central"' in page
    assert "In service: 2" in page
    assert "Draining: 1" in page
    assert "Failed: 1" in page


def test_the_home_page_costs_the_same_queries_for_a_bigger_fleet(client, operator, django_assert_num_queries) -> None:
    from tests.trains_builders import make_train
    from trains.models import Cycle

    client.force_login(operator)

    def grow() -> None:
        pool = make_pool()
        for _ in range(2):
            domain = make_domain(pool)
            for _ in range(3):
                make_host(domain)
        train = make_train(pool)
        Cycle.objects.create(train=train, number=1, deadline_at=timezone.now() + dt.timedelta(days=1))

    # session, user, the user's roles, pending approvals (an operator's nav), pools with their host
    # counts, trains, their open cycles, their stops, visits done, running visits, reservations,
    # alerts, worker heartbeats
    grow()
    with django_assert_num_queries(13):
        assert client.get("/").status_code == 200
    for _ in range(3):
        grow()
    with django_assert_num_queries(13):
        assert client.get("/").status_code == 200


def test_the_pool_page_lists_hosts_and_filters_by_state(client, operator) -> None:
    pool = make_pool(name="web-central")
    domain = make_domain(pool)
    draining = make_host(domain, hostname="web-1")
    make_host(domain, hostname="web-2")
    services.host_transition(host_id=draining.pk, expected=HostState.IN_SERVICE, new=HostState.DRAINING, reason="t")
    client.force_login(operator)

    everything = client.get("/fleet/pools/web-central/").content.decode()
    only_draining = client.get("/fleet/pools/web-central/?state=draining").content.decode()

    assert "web-1" in everything
    assert "web-2" in everything
    assert "web-1" in only_draining
    assert "web-2" not in only_draining
    assert client.get("/fleet/pools/nope/").status_code == 404


def test_web_health_is_ok_when_the_database_answers(client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": True}


def test_worker_health_needs_a_recent_heartbeat(client, settings) -> None:
    assert client.get("/healthz/workers").status_code == 503
    stale = timezone.now() - dt.timedelta(seconds=10 * settings.WORKER_HEARTBEAT_SECONDS)
    WorkerHeartbeat.objects.create(worker="old@box", last_seen_at=stale, pid=1)
    assert client.get("/healthz/workers").json()["stale_workers"] == ["old@box"]
    assert client.get("/healthz/workers").status_code == 503
    WorkerHeartbeat.objects.create(worker="new@box", last_seen_at=timezone.now(), pid=2)
    response = client.get("/healthz/workers")
    assert response.status_code == 200
    assert response.json()["live_workers"] == ["new@box"]


def test_an_htmx_refresh_of_the_overview_gets_the_partial_alone(client, operator) -> None:
    make_host(make_domain(make_pool(name="ai-east")))
    client.force_login(operator)
    full = client.get("/").content.decode()
    partial = client.get("/", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" in full
    assert 'id="fleet-overview"' in full
    assert "<html" not in partial
    assert 'id="pool-ai-east"' in partial


def test_an_executor_gets_no_fleet_pages_and_is_told_to_use_the_api(client) -> None:
    from tests.trains_builders import make_user

    make_host(make_domain(make_pool(name="ai-east")))
    client.force_login(make_user(Role.EXECUTOR))
    response = client.get("/")
    assert response.status_code == 403
    assert "ai-east" not in response.content.decode()
    assert "/api/docs/" in response.content.decode()


def test_the_overview_shows_each_pools_gauge_train_visit_cycle_progress_reservation_and_alerts(client) -> None:
    from fleet.services import reservation_create
    from opsplanner.events import event_record
    from tests.builders import make_fleet, make_service
    from tests.driving import drive_trains, instant_simulator
    from tests.trains_builders import make_train, make_user
    from trains.models import Visit, VisitState
    from trains.services.upgrades import upgrade_create

    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, pool_name="gpu-west")
    train = make_train(pool, name="west-train")
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    drive_trains(pool, until=lambda: Visit.objects.filter(train=train, state=VisitState.DONE).exists())
    now = timezone.now()
    reservation_create(
        service=make_service(), pool=pool, min_hosts_in_service=4, starts_at=now - dt.timedelta(hours=1),
        ends_at=now + dt.timedelta(hours=1), reason="launch",
    )  # fmt: skip
    event_record(
        kind="alert.cycle_will_miss", subject=train, actor="scheduler", reason="opt-outs hold", pool_id=pool.pk
    )
    client.force_login(make_user(Role.VIEWER))

    row = client.get("/").content.decode().split('id="pool-gpu-west"')[1].split("</tr>")[0]

    assert "west-train: running" in row
    assert "cycle 1: 1/3 domains" in row
    assert '<line class="floor"' in row
    assert "reserved: 4 hosts stay in service" in row
    assert "alert.cycle_will_miss: opt-outs hold" in row
