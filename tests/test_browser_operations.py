"""Ad-hoc operations in a real browser: the scope preview follows what is typed, a refused submission
says why next to the scope, an operation is cancelled from its page, and an escalated host's repair
is retried from the host page."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState
from fleet.services.hosts import host_transition
from opsplanner.models import HostTask, Operation, OperationState, TaskState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from tests.browser import log_in, screenshot
from tests.builders import make_fleet
from tests.test_resubmissions_shown_and_cancelled import an_open_original_resubmitted_on_its_first_host
from tests.trains_builders import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
PASSWORD = "x-pass-123"  # make_user's


def preview_shows(page: object, hosts: int) -> None:
    page.locator(f'#scope-preview [data-preview-hosts="{hosts}"]').wait_for(timeout=10_000)  # type: ignore[attr-defined]


def test_an_operator_watches_the_preview_follow_the_scope_then_submits_a_reboot(live_server_process, chromium) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=3, pool_name="ai-ops-east", planned_buffer_hosts=2)
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/operations/new/")
        page.fill("input[name=scope]", "domain ai-ops-east/rack-0001")
        preview_shows(page, 3)
        page.fill("input[name=scope]", "pool ai-ops-east")
        preview_shows(page, 6)
        preview = page.locator("#scope-preview").inner_text()
        assert "2 could start now" in preview
        assert "planned buffer of pool ai-ops-east is full (2 hosts)" in preview
        page.select_option("select[name=needs_drain]", "no")  # in place: no room needed
        page.locator("#scope-preview", has_text="6 could start now").wait_for(timeout=10_000)
        page.select_option("select[name=needs_drain]", "")
        page.locator("#scope-preview", has_text="2 could start now").wait_for(timeout=10_000)
        page.fill("input[name=scope]", "pool ai-ops-nowhere")
        page.locator("#scope-preview .preview-error").wait_for(timeout=10_000)
        assert "There is no pool named 'ai-ops-nowhere'." in page.locator("#scope-preview").inner_text()
        page.fill("input[name=scope]", "pool ai-ops-east")
        preview_shows(page, 6)
        page.fill("textarea[name=reason]", "kernel 6.8 security fix")
        screenshot(page, "operation_new_preview")

        page.click(".operation-form button[type=submit]")
        operation = Operation.objects.get()
        page.wait_for_url(f"{live_server_process.url}/operations/{operation.pk}/")
        assert (operation.kind, operation.scope) == ("reboot", "pool ai-ops-east")
        assert "6 pending" in page.locator("#task-counts").inner_text()
        assert page.locator(".operation-tasks tbody tr").count() == 6
        screenshot(page, "operation_detail")
        page.goto(f"{live_server_process.url}/operations/?pool={pool.name}")
        assert f"#{operation.pk}" in page.locator("table.operations").inner_text()
        screenshot(page, "operations_list")
    finally:
        page.close()


def test_a_submission_to_an_unknown_pool_is_refused_with_the_message_next_to_the_scope(
    live_server_process, chromium
) -> None:
    make_fleet(domains=1, hosts_per_domain=2, pool_name="ai-ops-west")
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/operations/new/")
        page.fill("input[name=scope]", "pool ai-ops-south")
        page.fill("textarea[name=reason]", "firmware check")
        page.click(".operation-form button[type=submit]")
        page.wait_for_load_state()
        error = page.locator("[data-field=scope] .field-errors")
        assert error.inner_text() == "There is no pool named 'ai-ops-south'."
        assert page.input_value("input[name=scope]") == "pool ai-ops-south"  # kept for fixing
        screenshot(page, "operation_new_refused")
        assert not Operation.objects.exists()
    finally:
        page.close()


def test_an_operator_cancels_an_operation_from_its_page(live_server_process, chromium) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=3, pool_name="ai-ops-north")
    operation = operation_submit(kind="verification", scope=f"pool {pool.name}", reason="burn-in")
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/operations/{operation.pk}/")
        page.click(".cancel-operation button[type=submit]")  # no reason yet: refused inline
        page.wait_for_load_state()
        assert Operation.objects.get(pk=operation.pk).state == OperationState.OPEN
        page.fill(".cancel-operation textarea[name=reason]", "scheduled for the wrong week")
        page.click(".cancel-operation button[type=submit]")
        page.locator(".notice.success").wait_for(timeout=10_000)
        assert "3 pending tasks cancelled" in page.locator(".notice.success").inner_text()
        assert page.locator("#operation-state").inner_text() == "Cancelled"
        assert page.locator(".cancel-operation").count() == 0
        screenshot(page, "operation_cancelled")
        assert set(HostTask.objects.filter(operation=operation).values_list("state", flat=True)) == {
            TaskState.CANCELLED
        }
    finally:
        page.close()


def test_an_operator_retries_an_escalated_host_from_the_host_page(live_server_process, chromium) -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="ai-ops-repair")
    host = hosts[0]
    for expected, new in ((HostState.IN_SERVICE, HostState.FAILED), (HostState.FAILED, HostState.ESCALATED)):
        host_transition(host_id=host.pk, expected=expected, new=new, reason="three repairs failed")
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/fleet/hosts/{host.hostname}/")
        section = page.locator(".host-escalation")
        assert "Escalated: a human must act" in section.inner_text()
        screenshot(page, "host_escalated")
        section.locator("textarea[name=reason]").fill("reseated the GPU tray")
        section.get_by_role("button", name="Retry the repair").click()
        page.locator(".notice.success").wait_for(timeout=10_000)
        operation = Operation.objects.get(kind="repair")
        assert page.url == f"{live_server_process.url}/operations/{operation.pk}/"
        assert "1 running" in page.locator("#task-counts").inner_text()
        screenshot(page, "host_escalation_retried")
        assert Host.objects.get(pk=host.pk).state == HostState.REPAIR
    finally:
        page.close()


def test_a_viewer_sees_the_operation_but_no_cancel_button(live_server_process, chromium) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1, pool_name="ai-ops-view")
    operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")
    page = log_in(chromium, live_server_process, make_user(Role.VIEWER).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/operations/{operation.pk}/")
        assert "1 pending" in page.locator("#task-counts").inner_text()
        assert page.locator(".cancel-operation").count() == 0
        assert page.get_by_role("link", name="Operations").count() == 1
    finally:
        page.close()


def test_the_operations_pages_and_the_live_preview_keep_the_content_security_policy(
    live_server_process, chromium
) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="ai-ops-csp")
    operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")
    for expected, new in ((HostState.IN_SERVICE, HostState.FAILED), (HostState.FAILED, HostState.ESCALATED)):
        host_transition(host_id=hosts[1].pk, expected=expected, new=new, reason="three repairs failed")
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD, enforce_csp=True)
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    paths = [
        "/operations/",
        f"/operations/{operation.pk}/",
        f"/escalations/{hosts[1].hostname}/release/",
        f"/fleet/hosts/{hosts[1].hostname}/",
        "/operations/new/",
    ]
    try:
        for path in paths:
            response = page.goto(f"{live_server_process.url}{path}")
            assert response is not None
            assert response.status == 200, path
            page.wait_for_load_state("load")
        page.fill("input[name=scope]", f"pool {pool.name}")  # the preview is HTMX, no inline script
        preview_shows(page, 2)
        page.wait_for_timeout(300)
        assert refused == []
    finally:
        page.close()


def test_an_operator_follows_a_resubmission_to_its_original_and_cancels_both_there(
    live_server_process, chromium
) -> None:
    wanted, again, _ = an_open_original_resubmitted_on_its_first_host()
    page = log_in(chromium, live_server_process, make_user(Role.OPERATOR).username, PASSWORD)
    try:
        page.goto(f"{live_server_process.url}/operations/{again.pk}/")
        page.locator("#resubmission-of").get_by_role("link", name=f"#{wanted.pk}").click()
        page.wait_for_load_state()
        assert page.url == f"{live_server_process.url}/operations/{wanted.pk}/"
        assert page.locator("#resubmissions").get_by_role("link", name=f"#{again.pk}").count() == 1
        screenshot(page, "operation_resubmitted")
        page.fill(".cancel-operation textarea[name=reason]", "2.16.0 is not wanted after all")
        page.click(".cancel-operation button[type=submit]")
        page.locator(".notice.success").wait_for(timeout=10_000)
        assert "2 pending tasks cancelled" in page.locator(".notice.success").inner_text()  # its, and again's
        assert Operation.objects.get(pk=again.pk).state == OperationState.CANCELLED
    finally:
        page.close()
