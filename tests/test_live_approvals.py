"""The approvals queue over the live websocket, through the real ASGI application: a resync on
every watch, the queue pushed after a request commits, each user's own view of it, and a pushed
decision form that still posts (CSRF from the page's header, not from the fragment)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.urls import reverse

from config.asgi import application
from fleet.services import installed_version_set
from opsplanner.models import Approval, ApprovalState
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.trains_builders import make_user, nic_firmware
from trains.models import Train, TrainState
from trains.services.emergency import emergency_train_request

pytestmark = pytest.mark.django_db(transaction=True)
ORIGIN = (b"origin", b"http://127.0.0.1")
WATCH = json.dumps({"watch": "approvals", "params": {}})


def session_cookie(user: object) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode())


@asynccontextmanager
async def watching(user_cookie: tuple[bytes, bytes]) -> AsyncIterator[tuple[WebsocketCommunicator, str]]:
    """A socket that said it shows the approvals page, with the resync it got; always disconnected
    afterwards so its consumer finishes inside the loop."""
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, user_cookie])
    accepted, code = await communicator.connect(timeout=5)
    try:
        assert accepted, f"the socket was refused ({code})"
        await communicator.send_to(text_data=WATCH)
        yield communicator, await communicator.receive_from(timeout=5)
    finally:
        await communicator.disconnect()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async_to_sync(scenario)()


def request_emergency(requester: object) -> Train:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=1)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"])
    return emergency_train_request(
        pool=pool, component="nic-firmware", version="22.4", reason="CVE in the NIC", domains_at_once=2, actor=requester
    )


async def receive_queue_with(communicator: WebsocketCommunicator, approval_id: int) -> str:
    """The first pushed queue that shows the request (a push may also come from an earlier commit)."""
    while True:
        html = await communicator.receive_from(timeout=5)
        if f'id="pending-{approval_id}"' in html:
            return html


def pending_article(html: str, approval_id: int) -> str:
    match = re.search(rf'<article [^>]*id="pending-{approval_id}".*?</article>', html, re.S)
    assert match, f"request #{approval_id} is not in the pushed queue"
    return match.group(0)


def test_a_request_reaches_every_operator_watching_the_queue_and_the_requester_gets_no_buttons() -> None:
    requester, approver = make_user(), make_user()
    requester_cookie, approver_cookie = session_cookie(requester), session_cookie(approver)
    pushed: dict[str, str] = {}
    approval_ids: list[int] = []

    async def scenario() -> None:
        async with watching(requester_cookie) as (mine, _), watching(approver_cookie) as (theirs, resync):
            assert '<div id="approvals-queue" hx-swap-oob="innerHTML">' in resync
            assert "No request is waiting for a decision." in resync
            assert 'id="approvals-pending" class="badge" hx-swap-oob="true">0<' in resync
            train = await sync_to_async(request_emergency)(requester)
            approval_id = await sync_to_async(
                lambda: Approval.objects.get(subject_type="trains.train", subject_id=train.pk).pk
            )()
            approval_ids.append(approval_id)
            pushed["requester"] = await receive_queue_with(mine, approval_id)
            pushed["approver"] = await receive_queue_with(theirs, approval_id)

    run(scenario)
    approval_id = approval_ids[0]
    for html in (pushed["requester"], pushed["approver"]):
        assert html.count('<div id="approvals-queue" hx-swap-oob="innerHTML">') == 1
        assert ">1</span>" in html  # the badge
    requester_view = pending_article(pushed["requester"], approval_id)
    assert "waiting for another operator" in requester_view
    assert 'name="decision"' not in requester_view
    approver_view = pending_article(pushed["approver"], approval_id)
    assert 'name="decision" value="approve"' in approver_view
    assert "CVE in the NIC" in approver_view


def test_a_viewer_who_asks_for_the_approvals_page_gets_no_queue() -> None:
    viewer_cookie = session_cookie(make_user(Role.VIEWER))
    requester = make_user()

    async def scenario() -> None:
        async with watching(viewer_cookie) as (viewer, resync):
            assert "approvals-queue" not in resync
            assert "there is no live page 'approvals' you may watch" in json.loads(resync)["error"]
            await sync_to_async(request_emergency)(requester)
            assert await viewer.receive_nothing(timeout=1)

    run(scenario)


def test_a_decision_form_pushed_over_the_websocket_submits_with_the_pages_csrf_header() -> None:
    requester, approver = make_user(), make_user()
    train = request_emergency(requester)
    approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
    approver_cookie = session_cookie(approver)
    pushed: list[str] = []

    async def scenario() -> None:
        async with watching(approver_cookie) as (_, resync):
            pushed.append(resync)

    run(scenario)
    article = pending_article(pushed[0], approval.pk)
    assert "csrfmiddlewaretoken" not in article  # rendered without a request: no token of its own
    action = re.search(r'hx-post="([^"]+)"', article).group(1)
    assert action == reverse("approval-decide", args=[approval.pk])
    # The browser: the page it loaded carries the token in the body's hx-headers; HTMX sends it.
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(approver)
    page = browser.get(reverse("approvals")).content.decode()
    token = re.search(r"hx-headers='\{\"X-CSRFToken\": \"([^\"]+)\"\}'", page).group(1)
    form = {"decision": "approve", "reason": "confirmed"}
    assert browser.post(action, form, headers={"HX-Request": "true"}).status_code == 403  # without it: refused
    response = browser.post(action, form, headers={"HX-Request": "true", "X-CSRFToken": token})
    assert response.status_code == 200
    assert Approval.objects.get(pk=approval.pk).state == ApprovalState.APPROVED
    assert Train.objects.get(pk=train.pk).state == TrainState.RUNNING
