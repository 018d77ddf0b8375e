"""The Content-Security-Policy in a real browser: every page an operator opens loads and runs
(scripts, the live websocket, the admin, the browsable API) without a single violation, and a
state filter that used an inline handler before submits itself from a static script."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from fleet.models import HostState
from fleet.services import host_transition
from opsplanner.roles import Role
from tests.browser import committed_elsewhere, log_in
from tests.builders import make_fleet
from tests.trains_builders import make_train, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
PASSWORD = "x-pass-123"  # make_user's


def test_no_page_an_operator_opens_breaks_the_content_security_policy(live_server_process, chromium) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, pool_name="csp-east")
    host_transition(host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")
    train = make_train(pool)
    operator = make_user(Role.OPERATOR)
    page = log_in(chromium, live_server_process, operator.username, PASSWORD, enforce_csp=True)
    refused: list[str] = []
    page.on(
        "console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None
    )
    paths = [
        "/",
        "/gantt/",
        "/events/",
        "/approvals/",
        "/simulations/advisor/",
        "/trains/",
        f"/trains/{train.pk}/",
        "/trains/upgrades/",
        "/trains/emergency/new/",
        f"/fleet/pools/{pool.name}/",
        f"/fleet/hosts/{hosts[0].hostname}/",
        "/api/hosts/",
        "/admin/login/",
    ]
    try:
        for path in paths:
            response = page.goto(f"{live_server_process.url}{path}")
            assert response is not None
            assert response.status == 200, path
            assert "script-src 'self';" in response.headers["content-security-policy"], path
            page.wait_for_load_state("load")
        page.goto(f"{live_server_process.url}/")
        page.locator("body[data-live='1']").wait_for(timeout=10_000)  # connect-src lets the socket open
        committed_elsewhere(
            host_transition, host_id=hosts[1].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu"
        )
        expect(page.locator(f"#pool-{pool.name} .in-service")).to_have_text("1", timeout=10_000)  # pushed and swapped
        page.wait_for_timeout(300)  # reports of anything refused after the load arrive as console messages
        assert refused == []
    finally:
        page.close()


def test_a_state_filter_submits_itself_when_changed(live_server_process, chromium) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3, pool_name="csp-filter")
    host_transition(host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")
    viewer = make_user(Role.VIEWER)
    page = log_in(chromium, live_server_process, viewer.username, PASSWORD, enforce_csp=True)
    try:
        page.goto(f"{live_server_process.url}/fleet/pools/{pool.name}/")
        page.select_option("select[name=state]", HostState.FAILED)
        page.wait_for_url("**state=failed**")
        text = page.locator("main").inner_text()
        assert hosts[0].hostname in text
        assert hosts[1].hostname not in text
    finally:
        page.close()
