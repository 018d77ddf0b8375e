"""The host page and the event log."""

from __future__ import annotations

import pytest

from console.views import events as events_view
from fleet.models import HostState
from fleet.services import host_transition, installed_version_set, service_place
from opsplanner.models import Event, OperationKind
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet, make_service
from tests.driving import drive, instant_simulator
from tests.trains_builders import make_user, nic_firmware

pytestmark = pytest.mark.django_db


def test_the_host_page_shows_versions_services_its_gantt_row_and_its_events(client) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    host = hosts[0]
    installed_version_set(host=host, version=nic_firmware()["22.1"])
    service_place(service=make_service(name="search"), hosts=[host])
    operation_submit(kind=OperationKind.REBOOT, scope=f"hosts: {host.hostname}", reason="kernel", actor="test")
    drive(pool)
    client.force_login(make_user(Role.VIEWER))

    page = client.get(f"/fleet/hosts/{host.hostname}/").content.decode()

    assert "nic-firmware" in page
    assert "22.1" in page
    assert "search (1 running jobs)" in page
    assert f'id="gantt-row-host-{host.pk}"' in page
    assert "task task-done kind-reboot" in page
    assert "task.state_changed" in page
    assert "Nobody holds it." in page


def test_the_host_page_says_who_holds_the_host_and_why_other_work_waits(client) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4)
    host = hosts[0]
    first = operation_submit(kind=OperationKind.REBOOT, scope=f"hosts: {host.hostname}", reason="a", actor="t")
    from opsplanner.services.tick import pool_tick

    pool_tick(pool_id=pool.pk)
    operation_submit(kind=OperationKind.REBOOT, scope=f"hosts: {host.hostname}", reason="b", actor="t")
    pool_tick(pool_id=pool.pk)
    client.force_login(make_user(Role.VIEWER))

    page = client.get(f"/fleet/hosts/{host.hostname}/").content.decode()

    assert f"Held by operation #{first.pk}" in page
    assert "held by operation" in page.lower()


def test_an_unknown_host_is_not_found(client) -> None:
    client.force_login(make_user(Role.VIEWER))

    assert client.get("/fleet/hosts/no-such-host/").status_code == 404


def test_the_event_log_filters_by_kind_prefix_and_pool(client) -> None:
    _east, east_hosts = make_fleet(domains=1, hosts_per_domain=1, pool_name="east")
    west, west_hosts = make_fleet(domains=1, hosts_per_domain=1, pool_name="west")
    for host in (east_hosts[0], west_hosts[0]):
        host_transition(host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")
    client.force_login(make_user(Role.VIEWER))

    page = client.get(f"/events/?kind=host.&pool={west.pk}").content.decode()

    assert f'<a href="?host={west_hosts[0].pk}">' in page
    assert f'<a href="?host={east_hosts[0].pk}">' not in page


def test_the_event_log_pages_by_event_id(client, monkeypatch) -> None:
    monkeypatch.setattr(events_view, "PAGE_SIZE", 3)
    _, hosts = make_fleet(domains=1, hosts_per_domain=4)
    for host in hosts:
        host_transition(host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")
    ids = list(Event.objects.filter(kind__startswith="host.").order_by("-id").values_list("id", flat=True))
    client.force_login(make_user(Role.VIEWER))

    first = client.get("/events/?kind=host.").content.decode()
    second = client.get(f"/events/?kind=host.&before={ids[2]}").content.decode()

    assert f"before={ids[2]}" in first
    assert f'<td class="num">{ids[3]}</td>' in second
    assert f'<td class="num">{ids[2]}</td>' not in second


@pytest.mark.parametrize(
    ("query", "message"),
    [("since=last-tuesday", "Enter a valid date/time"), ("pool=x", "Enter a number"), ("before=abc", "whole number")],
)
def test_the_event_log_refuses_bad_filters_with_a_message(client, query: str, message: str) -> None:
    client.force_login(make_user(Role.VIEWER))

    response = client.get(f"/events/?{query}")

    assert response.status_code == 400
    assert message in response.content.decode()


def test_no_template_has_a_comment_that_django_would_print() -> None:
    """Django's {# #} comments end at the line's end; a multi-line one is printed on the page."""
    from pathlib import Path

    offenders = [
        f"{path}:{number}"
        for path in Path("templates").rglob("*.html")
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if "{#" in line and "#}" not in line
    ]
    assert not offenders, f"use {{% comment %}} for these: {offenders}"


def test_without_a_shared_channel_layer_pages_poll_their_live_fragments_instead(client, settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _, hosts = make_fleet(domains=1, hosts_per_domain=3, pool_name="embedded")
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/").content.decode()
    host_transition(host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")
    fragments = client.get("/live/fragments/", {"page": "overview", "params": "{}"}).content.decode()

    assert 'data-live-poll="/live/fragments/"' in page
    assert "ws-connect" not in page
    assert '<div id="fleet-overview" hx-swap-oob="innerHTML">' in fragments
    assert '<td class="num in-service">2</td>' in fragments


def test_with_redis_pages_open_the_live_socket(client) -> None:
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/").content.decode()

    assert 'ws-connect="/ws/live/"' in page
    assert "data-live-poll" not in page


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [
        ({"page": "overview", "params": "[1]"}, 400, "params must be a JSON object"),
        ({"page": "overview", "params": "{"}, 400, "params must be a JSON object"),
        ({"page": "nonsense"}, 404, "no live page 'nonsense'"),
        ({"page": "approvals"}, 404, "no live page 'approvals' you may watch"),
    ],
)
def test_polled_fragments_refuse_bad_or_forbidden_pages_with_a_message(client, query, status, message) -> None:
    client.force_login(make_user(Role.VIEWER))

    response = client.get("/live/fragments/", query)

    assert response.status_code == status
    assert message in response.content.decode()


def test_the_host_page_tells_the_live_socket_which_host_it_shows(client) -> None:
    import html
    import json
    import re

    _, hosts = make_fleet(domains=1, hosts_per_domain=1)
    client.force_login(make_user(Role.VIEWER))

    page = client.get(f"/fleet/hosts/{hosts[0].hostname}/").content.decode()

    attribute = re.search(r'data-live-params="([^"]*)"', page).group(1)
    assert json.loads(html.unescape(attribute)) == {"host": str(hosts[0].pk)}
