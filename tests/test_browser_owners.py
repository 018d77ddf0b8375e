"""A service owner in a real browser (Debian's Chromium, headless, driven by Playwright against the
real ASGI server): registers an opt-out window, sees a bad one refused inline without a page load,
and is refused another owner's service."""

from __future__ import annotations

import datetime as dt

import pytest

from fleet import services
from fleet.models import OptOutWindow
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.browser import log_in, screenshot
from tests.builders import make_fleet, make_service
from tests.trains_builders import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
PASSWORD = "x-pass-123"  # make_user's


def local(moment: dt.datetime) -> str:
    """What a datetime-local input holds (the form reads it as UTC)."""
    return moment.strftime("%Y-%m-%dT%H:%M")


def test_a_service_owner_registers_an_opt_out_window_and_cannot_touch_another_owners_service(
    live_server_process, chromium
) -> None:
    _, hosts = make_fleet(domains=2, hosts_per_domain=2, pool_name="inference-north")
    owner = make_user(Role.SERVICE_OWNER)
    service = make_service(name="chat-serving", owners=[owner])
    services.service_place(service=service, hosts=hosts[:2])
    other = make_service(name="ads-ranking", owners=[make_user(Role.SERVICE_OWNER)])
    services.service_place(service=other, hosts=hosts[2:])
    tomorrow = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    page = log_in(chromium, live_server_process, owner.username, PASSWORD)
    try:
        # From the navigation to the service and its form.
        page.locator("nav").get_by_role("link", name="My services").click()
        page.get_by_role("link", name="chat-serving").click()
        page.get_by_role("link", name="Register an opt-out window").click()
        page.wait_for_selector("#window-form")
        page.fill("#id_starts_at", local(tomorrow))
        page.fill("#id_ends_at", local(tomorrow + dt.timedelta(hours=6)))
        page.fill("#id_reason", "model launch")
        page.get_by_role("button", name="Register").click()

        # Back on the service page, the window is listed.
        page.wait_for_url(f"{live_server_process.url}/fleet/services/chat-serving/")
        window = OptOutWindow.objects.get(service=service)
        row = page.locator(f"#optout-{window.pk}")
        assert "model launch" in row.inner_text()
        assert local(tomorrow).replace("T", " ") in row.inner_text()
        assert f"Opt-out window #{window.pk} registered." in page.locator(".messages").inner_text()
        screenshot(page, "owner_service")

        # A bad one: the error appears next to the field, swapped in by HTMX, and nothing is written.
        page.get_by_role("link", name="Register an opt-out window").click()
        page.wait_for_selector("#window-form")
        # Under load the form can show before HTMX is set up; submitted then, it would be a page load.
        page.wait_for_load_state("load")
        page.evaluate("window.__notReloaded = true")
        windows, events = OptOutWindow.objects.count(), Event.objects.count()
        page.fill("#id_starts_at", local(tomorrow + dt.timedelta(hours=6)))
        page.fill("#id_ends_at", local(tomorrow))
        page.fill("#id_reason", "backwards")
        page.get_by_role("button", name="Register").click()
        error = page.locator("[data-field=ends_at] .field-errors")
        error.wait_for()
        assert error.inner_text() == "The end must be after the start."
        assert page.evaluate("window.__notReloaded") is True  # swapped in place, not a page load
        assert page.locator("#id_reason").input_value() == "backwards"  # what was typed is kept
        assert (OptOutWindow.objects.count(), Event.objects.count()) == (windows, events)
        screenshot(page, "owner_optout_form")

        # Another owner's service: its form is refused, saying why.
        response = page.goto(f"{live_server_process.url}/fleet/services/ads-ranking/optouts/new/")
        assert response.status == 404
        assert "no service ads-ranking among the services you own" in page.locator(".refusal").inner_text()
        assert page.locator("#window-form").count() == 0
        assert not OptOutWindow.objects.filter(service=other).exists()
    finally:
        page.close()
