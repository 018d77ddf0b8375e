"""An emergency train in a real browser: one operator requests it, a second one, whose queue was
already open, sees it arrive live and approves it; the first sees the approval land without reloading."""

from __future__ import annotations

import pytest

from fleet.services import installed_version_set
from opsplanner.models import Approval, ApprovalState
from opsplanner.roles import Role
from opsplanner.services.approvals import approval_request
from tests.browser import committed_elsewhere, log_in, screenshot
from tests.builders import make_fleet
from tests.trains_builders import make_user, nic_firmware
from trains.models import Train, TrainState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
PASSWORD = "x-pass-123"  # make_user's
LIVE = "document.body.dataset.live === '1'"


def test_one_operator_requests_an_emergency_train_and_another_approves_it_live(live_server_process, chromium) -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, pool_name="ai-train-west", planned_buffer_hosts=1)
    nic = nic_firmware()
    for host in hosts[:4]:
        installed_version_set(host=host, version=nic["22.1"])
    requester, approver = make_user(Role.OPERATOR), make_user(Role.OPERATOR)
    url = live_server_process.url
    page_a = log_in(chromium, live_server_process, requester.username, PASSWORD)
    page_b = log_in(chromium, live_server_process, approver.username, PASSWORD)
    try:
        # B has the queue open, live, before anything is requested.
        page_b.goto(f"{url}/approvals/")
        page_b.wait_for_function(LIVE, timeout=10_000)
        assert "No request is waiting for a decision." in page_b.locator("#approvals-queue").inner_text()
        page_b.evaluate("window.__notReloaded = true")

        # A fills in the emergency train form.
        page_a.goto(f"{url}/trains/emergency/new/")
        page_a.select_option("select[name=pool]", pool.name)
        page_a.fill("input[name=component]", "nic-firmware")
        page_a.fill("input[name=version]", "22.4")
        page_a.fill("input[name=scope]", "hosts running nic-firmware below 22.4")
        page_a.fill("input[name=domains_at_once]", "2")
        page_a.fill("input[name=visit_estimate_s]", "900")
        page_a.fill("textarea[name=reason]", "CVE-2026-1234 in the NIC firmware")
        page_a.click(".emergency-form button[type=submit]")
        page_a.wait_for_url(f"{url}/approvals/")
        train = Train.objects.get(pool=pool)
        approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
        assert "waits for a second operator" in page_a.locator("#approvals-notice").inner_text()
        mine = page_a.locator(f"#pending-{approval.pk}")
        assert "waiting for another operator" in mine.inner_text()
        assert mine.locator("button").count() == 0  # the requester cannot approve their own request
        page_a.wait_for_function(LIVE, timeout=10_000)
        page_a.evaluate("window.__notReloaded = true")

        # The request arrived in B's open queue without a reload, with what it would do.
        theirs = page_b.locator(f"#pending-{approval.pk}")
        theirs.wait_for(timeout=10_000)
        assert "hosts running nic-firmware below 22.4" in theirs.inner_text()
        assert "4 hosts" in theirs.inner_text()
        assert page_b.locator("#approvals-pending").inner_text().strip() == "1"
        screenshot(page_b, "approvals_queue")

        # B starts typing; another request arriving live re-renders the queue but keeps what B typed.
        theirs.locator("textarea[name=reason]").fill("CVE confirmed by security")
        committed_elsewhere(
            approval_request,
            kind="large_operation",
            subject_type="fleet.pool",
            subject_id=pool.pk,
            reason="reboot the whole pool",
            actor=make_user(Role.OPERATOR),
        )
        page_b.locator("#approvals-queue article.approval").nth(1).wait_for(timeout=10_000)
        assert theirs.locator("textarea[name=reason]").input_value() == "CVE confirmed by security"

        # B approves (the form came over the websocket; HTMX posts it with the page's CSRF header).
        theirs.get_by_role("button", name="Approve").click()
        page_b.locator(f"#decided-{approval.pk}").wait_for(timeout=10_000)
        # The live push can move the row before HTMX's own answer, which alone carries the notice, lands.
        page_b.locator("#approvals-notice .notice").wait_for(timeout=10_000)
        assert "You approved" in page_b.locator("#approvals-notice").inner_text()

        # A sees it take effect live: the row moved to the decided list, approved, by B.
        decided = page_a.locator(f"#decided-{approval.pk}")
        decided.wait_for(timeout=10_000)
        assert page_a.locator(f"#pending-{approval.pk}").count() == 0
        assert "Approved" in decided.locator(".outcome").inner_text()
        assert approver.username in decided.locator(".decider").inner_text()
        assert "CVE confirmed by security" in decided.inner_text()
        assert page_a.evaluate("window.__notReloaded") is True
        assert page_b.evaluate("window.__notReloaded") is True
        screenshot(page_a, "approvals_queue_decided")

        approval.refresh_from_db()
        assert (approval.state, approval.decided_by) == (ApprovalState.APPROVED, approver)
        assert Train.objects.get(pk=train.pk).state == TrainState.RUNNING
    finally:
        page_a.close()
        page_b.close()


def test_the_emergency_form_shows_a_bad_scope_next_to_the_field_in_the_browser(live_server_process, chromium) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2, pool_name="ai-train-north")
    nic_firmware()
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/trains/emergency/new/")
        page.select_option("select[name=pool]", pool.name)
        page.fill("input[name=component]", "nic-firmware")
        page.fill("input[name=version]", "22.4")
        page.fill("input[name=scope]", "every host that looks tired")
        page.fill("textarea[name=reason]", "urgent")
        page.click(".emergency-form button[type=submit]")
        page.wait_for_load_state()
        error = page.locator("[data-field=scope] .field-errors")
        assert "Cannot read the scope" in error.inner_text()
        assert page.input_value("input[name=scope]") == "every host that looks tired"  # kept for fixing
        screenshot(page, "emergency_form_error")
        assert not Train.objects.exists()
    finally:
        page.close()
