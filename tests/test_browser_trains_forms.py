"""The operators' train and upgrade forms in a real browser, under the Content-Security-Policy:
create a train (after an SLO the visits cannot meet is refused next to its field), edit it, pause
and resume it from its page; create an upgrade with two phases (after an incompatible version is
refused next to the version), offboard it (after an empty reason is refused). A screenshot of each
page goes to var/screenshots/. Who may see and post the forms: tests/test_web_trains_forms.py."""

from __future__ import annotations

from typing import Any

import pytest

from opsplanner.models import Event
from opsplanner.roles import Role
from tests.browser import log_in, screenshot
from tests.builders import make_fleet
from tests.trains_builders import make_user
from trains.models import Train, TrainState, Upgrade, UpgradeState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
PASSWORD = "x-pass-123"  # make_user's
WEEK = 7 * 24 * 3600


def operator_page(chromium: Any, server: Any) -> tuple[Any, list[str]]:
    """An operator's page under the policy, and the list the policy's refusals are reported to."""
    page = log_in(chromium, server, make_user(Role.OPERATOR).username, PASSWORD, enforce_csp=True)
    refused: list[str] = []
    page.on("console", lambda message: refused.append(message.text) if "Content Security" in message.text else None)
    return page, refused


def submit(page: Any, form: str) -> None:
    """Click the form's button and wait for the page that answers. The button is focused first:
    headless Chromium may scroll when focus moves to it (its window is smaller than the emulated
    viewport), which would land the mouse's release elsewhere and lose the click."""
    button = page.locator(f"{form} button[type=submit]")
    button.focus()
    with page.expect_navigation():
        button.click()


def test_an_operator_creates_edits_pauses_and_resumes_a_train_in_the_browser(live_server_process, chromium) -> None:
    pool, _ = make_fleet(domains=3, hosts_per_domain=2, pool_name="ai-train-forms")
    url = live_server_process.url
    page, refused = operator_page(chromium, live_server_process)
    try:
        page.goto(f"{url}/trains/")
        page.locator(".page-actions").get_by_role("link", name="New train").click()
        page.wait_for_url(f"{url}/trains/new/")
        page.select_option("select[name=pool]", pool.name)
        page.fill("input[name=name]", "ai-train-forms-east")
        page.fill("input[name=visit_estimate_s]", "3600")
        page.fill("input[name=cycle_slo_s]", "7200")  # three visits of an hour, one at a time, need three
        page.fill("textarea[name=domain_order]", "rack-0002\nrack-0001\nrack-0003")
        screenshot(page, "train_form_new")
        submit(page, ".train-form-page")

        error = page.locator("[data-field=cycle_slo_s] .field-errors")
        assert "takes at least 10800 s; the SLO of 7200 s cannot be met" in error.inner_text()
        assert page.input_value("input[name=name]") == "ai-train-forms-east"  # kept, to be fixed
        assert not Train.objects.filter(pool=pool).exists()
        screenshot(page, "train_form_refused")

        page.fill("input[name=cycle_slo_s]", str(WEEK))
        submit(page, ".train-form-page")
        train = Train.objects.get(pool=pool)
        page.wait_for_url(f"{url}/trains/{train.pk}/")
        assert "Train ai-train-forms-east created" in page.locator("#trains-notice").inner_text()
        assert [s.domain.name for s in train.stops.order_by("position")] == ["rack-0002", "rack-0001", "rack-0003"]

        page.get_by_role("link", name="Edit train").click()
        page.wait_for_url(f"{url}/trains/{train.pk}/edit/")
        assert page.input_value("textarea[name=domain_order]") == "rack-0002\nrack-0001\nrack-0003"
        page.fill("input[name=cycle_slo_s]", str(2 * WEEK))
        page.fill("input[name=visit_concurrency]", "2")
        page.fill("textarea[name=domain_order]", "rack-0001 rack-0002 rack-0003")
        screenshot(page, "train_form_edit")
        submit(page, ".train-form-page")
        page.wait_for_url(f"{url}/trains/{train.pk}/")
        assert "saved" in page.locator("#trains-notice").inner_text()
        assert "2 domains at a time" in page.locator(f"#train-{train.pk} .meta").inner_text()
        updated = Event.objects.get(kind="train.updated", subject_id=train.pk)
        assert sorted(updated.data["after"]) == ["cycle_slo_s", "domain_order", "visit_concurrency"]

        # Pause and resume from the train's page, each with its reason (HTMX swaps the status).
        page.fill(f"#pause-reason-{train.pk}", "vendor advisory on the driver")
        page.click(f"#train-{train.pk}-actions .pause-form button")
        page.locator(f"#train-{train.pk}[data-state=paused]").wait_for(timeout=10_000)
        page.fill(f"#resume-reason-{train.pk}", "advisory resolved")
        page.click(f"#train-{train.pk}-actions .resume-form button")
        page.locator(f"#train-{train.pk}[data-state=running]").wait_for(timeout=10_000)
        assert Train.objects.get(pk=train.pk).state == TrainState.RUNNING
        screenshot(page, "train_after_edit")
        assert refused == []
    finally:
        page.close()


def test_an_operator_creates_an_upgrade_with_two_phases_and_offboards_it_in_the_browser(
    live_server_process, chromium
) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2, pool_name="ai-infer-forms")
    url = live_server_process.url
    page, refused = operator_page(chromium, live_server_process)
    try:
        page.goto(f"{url}/trains/upgrades/")
        page.locator(".page-actions").get_by_role("link", name="New upgrade").click()
        page.wait_for_url(f"{url}/trains/upgrades/new/")
        page.select_option("select[name=pool]", pool.name)
        page.select_option("select[name=component]", "gpu-driver")
        page.select_option("select[name=version]", "535.183.01")  # breaks the CUDA runtime's rule
        page.fill("textarea[name=reason]", "driver with the NCCL fix")
        page.fill("input[name=max_failures]", "1")
        page.fill("input[name=phase-0-name]", "canary")
        page.fill("input[name=phase-0-domain]", "rack-0001")
        page.fill("input[name=phase-0-min_successes]", "1")
        page.fill("input[name=phase-0-soak_s]", "600")
        page.fill("input[name=phase-1-name]", "everywhere")
        page.fill("input[name=phase-1-percent]", "100")
        page.fill("input[name=phase-1-min_successes]", "0")
        page.select_option("select[name=phase-1-selection]", "any")
        screenshot(page, "upgrade_form_new")
        submit(page, ".upgrade-form-page")

        assert "would break a compatibility rule" in page.locator("[data-field=version] .field-errors").inner_text()
        assert page.input_value("input[name=phase-0-domain]") == "rack-0001"  # the phases are kept
        assert not Upgrade.objects.filter(pool=pool).exists()
        screenshot(page, "upgrade_form_refused")

        page.select_option("select[name=version]", "560.35.03")
        submit(page, ".upgrade-form-page")
        upgrade = Upgrade.objects.get(pool=pool)
        page.wait_for_url(f"{url}/trains/upgrades/{upgrade.pk}/")
        assert f"Upgrade #{upgrade.pk} created" in page.locator("#trains-notice").inner_text()
        phases = page.locator(f"#upgrade-{upgrade.pk} table.phases tbody tr")
        assert phases.count() == 2
        assert "domain rack-0001" in phases.nth(0).inner_text()
        assert "100% of the scope (or any hosts of the pool)" in phases.nth(1).inner_text()
        screenshot(page, "upgrade_created")

        # An empty reason goes to the offboard page, which says why; then a reason offboards it.
        page.goto(f"{url}/trains/upgrades/{upgrade.pk}/offboard/")
        submit(page, ".offboard-form-page")
        assert "Say why" in page.locator("[data-field=reason] .field-errors").inner_text()
        assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.ACTIVE
        screenshot(page, "upgrade_offboard_refused")
        page.goto(f"{url}/trains/upgrades/{upgrade.pk}/")
        page.fill(f"#offboard-reason-{upgrade.pk}", "hosts fail to boot after the flash")
        page.click(f"#upgrade-{upgrade.pk}-actions .offboard-form button")
        page.locator(f"#upgrade-{upgrade.pk}[data-state=offboarded]").wait_for(timeout=10_000)
        assert "offboarded" in page.locator("#trains-notice").inner_text()
        assert (
            "hosts fail to boot after the flash" in page.locator(f"#upgrade-{upgrade.pk} .offboard-reason").inner_text()
        )
        assert page.locator(f"#upgrade-{upgrade.pk}-actions .reonboard-form").is_visible()
        screenshot(page, "upgrade_offboarded")
        assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED
        assert refused == []
    finally:
        page.close()


def test_an_operator_replans_an_upgrade_in_the_browser(live_server_process, chromium) -> None:
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=2, hosts_per_domain=2, pool_name="ai-replan-forms")
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="firmware fix")
    url = live_server_process.url
    page, refused = operator_page(chromium, live_server_process)
    try:
        page.goto(f"{url}/trains/upgrades/{upgrade.pk}/")
        page.locator(".page-actions").get_by_role("link", name="Replan").click()
        page.wait_for_url(f"{url}/trains/upgrades/{upgrade.pk}/replan/")
        # Multi-cycle without a number of hosts per visit is refused next to that field; nothing changes.
        page.check("input[name=multi_cycle]")
        page.fill("input[name=hosts_per_visit]", "")
        submit(page, ".replan-form-page")
        assert (
            "needs a number of hosts per visit"
            in page.locator("[data-field=hosts_per_visit] .field-errors").inner_text()
        )
        assert not Upgrade.objects.get(pk=upgrade.pk).multi_cycle
        screenshot(page, "upgrade_replan_refused")

        page.uncheck("input[name=multi_cycle]")
        page.fill("input[name=priority]", "900")
        submit(page, ".replan-form-page")
        page.wait_for_url(f"{url}/trains/upgrades/{upgrade.pk}/")
        assert "replanned" in page.locator("#trains-notice").inner_text()
        assert Upgrade.objects.get(pk=upgrade.pk).priority == 900
        (event,) = Event.objects.filter(kind="upgrade.replanned", subject_id=upgrade.pk)
        assert event.data == {"priority": [upgrade.priority, 900]}
        screenshot(page, "upgrade_replanned")
        assert refused == []
    finally:
        page.close()
