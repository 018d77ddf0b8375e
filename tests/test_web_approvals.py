"""The approvals queue and the emergency train form, through Django's test client on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.urls import reverse

from console.views.approvals import approvals_live
from fleet.models import ComponentVersion, Pool
from fleet.services import installed_version_set
from opsplanner import clock
from opsplanner.models import Approval, ApprovalState, Event
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.trains_builders import make_user, nic_firmware
from trains.models import Train, TrainState, Upgrade, UpgradeState
from trains.services.emergency import emergency_train_request

pytestmark = pytest.mark.django_db
HTMX = {"HX-Request": "true"}
SCOPE = "hosts running nic-firmware below 22.4"


def nic_fleet(pool_name: str = "ai-east") -> Pool:
    """Two racks of three hosts; four run nic-firmware 22.1 (three in rack 1, one in rack 2)."""
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, pool_name=pool_name, planned_buffer_hosts=1)
    nic = nic_firmware()
    for host in hosts:
        installed_version_set(host=host, version=nic["22.1"] if host in hosts[:4] else nic["22.4"])
    return pool


def request_emergency(requester: object, pool: Pool) -> Approval:
    train = emergency_train_request(
        pool=pool,
        component="nic-firmware",
        version="22.4",
        reason="CVE-2026-1234 in the NIC firmware",
        scope=SCOPE,
        domains_at_once=2,
        actor=requester,
    )
    return Approval.objects.get(subject_type="trains.train", subject_id=train.pk)


def client_for(user: object) -> Client:
    client = Client()
    client.force_login(user)
    return client


def pending_article(html: str, approval: Approval) -> str:
    match = re.search(rf'<article [^>]*id="pending-{approval.pk}".*?</article>', html, re.S)
    assert match, f"request #{approval.pk} is not in the pending list"
    return match.group(0)


def decide(client: Client, approval: Approval, decision: str, reason: str, **headers: str) -> object:
    url = reverse("approval-decide", args=[approval.pk])
    return client.post(url, {"decision": decision, "reason": reason}, headers=headers)


def snapshot(approval: Approval) -> tuple[object, ...]:
    """What a refused decision must leave untouched."""
    approval.refresh_from_db()
    train = Train.objects.get(pk=approval.subject_id)
    return approval.state, approval.decider, train.state, Event.objects.count()


def test_the_queue_lists_a_pending_request_with_what_approving_it_would_do() -> None:
    pool = nic_fleet()
    approval = request_emergency(make_user(), pool)
    response = client_for(make_user()).get(reverse("approvals"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-live-page="approvals"' in html
    article = pending_article(html, approval)
    assert "Emergency train" in article
    assert approval.requester in article
    assert "CVE-2026-1234 in the NIC firmware" in article
    assert "ago" in article
    assert "expires in" in article
    assert SCOPE in article
    assert "nic-firmware 22.4" in article
    assert "<dt>Hosts</dt><dd>4 hosts</dd>" in article
    assert "<dt>Domains</dt><dd>2 domains</dd>" in article
    assert "<dt>At once</dt><dd>2 domains at a time</dd>" in article
    assert "never fewer than" in article  # the hard floor
    assert "<dt>In service now</dt><dd>6 hosts</dd>" in article
    assert "ignores opt-out windows" in article
    assert 'name="decision" value="approve"' in article
    assert 'name="decision" value="reject"' in article
    assert 'name="reason"' in article
    assert "required" in article
    assert 'name="csrfmiddlewaretoken"' in article  # the no-JavaScript form posts too


def test_the_requester_sees_their_own_request_without_the_buttons() -> None:
    requester = make_user()
    approval = request_emergency(requester, nic_fleet())
    article = pending_article(client_for(requester).get(reverse("approvals")).content.decode(), approval)
    assert "waiting for another operator" in article
    assert 'name="decision"' not in article
    assert "<form" not in article


def test_another_operator_approves_with_a_reason_and_the_train_starts() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    approver = make_user()
    response = decide(client_for(approver), approval, "approve", "CVE confirmed by security", **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="pending-{approval.pk}"' not in html
    assert re.search(rf'<tr id="decided-{approval.pk}" class="outcome-approved">', html)
    assert "CVE confirmed by security" in html
    assert f"You approved request #{approval.pk}" in html
    assert 'id="approvals-notice" hx-swap-oob="innerHTML"' in html
    approval.refresh_from_db()
    assert (approval.state, approval.decided_by, approval.decision_reason) == (
        ApprovalState.APPROVED,
        approver,
        "CVE confirmed by security",
    )
    assert Train.objects.get(pk=approval.subject_id).state == TrainState.RUNNING
    event = Event.objects.get(kind="approval.approved", subject_id=approval.pk)
    assert (event.actor, event.reason) == (approver.username, "CVE confirmed by security")
    assert Event.objects.filter(kind="train.approved", subject_id=approval.subject_id).exists()


def test_without_javascript_a_decision_posts_and_redirects_back_with_a_message() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    client = client_for(make_user())
    response = decide(client, approval, "approve", "go ahead")
    assert response.status_code == 302
    assert response["Location"] == reverse("approvals")
    page = client.get(response["Location"]).content.decode()
    assert f"You approved request #{approval.pk}" in page
    assert Train.objects.get(pk=approval.subject_id).state == TrainState.RUNNING


def test_a_rejection_cancels_the_train_and_its_upgrade() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    response = decide(client_for(make_user()), approval, "reject", "wait for the vendor's fix", **HTMX)
    assert re.search(rf'<tr id="decided-{approval.pk}" class="outcome-rejected">', response.content.decode())
    train = Train.objects.get(pk=approval.subject_id)
    assert train.state == TrainState.CANCELLED
    assert Upgrade.objects.get(pk=train.upgrade_id).state == UpgradeState.CANCELLED
    assert Event.objects.get(kind="approval.rejected", subject_id=approval.pk).reason == "wait for the vendor's fix"


@pytest.mark.parametrize("headers", [HTMX, {}], ids=["htmx", "plain-form"])
def test_a_decision_without_a_reason_is_refused_with_a_message_and_changes_nothing(headers: dict[str, str]) -> None:
    approval = request_emergency(make_user(), nic_fleet())
    before = snapshot(approval)
    client = client_for(make_user())
    response = decide(client, approval, "approve", "   ", **headers)
    html = (client.get(reverse("approvals")) if response.status_code == 302 else response).content.decode()
    assert "Nothing was decided: Give a reason for the decision." in html
    assert snapshot(approval) == before
    assert snapshot(approval)[2] == TrainState.AWAITING_APPROVAL


def test_the_requester_posting_a_decision_directly_is_refused_by_the_two_person_rule() -> None:
    requester = make_user()
    approval = request_emergency(requester, nic_fleet())
    before = snapshot(approval)
    response = decide(client_for(requester), approval, "approve", "it is urgent", **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "a different operator must decide it (two-person rule)" in html
    assert 'class="notice error"' in html
    assert snapshot(approval) == before


def test_an_expired_request_shows_no_buttons_and_cannot_be_approved() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    Approval.objects.filter(pk=approval.pk).update(expires_at=clock.now() + dt.timedelta(microseconds=1))
    before = snapshot(approval)
    client = client_for(make_user())
    article = pending_article(client.get(reverse("approvals")).content.decode(), approval)
    assert "expired at" in article
    assert 'name="decision"' not in article
    response = decide(client, approval, "approve", "late but fine", **HTMX)
    assert f"Approval #{approval.pk} expired at" in response.content.decode()
    assert snapshot(approval) == before  # the refusal rolled back; the scheduler expires it


def test_a_request_already_decided_cannot_be_decided_again() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    decide(client_for(make_user()), approval, "approve", "fine", **HTMX)
    before = snapshot(approval)
    response = decide(client_for(make_user()), approval, "reject", "too late", **HTMX)
    assert f"Approval #{approval.pk} is already approved." in response.content.decode()
    assert snapshot(approval) == before


def test_a_decision_is_approve_or_reject_and_nothing_else() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    before = snapshot(approval)
    response = decide(client_for(make_user()), approval, "maybe", "not sure", **HTMX)
    assert "choose approve or reject" in response.content.decode()
    assert snapshot(approval) == before


def test_deciding_takes_a_post_and_a_csrf_token() -> None:
    approval = request_emergency(make_user(), nic_fleet())
    approver = make_user()
    assert client_for(approver).get(reverse("approval-decide", args=[approval.pk])).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(approver)
    assert decide(strict, approval, "approve", "no token", **HTMX).status_code == 403
    assert Approval.objects.get(pk=approval.pk).state == ApprovalState.PENDING


def test_the_live_renderer_answers_only_approvers_and_only_for_the_approvals_group() -> None:
    pool = nic_fleet()
    requester = make_user()
    approval = request_emergency(requester, pool)
    assert approvals_live(user=make_user(Role.VIEWER), group=None, params={}) == ""
    assert approvals_live(user=make_user(), group=f"pool-{pool.pk}", params={}) == ""
    mine = approvals_live(user=requester, group=None, params={})
    assert "waiting for another operator" in pending_article(mine, approval)
    assert 'name="decision"' not in mine


def test_without_a_websocket_the_page_polls_the_same_queue_fragment() -> None:
    requester = make_user()
    approval = request_emergency(requester, nic_fleet())
    url = reverse("live-fragments") + "?page=approvals&params=%7B%7D"
    polled = client_for(requester).get(url).content.decode()
    assert '<div id="approvals-queue" hx-swap-oob="innerHTML">' in polled
    assert "waiting for another operator" in pending_article(polled, approval)
    assert client_for(make_user(Role.VIEWER)).get(url).status_code == 404


@pytest.mark.parametrize("role", [Role.VIEWER, Role.SERVICE_OWNER])
def test_viewers_and_service_owners_are_refused_with_the_reason(role: str) -> None:
    approval = request_emergency(make_user(), nic_fleet())
    before = snapshot(approval)
    client = client_for(make_user(role))
    queue = client.get(reverse("approvals"))
    assert queue.status_code == 403
    assert "Your role does not allow you to decide approvals." in queue.content.decode()
    refused = decide(client, approval, "approve", "why not", **HTMX)
    assert refused.status_code == 403
    assert snapshot(approval) == before
    form = client.get(reverse("trains:emergency-new"))
    assert form.status_code == 403
    assert "Your role does not allow you to run operations, trains and upgrades." in form.content.decode()
    assert client.post(reverse("trains:emergency-new"), {"reason": "x"}).status_code == 403
    assert Train.objects.count() == 1


def test_anonymous_visitors_are_sent_to_log_in() -> None:
    for url in (reverse("approvals"), reverse("trains:emergency-new")):
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def form_data(pool: Pool, overrides: dict[str, object] | None = None) -> dict[str, object]:
    data: dict[str, object] = {
        "pool": pool.name,
        "component": "nic-firmware",
        "version": "22.4",
        "scope": SCOPE,
        "domains_at_once": 2,
        "visit_estimate_s": 900,
        "reason": "CVE-2026-1234 in the NIC firmware",
    }
    data.update(overrides or {})
    return data


def test_the_emergency_form_offers_the_pools_and_the_catalogue() -> None:
    pool = nic_fleet()
    html = client_for(make_user()).get(reverse("trains:emergency-new")).content.decode()
    assert f'<option value="{pool.name}">' in html
    assert '<option value="nic-firmware">' in html
    for name in ("component", "version", "scope", "domains_at_once", "visit_estimate_s", "reason"):
        assert f'name="{name}"' in html


def test_the_emergency_form_creates_a_train_and_a_request_waiting_for_a_second_operator() -> None:
    pool = nic_fleet()
    requester = make_user()
    client = client_for(requester)
    response = client.post(reverse("trains:emergency-new"), form_data(pool))
    assert response.status_code == 302
    assert response["Location"] == reverse("approvals")
    train = Train.objects.get(pool=pool)
    assert (train.emergency, train.state, train.visit_concurrency, train.visit_estimate_s) == (
        True,
        TrainState.AWAITING_APPROVAL,
        2,
        900,
    )
    assert train.created_by == requester
    approval = Approval.objects.get(subject_type="trains.train", subject_id=train.pk)
    assert (approval.state, approval.requested_by, approval.reason) == (
        ApprovalState.PENDING,
        requester,
        "CVE-2026-1234 in the NIC firmware",
    )
    assert approval.summary["scope"] == SCOPE
    assert approval.summary["hosts"] == 4
    page = client.get(response["Location"]).content.decode()
    assert f"Emergency train {train.name} requested for pool {pool.name}" in page
    assert "waits for a second operator" in page
    assert "waiting for another operator" in pending_article(page, approval)


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"component": "nic-fw"}, "component", "There is no component named 'nic-fw'"),
        ({"version": "99.9"}, "version", "nic-firmware has no version '99.9' in the catalogue"),
        ({"scope": "the broken ones"}, "scope", "Cannot read the scope"),
        ({"scope": "hosts running nic-firmware below 22.1"}, "scope", "The scope matches no host."),
        ({"scope": "pool nowhere"}, "scope", "There is no pool named 'nowhere'"),
        ({"reason": "   "}, "reason", "This field is required."),
        ({"domains_at_once": 0}, "domains_at_once", "greater than or equal to 1"),
        ({"visit_estimate_s": "soon"}, "visit_estimate_s", "Enter a whole number."),
        ({"pool": "atlantis"}, "pool", "There is no such pool"),
    ],
    ids=[
        "unknown-component",
        "unknown-version",
        "unreadable-scope",
        "empty-scope",
        "unknown-pool-in-scope",
        "no-reason",
        "no-domains",
        "estimate-not-a-number",
        "unknown-pool",
    ],
)
def test_form_errors_are_shown_next_to_their_field_and_nothing_is_written(
    overrides: dict[str, object], field: str, message: str
) -> None:
    pool = nic_fleet()
    counts = (Train.objects.count(), Approval.objects.count(), Upgrade.objects.count(), Event.objects.count())
    response = client_for(make_user()).post(reverse("trains:emergency-new"), form_data(pool, overrides))
    assert response.status_code == 400
    html = response.content.decode()
    block = re.search(rf'<div class="field invalid" data-field="{field}">.*?</div>', html, re.S)
    assert block, f"no error next to {field}"
    assert message in block.group(0).replace("&#x27;", "'")
    assert (Train.objects.count(), Approval.objects.count(), Upgrade.objects.count(), Event.objects.count()) == counts


def test_a_withdrawn_version_is_refused_with_the_reason_next_to_the_version() -> None:
    pool = nic_fleet()
    ComponentVersion.objects.filter(component__name="nic-firmware", version="22.4").update(
        withdrawn_at=clock.now(), withdrawn_reason="bricks the NIC", withdrawn_by="operator"
    )
    response = client_for(make_user()).post(reverse("trains:emergency-new"), form_data(pool))
    block = re.search(r'<div class="field invalid" data-field="version">.*?</div>', response.content.decode(), re.S)
    assert block
    assert "withdrawn: bricks the NIC" in block.group(0)
    assert not Train.objects.exists()
