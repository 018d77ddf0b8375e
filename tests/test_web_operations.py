"""The operations pages through Django's test client: submitting through the same service as the
API with refusals inline, the scope preview, the list's filters, an operation's page, cancelling,
and retrying or releasing an escalated host; only operators see the buttons or may post."""

from __future__ import annotations

import pytest
from django.test import Client

from console.selectors import operations_pages
from fleet.models import Host, HostState
from opsplanner.models import Event, HostTask, Operation, OperationState, TaskState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet
from tests.test_host_escalations import escalated_host
from tests.test_security import database_state
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db

NOT_OPERATORS = [Role.VIEWER, Role.SERVICE_OWNER]


def client_for(role: str = Role.OPERATOR) -> Client:
    client = Client()
    client.force_login(make_user(role))
    return client


def reboot_form(scope: str, **fields: str) -> dict[str, str]:
    return {"kind": "reboot", "scope": scope, "priority": "100", "reason": "kernel fix", **fields}


def test_an_operator_submits_a_reboot_and_lands_on_its_page() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3)
    response = client_for().post("/operations/new/", reboot_form(f"pool {pool.name}"), follow=True)

    operation = Operation.objects.get()
    assert response.redirect_chain == [(f"/operations/{operation.pk}/", 302)]
    assert (operation.kind, operation.scope, operation.reason) == ("reboot", f"pool {pool.name}", "kernel fix")
    body = response.content.decode()
    assert f"Operation #{operation.pk} submitted" in body
    assert all(host.hostname in body for host in hosts)
    assert "3 tasks: " in body
    assert "3 pending" in body


def test_an_unknown_pool_is_refused_next_to_the_scope_and_nothing_is_written() -> None:
    make_fleet(domains=1, hosts_per_domain=1)
    before = database_state()
    response = client_for().post("/operations/new/", reboot_form("pool nowhere"))

    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_scope_error"' in body
    assert "There is no pool named &#x27;nowhere&#x27;." in body
    assert database_state() == before


def test_an_upgrade_without_a_version_is_refused_on_the_version_field() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    data = reboot_form(f"pool {pool.name}", kind="upgrade", component="gpu-driver")
    response = client_for().post("/operations/new/", data)
    assert response.status_code == 400
    assert 'id="id_version_error"' in response.content.decode()
    assert not Operation.objects.exists()


def test_the_scope_preview_counts_the_hosts_or_shows_the_resolvers_message() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=1)
    client = client_for()

    counted = client.get("/operations/preview/", {"scope": f"pool {pool.name}", "kind": "reboot"}).content.decode()
    refused = client.get("/operations/preview/", {"scope": "pool nowhere"}).content.decode()

    assert 'data-preview-hosts="4"' in counted
    assert "1 could start now" in counted
    assert f"planned buffer of pool {pool.name} is full (1 hosts)" in counted
    assert "There is no pool named &#x27;nowhere&#x27;." in refused


def test_the_list_filters_by_pool_and_state_and_refuses_an_unknown_pool() -> None:
    east, _east_hosts = make_fleet(domains=1, hosts_per_domain=1)
    west, _ = make_fleet(domains=1, hosts_per_domain=1)
    mine = operation_submit(kind="reboot", scope=f"pool {east.name}", reason="east only")
    operation_submit(kind="reboot", scope=f"pool {west.name}", reason="west only")
    client = client_for(Role.VIEWER)

    filtered = client.get("/operations/", {"pool": east.name, "state": "open"})
    refused = client.get("/operations/", {"pool": "nowhere"})
    wrong_state = client.get("/operations/", {"state": "sleeping"})

    assert filtered.status_code == 200
    rows = [row.operation.pk for row in filtered.context["rows"]]
    assert rows == [mine.pk]
    assert refused.status_code == 400
    assert "pool: Select a valid choice" in refused.content.decode()
    assert wrong_state.status_code == 400
    assert "sleeping is not one of the available choices" in (wrong_state.content.decode())


def test_an_operations_tasks_are_paginated_with_counts_per_state(monkeypatch) -> None:
    monkeypatch.setattr(operations_pages, "TASKS_PER_PAGE", 2)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=5)
    operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")
    client = client_for(Role.VIEWER)

    first = client.get(f"/operations/{operation.pk}/")
    last = client.get(f"/operations/{operation.pk}/", {"page": "3"})

    assert [task.host_id for task in first.context["detail"].tasks] == [hosts[0].pk, hosts[1].pk]
    assert "page 1 of 3" in first.content.decode()
    assert "5 pending" in first.content.decode()
    assert [task.host_id for task in last.context["detail"].tasks] == [hosts[4].pk]
    assert "operation.submitted" in first.content.decode()


def test_an_operator_cancels_an_operation_with_a_reason() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")
    client = client_for()

    refused = client.post(f"/operations/{operation.pk}/cancel/", {"reason": ""})
    response = client.post(f"/operations/{operation.pk}/cancel/", {"reason": "wrong pool"}, follow=True)

    assert refused.status_code == 400
    assert "This field is required." in refused.content.decode()
    assert Operation.objects.get(pk=operation.pk).state == OperationState.CANCELLED
    assert set(HostTask.objects.values_list("state", flat=True)) == {TaskState.CANCELLED}
    assert "2 pending tasks cancelled" in response.content.decode()
    again = client.post(f"/operations/{operation.pk}/cancel/", {"reason": "twice"})
    assert again.status_code == 400
    assert "only open operations can be cancelled" in again.content.decode()


def test_an_operator_retries_an_escalated_host_from_its_page() -> None:
    _, host = escalated_host()
    client = client_for()
    page = client.get(f"/fleet/hosts/{host.hostname}/").content.decode()
    assert "Retry the repair" in page
    assert "Release: fixed by hand" in page

    response = client.post(f"/escalations/{host.hostname}/retry/", {"reason": "reseated"}, follow=True)

    assert Host.objects.get(pk=host.pk).state == HostState.REPAIR
    assert "repair retried as operation" in response.content.decode()
    assert Event.objects.filter(kind="host.escalation_retried", reason="reseated").exists()


def test_a_host_that_is_not_escalated_cannot_be_released() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=1)
    before = database_state()
    response = client_for().post(f"/escalations/{hosts[0].hostname}/release/", {"reason": "fixed"})
    assert response.status_code == 400
    assert "is not escalated (any more)" in response.content.decode()
    assert database_state() == before


@pytest.mark.parametrize("role", NOT_OPERATORS)
def test_viewers_and_service_owners_see_no_buttons_and_their_posts_are_refused(role: str) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="r")
    _, escalated = escalated_host()
    client = client_for(role)

    operation_page = client.get(f"/operations/{operation.pk}/").content.decode()
    host_page = client.get(f"/fleet/hosts/{escalated.hostname}/").content.decode()
    listing = client.get("/operations/").content.decode()
    assert "Cancel operation" not in operation_page
    assert "Retry the repair" not in host_page
    assert "Release: fixed by hand" not in host_page
    assert "Submit an operation" not in listing

    before = database_state()
    posts = [
        ("/operations/new/", reboot_form(f"pool {pool.name}")),
        (f"/operations/{operation.pk}/cancel/", {"reason": "no"}),
        (f"/escalations/{escalated.hostname}/retry/", {"reason": "no"}),
        (f"/escalations/{escalated.hostname}/release/", {"reason": "no"}),
    ]
    for path, data in posts:
        assert client.post(path, data).status_code == 403, path
    assert client.get("/operations/preview/", {"scope": f"pool {pool.name}"}).status_code == 403
    assert database_state() == before


def test_an_operator_releases_a_host_fixed_by_hand_into_verification_not_service() -> None:
    _, host = escalated_host()
    response = client_for().post(f"/escalations/{host.hostname}/release/", {"reason": "new PSU"}, follow=True)

    task = HostTask.objects.get(host=host, operation__reason="fixed by hand, verify before return: new PSU")
    assert task.state == TaskState.VERIFYING
    assert Host.objects.get(pk=host.pk).state == HostState.REPAIR
    assert "verified before it returns to service" in response.content.decode()


@pytest.mark.parametrize("hosts_per_domain", [3, 30])
def test_an_operations_page_reads_the_same_queries_whatever_its_size(
    django_assert_num_queries, hosts_per_domain: int
) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=hosts_per_domain)
    operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")

    # The operation, its counts per state, its pools, a page of tasks with their hosts, its events,
    # its resubmissions.
    with django_assert_num_queries(6):
        detail = operations_pages.operation_detail(operation_id=operation.pk)
        tasks = list(detail.tasks)
    assert len(tasks) == min(2 * hosts_per_domain, operations_pages.TASKS_PER_PAGE)
