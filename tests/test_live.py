"""The live websocket through the real ASGI application (auth middleware, origin check, Redis
channel layer): who may connect, what each user receives, and that pushes follow commits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.test import Client

from config.asgi import application
from console import consumers
from console.consumers import RECONNECT, REFUSED
from fleet.models import HostState
from fleet.services import host_transition
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1")


def session_cookie(user: object) -> tuple[bytes, bytes]:
    return logged_in_browser(user)[1]


def logged_in_browser(user: object) -> tuple[Client, tuple[bytes, bytes]]:
    """A logged-in test client and its session cookie as a websocket header."""
    client = Client()
    client.force_login(user)
    value = client.cookies[settings.SESSION_COOKIE_NAME].value
    return client, (b"cookie", f"{settings.SESSION_COOKIE_NAME}={value}".encode())


def socket(*headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, *headers])


@asynccontextmanager
async def connected(*headers: tuple[bytes, bytes]) -> AsyncIterator[WebsocketCommunicator]:
    """An accepted socket, always disconnected afterwards so its consumer finishes inside the loop."""
    communicator = socket(*headers)
    accepted, code = await communicator.connect(timeout=5)
    try:
        assert accepted, f"the socket was refused ({code})"
        yield communicator
    finally:
        await communicator.disconnect()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Each test is one coroutine on one event loop; database work inside it goes through
    sync_to_async (thread-sensitive: the test's own thread and connection)."""
    async_to_sync(scenario)()


def test_an_unauthenticated_socket_is_refused() -> None:
    async def scenario() -> None:
        refused = socket()
        connected, code = await refused.connect(timeout=5)
        await refused.disconnect()  # let the application instance finish before the loop closes
        assert not connected
        assert code == REFUSED

    run(scenario)


def test_an_executor_cannot_watch_the_fleet() -> None:
    cookie = session_cookie(make_user(Role.EXECUTOR))

    async def scenario() -> None:
        refused = socket(cookie)
        connected, code = await refused.connect(timeout=5)
        await refused.disconnect()
        assert not connected
        assert code == REFUSED

    run(scenario)


def test_a_viewer_receives_the_changed_pool_row_after_the_commit_and_not_before() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=3, pool_name="ai-east")
    cookie = session_cookie(make_user(Role.VIEWER))

    async def scenario() -> None:
        async with connected(cookie) as viewer:

            def fail_a_host_and_look_before_committing() -> None:
                with transaction.atomic():
                    host_transition(
                        host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="p"
                    )
                    assert async_to_sync(viewer.receive_nothing)(timeout=0.5)  # not announced before the commit

            await sync_to_async(fail_a_host_and_look_before_committing)()
            html = await viewer.receive_from(timeout=5)
            assert 'id="pool-ai-east"' in html
            assert 'hx-swap-oob="true"' in html
            assert '<td class="num in-service">2</td>' in html

    run(scenario)


def test_a_rolled_back_change_is_never_announced() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="web-west")
    cookie = session_cookie(make_user(Role.VIEWER))

    def change_then_roll_back() -> None:
        with transaction.atomic():
            host_transition(host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="x")
            transaction.set_rollback(True)

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await sync_to_async(change_then_roll_back)()
            assert await viewer.receive_nothing(timeout=1)

    run(scenario)


def test_only_operators_receive_the_approvals_queue() -> None:
    from opsplanner.services.approvals import approval_request

    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operator, viewer = make_user(Role.OPERATOR), make_user(Role.VIEWER)
    operator_cookie, viewer_cookie = session_cookie(operator), session_cookie(viewer)

    def request_approval() -> None:
        approval_request(
            kind="large_operation", subject_type="fleet.pool", subject_id=pool.pk, reason="big", actor=operator
        )

    async def scenario() -> None:
        async with connected(operator_cookie) as operator_socket, connected(viewer_cookie) as viewer_socket:
            await sync_to_async(request_approval)()
            assert 'id="approvals-pending"' in await operator_socket.receive_from(timeout=5)
            assert await viewer_socket.receive_nothing(timeout=1)

    run(scenario)


def test_a_subscription_to_something_that_does_not_exist_is_refused_with_the_reason() -> None:
    cookie = session_cookie(make_user(Role.VIEWER))

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await viewer.send_to(text_data=json.dumps({"subscribe": "pool", "id": 999999}))
            assert "no pool #999999" in json.loads(await viewer.receive_from(timeout=5))["error"]
            await viewer.send_to(text_data=json.dumps({"subscribe": "train"}))
            assert "subscribe" in json.loads(await viewer.receive_from(timeout=5))["error"]

    run(scenario)


def test_a_page_that_says_what_it_shows_gets_a_resync_then_only_its_own_rows() -> None:
    east, east_hosts = make_fleet(domains=2, hosts_per_domain=2, pool_name="gantt-east")
    _, west_hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="gantt-west")
    cookie = session_cookie(make_user(Role.VIEWER))

    def fail(host: object) -> None:
        host_transition(host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await viewer.send_to(text_data=json.dumps({"watch": "gantt", "params": {"pool": east.name}}))
            resync = await viewer.receive_from(timeout=5)
            assert '<div id="gantt-chart" hx-swap-oob="innerHTML">' in resync
            assert f'id="gantt-row-domain-{east_hosts[0].domain_id}"' in resync

            await sync_to_async(fail)(west_hosts[0])  # a pool this page does not show
            assert await viewer.receive_nothing(timeout=1)

            await sync_to_async(fail)(east_hosts[0])
            rows = await viewer.receive_from(timeout=5)
            assert f'hx-swap-oob="innerHTML:#gantt-row-domain-{east_hosts[0].domain_id}"' in rows
            assert 'id="pool-gantt-east"' not in rows  # the overview's row is not this page's

    run(scenario)


def test_a_reconnected_page_is_resynced_with_what_changed_while_it_was_away() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=3, pool_name="away")
    cookie = session_cookie(make_user(Role.VIEWER))

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await viewer.send_to(text_data=json.dumps({"watch": "overview", "params": {}}))
            assert '<td class="num in-service">3</td>' in await viewer.receive_from(timeout=5)
        await sync_to_async(host_transition)(
            host_id=hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="while away"
        )
        async with connected(cookie) as viewer:
            await viewer.send_to(text_data=json.dumps({"watch": "overview", "params": {}}))
            resync = await viewer.receive_from(timeout=5)
            assert '<div id="fleet-overview" hx-swap-oob="innerHTML">' in resync
            assert '<td class="num in-service">2</td>' in resync

    run(scenario)


def test_a_page_the_user_may_not_see_or_that_does_not_exist_cannot_be_watched() -> None:
    cookie = session_cookie(make_user(Role.VIEWER))

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await viewer.send_to(text_data=json.dumps({"watch": "approvals", "params": {}}))
            assert "no live page 'approvals' you may watch" in json.loads(await viewer.receive_from(timeout=5))["error"]
            await viewer.send_to(text_data=json.dumps({"watch": "nonsense"}))
            assert "no live page 'nonsense'" in json.loads(await viewer.receive_from(timeout=5))["error"]

    run(scenario)


def test_a_rolled_back_change_is_not_announced_by_the_next_commit_either() -> None:
    _, east_hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="east-rb")
    _, west_hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="west-rb")
    cookie = session_cookie(make_user(Role.VIEWER))

    def roll_back_east_then_commit_west() -> None:
        with transaction.atomic():
            host_transition(host_id=east_hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="x")
            transaction.set_rollback(True)
        host_transition(host_id=west_hosts[0].pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="y")

    async def scenario() -> None:
        async with connected(cookie) as viewer:
            await sync_to_async(roll_back_east_then_commit_west)()
            assert 'id="pool-west-rb"' in await viewer.receive_from(timeout=5)
            assert await viewer.receive_nothing(timeout=1)  # nothing for east, whose change never happened

    run(scenario)


@pytest.mark.parametrize("how", ["logged out", "deactivated", "password changed", "lost every role"])
def test_an_open_socket_is_closed_for_good_when_its_session_ends_or_its_user_may_no_longer_read(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumers, "REVALIDATE_SECONDS", 0.0)
    _, hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="revoked")
    user = make_user(Role.OPERATOR)
    browser, cookie = logged_in_browser(user)

    def end_it() -> None:
        if how == "logged out":
            assert browser.post("/logout/").status_code == 302
        elif how == "deactivated":
            User.objects.filter(pk=user.pk).update(is_active=False)
        elif how == "password changed":
            user.set_password("another-pass-456")
            user.save()
        else:
            user.groups.clear()

    async def scenario() -> None:
        async with connected(cookie) as operator_socket:
            await sync_to_async(fail)(hosts[0])
            assert 'id="pool-revoked"' in await operator_socket.receive_from(timeout=5)  # allowed so far
            await sync_to_async(end_it)()
            await sync_to_async(fail)(hosts[1])
            closing = await operator_socket.receive_output(timeout=5)
            assert closing == {"type": "websocket.close", "code": REFUSED}  # no fragment first
            assert await operator_socket.receive_nothing(timeout=0.5)

    run(scenario)


def test_an_open_socket_whose_rights_changed_is_told_to_reconnect_and_then_gets_only_the_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opsplanner.services.approvals import approval_request

    monkeypatch.setattr(consumers, "REVALIDATE_SECONDS", 0.0)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, pool_name="demoted")
    user = make_user(Role.OPERATOR)
    cookie = session_cookie(user)

    def demote() -> None:
        user.groups.set([Group.objects.get_or_create(name=Role.VIEWER)[0]])

    def request_approval() -> None:
        approval_request(
            kind="large_operation", subject_type="fleet.pool", subject_id=pool.pk, reason="big", actor=user
        )

    async def scenario() -> None:
        async with connected(cookie) as old_socket:
            await sync_to_async(demote)()
            await sync_to_async(fail)(hosts[0])
            assert await old_socket.receive_output(timeout=5) == {"type": "websocket.close", "code": RECONNECT}
        async with connected(cookie) as new_socket:  # what the page does on 1012
            await sync_to_async(request_approval)()
            assert await new_socket.receive_nothing(timeout=1)  # a viewer's socket has no approvals queue
            await sync_to_async(fail)(hosts[1])
            assert 'id="pool-demoted"' in await new_socket.receive_from(timeout=5)

    run(scenario)


def fail(host: object) -> None:
    host_transition(host_id=host.pk, expected=HostState.IN_SERVICE, new=HostState.FAILED, reason="psu")
