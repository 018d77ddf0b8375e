"""The Gantt page: domains over time with visits, their forecast, operations, opt-outs and
reservations; zoom, pan, filters and expansion; bad input refused with a message."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.gantt.params import gantt_params
from console.gantt.rows import gantt_rows
from fleet.services import optout_window_create, reservation_create, service_place
from opsplanner import clock
from opsplanner.models import OperationKind
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from tests.builders import make_domain, make_fleet, make_host, make_pool, make_service
from tests.driving import drive, drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def bars_of(page: str, key: str) -> str:
    """The contents of one row's group."""
    match = re.search(rf'<g id="gantt-row-{key}"[^>]*>(.*?)</g>', page, re.S)
    assert match, f"no row {key}"
    return match.group(1)


def test_it_draws_each_domain_with_its_train_visits_and_the_forecast_ahead_of_now(client) -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=3, hosts_per_domain=2, pool_name="gpu-east")
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    first = pool.domains.order_by("position").first()
    drive_trains(pool, until=lambda: Visit.objects.filter(train=train, domain=first, state=VisitState.DONE).exists())
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/gantt/").content.decode()

    assert 'id="gantt-row-pool-' in page
    done_row = bars_of(page, f"domain-{first.pk}")
    assert "visit visit-done" in done_row
    assert f"visit {Visit.objects.get(domain=first).pk} of {train.name}" in done_row
    later = pool.domains.order_by("position").last()
    assert "bar forecast" in bars_of(page, f"domain-{later.pk}")
    assert "task task-done kind-upgrade" in done_row  # the visit's host tasks, as an operation bar


def test_each_active_upgrade_is_marked_on_its_pool_row_where_it_is_forecast_to_reach_every_host(client) -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=3, hosts_per_domain=2, pool_name="gpu-west")
    make_train(pool, cycle_slo_s=5400, visit_overhead_s=600)
    now = clock.now()
    bios = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
    driver = upgrade_create(
        pool=pool,
        component="gpu-driver",
        version="560.35.03",
        reason="rollout",
        duration_s=1200,
        deadline=now + dt.timedelta(minutes=30),  # taken first for it, but three visits take 1.5 h
    )
    client.force_login(make_user(Role.VIEWER))
    window = f"start={now - dt.timedelta(hours=1):%Y-%m-%dT%H:%M}&end={now + dt.timedelta(days=1):%Y-%m-%dT%H:%M}"

    page = client.get(f"/gantt/?pool={pool.name}&{window}").content.decode()
    by_component = client.get(f"/gantt/?pool={pool.name}&component=bios&{window}").content.decode()

    marks = re.findall(
        r'<a href="([^"]+)"><polygon class="mark ([^"]+)"[^>]*><title>([^<]+)</title>', bars_of(page, f"pool-{pool.pk}")
    )
    assert [(href, css) for href, css, _ in marks] == [
        (f"/trains/upgrades/{bios.pk}/", "upgrade-forecast"),
        (f"/trains/upgrades/{driver.pk}/", "upgrade-forecast late"),
    ]
    assert marks[0][2].startswith(f"upgrade {bios.pk}, bios 2.16.0: reaches every host by cycle 2, around ")
    assert "misses its deadline" in marks[1][2]
    assert bars_of(by_component, f"pool-{pool.pk}").count('class="mark ') == 1


def test_expanding_a_domain_draws_one_row_per_host_with_its_tasks(client) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    operation_submit(kind=OperationKind.REBOOT, scope=f"hosts: {hosts[0].hostname}", reason="kernel", actor="test")
    drive(pool)
    client.force_login(make_user(Role.VIEWER))
    domain = hosts[0].domain

    collapsed = client.get("/gantt/").content.decode()
    expanded = client.get(f"/gantt/?expand={domain.pk}").content.decode()

    assert f'id="gantt-row-host-{hosts[0].pk}"' not in collapsed
    assert "task task-done kind-reboot" in bars_of(expanded, f"host-{hosts[0].pk}")
    assert "task" not in bars_of(expanded, f"host-{hosts[1].pk}").replace("tasks", "")


def test_opt_out_windows_and_reservations_are_drawn_as_bands(client) -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    service = make_service(name="search")
    service_place(service=service, hosts=[hosts[0]])
    now = clock.now()
    optout_window_create(service=service, starts_at=now, ends_at=now + dt.timedelta(hours=6), reason="launch")
    reservation_create(
        service=service,
        pool=pool,
        min_hosts_in_service=3,
        starts_at=now,
        ends_at=now + dt.timedelta(days=1),
        reason="peak",
    )
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/gantt/").content.decode()

    assert "band optout" in bars_of(page, f"domain-{hosts[0].domain_id}")
    assert "band optout" not in bars_of(page, f"domain-{hosts[2].domain_id}")
    assert "reservation for search: at least 3 hosts" in bars_of(page, f"pool-{pool.pk}")


def test_filters_narrow_the_rows_to_a_pool_or_an_operation(client) -> None:
    instant_simulator()
    east, east_hosts = make_fleet(domains=2, hosts_per_domain=2, pool_name="east")
    west, _ = make_fleet(domains=2, hosts_per_domain=2, pool_name="west")
    operation = operation_submit(
        kind=OperationKind.REBOOT, scope=f"hosts: {east_hosts[0].hostname}", reason="k", actor="test"
    )
    client.force_login(make_user(Role.VIEWER))

    by_pool = client.get("/gantt/?pool=west").content.decode()
    by_operation = client.get(f"/gantt/?operation={operation.pk}").content.decode()

    assert f"gantt-row-pool-{west.pk}" in by_pool
    assert f"gantt-row-pool-{east.pk}" not in by_pool
    assert re.findall(r'id="gantt-row-domain-(\d+)"', by_operation) == [str(east_hosts[0].domain_id)]


def test_zoom_and_pan_links_move_the_window(client) -> None:
    make_fleet(domains=1, hosts_per_domain=1)
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/gantt/?start=2026-01-10T00:00&end=2026-01-12T00:00").content.decode()

    assert "start=2026-01-09T00%3A00&amp;end=2026-01-11T00%3A00" in page  # earlier by half the span
    assert "start=2026-01-10T12%3A00&amp;end=2026-01-11T12%3A00" in page  # zoom in around the middle
    assert "start=2026-01-09T00%3A00&amp;end=2026-01-13T00%3A00" in page  # zoom out


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("start=2026-01-12T00:00&end=2026-01-10T00:00", "must be after its start"),
        ("start=2026-01-01T00:00&end=2026-03-01T00:00", "at most 31 days"),
        ("start=yesterday", "Enter a valid date/time"),
        ("expand=3,x", "domain ids separated by commas"),
        ("train=-4", "greater than or equal to 1"),
    ],
)
def test_bad_input_is_refused_with_a_message(client, query: str, message: str) -> None:
    client.force_login(make_user(Role.VIEWER))

    response = client.get(f"/gantt/?{query}")

    assert response.status_code == 400
    assert message in response.content.decode()


def test_an_executor_gets_no_gantt(client) -> None:
    client.force_login(make_user(Role.EXECUTOR))

    assert client.get("/gantt/").status_code == 403


def test_the_live_rows_of_one_pool_are_swapped_into_their_groups() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=1)
    params, _ = gantt_params({})
    assert params is not None

    from console.gantt.svg import render_live_rows

    html = render_live_rows(gantt_rows(params, pool_ids={pool.pk}))

    assert f'hx-swap-oob="innerHTML:#gantt-row-domain-{hosts[0].domain_id}"' in html
    assert 'hx-swap-oob="innerHTML:#gantt-now"' in html


def test_without_a_window_or_a_live_train_the_gantt_opens_on_the_last_hour_and_the_next_three() -> None:
    now = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
    with clock.use_clock(lambda: now):
        params, form = gantt_params({})
    assert params is not None, form.errors
    assert (params.start, params.end) == (now - dt.timedelta(hours=1), now + dt.timedelta(hours=3))


@pytest.mark.parametrize(
    ("visit_estimate_s", "span"),
    [(60, dt.timedelta(hours=1)), (3600, dt.timedelta(hours=40)), (86_400, dt.timedelta(days=7))],
)
def test_without_a_window_the_gantt_opens_at_the_scale_of_the_live_trains_visits(
    visit_estimate_s: int, span: dt.timedelta
) -> None:
    pool = make_pool()
    make_host(make_domain(pool))
    make_train(pool, visit_estimate_s=visit_estimate_s, cycle_slo_s=365 * 86_400)
    now = clock.now().replace(microsecond=0)
    with clock.use_clock(lambda: now):
        params, form = gantt_params({})
    assert params is not None, form.errors
    assert (params.start, params.end) == (now - span / 4, now + span * 3 / 4)


def gantt_queries_with_pools_at_work(pools: int) -> int:
    start = clock.now()
    for _ in range(pools):
        pool, _ = make_fleet(domains=4, hosts_per_domain=2)
        train = make_train(pool, cycle_slo_s=4 * 3600, visit_estimate_s=60, visit_overhead_s=600)
        upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", duration_s=1200)
        train_tick(train_id=train.pk)
    params, form = gantt_params({"start": start.isoformat(), "end": (start + dt.timedelta(hours=6)).isoformat()})
    assert params is not None, form.errors
    with CaptureQueriesContext(connection) as queries:
        gantt_rows(params)
    return len(queries)


@pytest.mark.django_db
def test_the_gantt_reads_the_trains_forecasts_in_as_many_queries_for_four_trains_as_for_two() -> None:
    instant_simulator()
    two = gantt_queries_with_pools_at_work(2)

    four = gantt_queries_with_pools_at_work(2)  # four pools at work now

    assert four == two
