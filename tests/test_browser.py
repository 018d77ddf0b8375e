"""The dashboard in a real browser: headless Chromium (Debian's) driven by Playwright, against the
real ASGI server on the test database."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from fleet.models import HostState
from fleet.services import host_transition
from opsplanner import clock
from opsplanner.roles import Role
from tests.browser import committed_elsewhere, log_in, record, screenshot
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Visit, VisitState
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
PASSWORD = "x-pass-123"  # make_user's


def test_an_operator_logs_in_and_sees_every_pool_with_its_buffers(live_server_process, chromium) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, pool_name="ai-train-east")
    operator = make_user(Role.OPERATOR)
    page = log_in(chromium, live_server_process, operator.username, PASSWORD)
    try:
        row = page.locator(f"#pool-{pool.name}")
        row.wait_for()
        assert row.locator(".in-service").inner_text() == "6"
        assert page.locator("nav").get_by_text("Fleet").is_visible()
        assert f"{operator.username} (operator)" in page.locator(".who").inner_text()
        screenshot(page, "overview")
    finally:
        page.close()


def test_a_wrong_password_is_refused_with_a_message(live_server_process, chromium) -> None:
    viewer = make_user(Role.VIEWER)
    page = log_in(chromium, live_server_process, viewer.username, "not-the-password")
    try:
        assert "did not match" in page.locator(".error").inner_text()
        assert "/login/" in page.url
    finally:
        page.close()


def test_the_overview_shows_hosts_leaving_service_live_over_the_websocket(live_server_process, chromium) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, pool_name="web-central")
    viewer = make_user(Role.VIEWER)
    page = log_in(chromium, live_server_process, viewer.username, PASSWORD)
    try:
        cell = page.locator(f"#pool-{pool.name} .in-service")
        cell.wait_for()
        page.wait_for_function("document.body.dataset.live === '1'", timeout=10_000)  # the socket is open
        page.evaluate("window.__notReloaded = true")
        latencies = []
        for count, host in enumerate(hosts[:5], start=1):
            committed = time.monotonic()
            committed_elsewhere(
                host_transition, host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu"
            )
            page.wait_for_function(
                f"document.querySelector('#pool-{pool.name} .in-service').innerText.trim() === '{6 - count}'",
                timeout=10_000,
                polling=10,
            )
            latencies.append(time.monotonic() - committed)
        assert page.evaluate("window.__notReloaded") is True  # swapped in place, not a page load
        assert "5 / 2" in page.locator(f"#pool-{pool.name} .failure-out").inner_text()
        # Pushed, not polled: polling is off while the socket is open and would take up to 3 s.
        assert max(latencies) < 2.5, latencies
        record("live_update_latency_s", latencies)
    finally:
        page.close()


def test_a_viewer_sees_no_admin_link_and_an_executor_sees_no_fleet(live_server_process, chromium) -> None:
    make_fleet(domains=1, hosts_per_domain=2, pool_name="storage-west")
    viewer_page = log_in(chromium, live_server_process, make_user(Role.VIEWER).username, PASSWORD)
    executor_page = log_in(chromium, live_server_process, make_user(Role.EXECUTOR).username, PASSWORD)
    try:
        assert viewer_page.locator("nav a", has_text="Admin").count() == 0
        assert viewer_page.locator("#pool-storage-west").is_visible()
        assert executor_page.locator("#pool-storage-west").count() == 0
        assert "works through the API" in executor_page.locator("main").inner_text()
    finally:
        viewer_page.close()
        executor_page.close()


def _drive_until_visit_done(*, train_id: int, pool_id: int, domain_id: int) -> None:
    """What the workers would do, round by round: tick the train and the pool, run the simulator."""
    from opsplanner.services.simulator import simulated_work_step
    from opsplanner.services.tick import pool_tick

    for _ in range(60):
        train_tick(train_id=train_id)
        pool_tick(pool_id=pool_id)
        simulated_work_step()
        if Visit.objects.filter(train_id=train_id, domain_id=domain_id, state=VisitState.DONE).exists():
            return
    raise AssertionError("the visit did not finish")


def test_a_gantt_bar_changes_state_live_while_a_train_runs(live_server_process, chromium) -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, pool_name="gpu-gantt")
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    first = pool.domains.order_by("position").first()
    page = log_in(chromium, live_server_process, make_user(Role.VIEWER).username, PASSWORD)
    try:
        # An hour around now, so the one-minute visits of this test train are wide enough to see.
        now = clock.now()
        window = (
            f"start={now - dt.timedelta(minutes=10):%Y-%m-%dT%H:%M}&end={now + dt.timedelta(minutes=50):%Y-%m-%dT%H:%M}"
        )
        page.goto(f"{live_server_process.url}/gantt/?pool={pool.name}&{window}")
        row = f"#gantt-row-domain-{first.pk}"
        page.locator(f"{row} rect.forecast").first.wait_for()  # not yet visited: a forecast bar
        page.wait_for_function("document.body.dataset.live === '1'", timeout=10_000)
        page.evaluate("window.__notReloaded = true")

        committed_elsewhere(train_tick, train_id=train.pk)  # the train starts its first visit

        page.locator(f"{row} rect.visit-running").wait_for(timeout=10_000)
        assert page.locator(f"{row} rect.forecast").count() == 0
        screenshot(page, "gantt")

        committed_elsewhere(_drive_until_visit_done, train_id=train.pk, pool_id=pool.pk, domain_id=first.pk)

        page.locator(f"{row} rect.visit-done").wait_for(timeout=10_000)
        assert page.locator(f"{row} rect.visit-running").count() == 0
        assert page.evaluate("window.__notReloaded") is True  # swapped in place over the websocket
        # The swapped bars are SVG elements (drawn), not unknown HTML elements.
        namespace = page.evaluate(f"document.querySelector('{row} rect.visit-done').namespaceURI")
        assert namespace == "http://www.w3.org/2000/svg"
    finally:
        page.close()
