"""Security proofs outside the page/form matrix (tests/test_security_ui.py):

- sessions and tokens: a session expires, logging out (or changing the password) ends it for good,
  a deleted token is refused at once, a deactivated user is refused by the API, the UI and the
  websocket; the API's session authentication insists on CSRF;
- approvals: nobody decides their own request, and nobody decides an expired one, for every kind
  of request, through the API and the UI, approving or rejecting;
- security headers on pages, API answers and refusals, and the cookies' flags;
- the audit trail cannot be edited through the API or the admin, not even by a superuser;
- the websocket: each role against each subscription kind.

Proven elsewhere and not repeated: an expired or logged-out token (test_api_roles.py,
test_api_limits.py), the development secret refused with DEBUG off (test_env_settings.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from config.asgi import application
from console.consumers import REFUSED
from opsplanner import clock
from opsplanner.models import Approval, ApprovalState, Event, Operation
from opsplanner.roles import Role
from opsplanner.services.approvals import approvals_expire
from tests.api_helpers import token_client
from tests.builders import make_fleet
from tests.trains_builders import make_user
from trains.services.emergency import emergency_train_request
from trains.services.offboarding import upgrade_offboard
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.upgrades import upgrade_create

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "var" / "reliability" / "fuzz.jsonl"
FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]
PASSWORD = "x-pass-123"  # what tests.trains_builders.make_user gives every user
REASON = {"reason": "because"}
ANONYMOUS, NO_ROLE = "anonymous", "no_role"


def append_figures(**figures: object) -> None:
    """One line of the reliability results table (var/reliability/fuzz.jsonl)."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with FIGURES.open("a") as out:
        out.write(json.dumps(figures) + "\n")


# Row count and content digest of one table; a write of any kind changes one or the other.
TABLE_STATE = "(SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM {} t)"


def database_state() -> tuple[object, ...]:
    """The state of every table of the project's apps, to prove that a refusal wrote nothing."""
    tables = [
        connection.ops.quote_name(model._meta.db_table)
        for app in ("fleet", "opsplanner", "trains")
        for model in apps.get_app_config(app).get_models()
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(TABLE_STATE.format(table) for table in tables))
        return tuple(cursor.fetchone())


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = FAST_HASHER


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def session_api(cookie: str) -> APIClient:
    client = APIClient()
    client.cookies[settings.SESSION_COOKIE_NAME] = cookie
    return client


# --- sessions and tokens --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_login_session_lasts_the_configured_age_and_is_refused_once_expired() -> None:
    user = make_user(Role.VIEWER)
    client = Client()
    response = client.post("/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302
    cookie = response.cookies[settings.SESSION_COOKIE_NAME]
    assert int(cookie["max-age"]) == settings.SESSION_COOKIE_AGE == 8 * 3600
    assert cookie["httponly"]
    assert client.get("/").status_code == 200
    Session.objects.update(expire_date=timezone.now() - dt.timedelta(seconds=1))
    assert client.get("/")["Location"] == "/login/?next=/"
    assert session_api(cookie.value).get("/api/pools/").status_code == 401


@pytest.mark.django_db
def test_after_logout_the_old_session_cookie_is_refused_by_the_pages_and_the_api() -> None:
    client = logged_in(make_user(Role.OPERATOR))
    old_cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert client.post("/logout/").status_code == 302
    replay = Client()
    replay.cookies[settings.SESSION_COOKIE_NAME] = old_cookie
    assert replay.get("/")["Location"] == "/login/?next=/"
    assert replay.get("/approvals/").status_code == 302
    assert session_api(old_cookie).get("/api/pools/").status_code == 401


@pytest.mark.django_db
def test_logging_out_takes_a_post_so_a_link_or_image_cannot_log_anyone_out() -> None:
    client = logged_in(make_user(Role.VIEWER))
    assert client.get("/logout/").status_code == 405
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_a_password_change_ends_the_users_other_sessions() -> None:
    user = make_user(Role.OPERATOR)
    elsewhere = logged_in(user)
    assert elsewhere.get("/").status_code == 200
    user.set_password("another-pass-456")
    user.save()
    assert elsewhere.get("/").status_code == 302


@pytest.mark.django_db
def test_a_deleted_token_is_refused_at_once_and_the_users_other_tokens_still_work() -> None:
    user = make_user(Role.OPERATOR)
    revoked, kept = token_client(user), token_client(user)
    assert revoked.get("/api/pools/").status_code == 200
    AuthToken.objects.filter(pk=AuthToken.objects.filter(user=user).order_by("created").first().pk).delete()
    refused = revoked.get("/api/pools/")
    assert (refused.status_code, refused.json()["code"]) == (401, "authentication_failed")
    assert kept.get("/api/pools/").status_code == 200


@pytest.mark.django_db
def test_a_deactivated_user_is_refused_by_the_api_and_the_pages_whatever_they_hold() -> None:
    user = make_user(Role.OPERATOR)
    token, browser = token_client(user), logged_in(user)
    session = browser.cookies[settings.SESSION_COOKIE_NAME].value
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert token.get("/api/pools/").status_code == 401
    posted = token.post("/api/operations/", {"kind": "reboot", "scope": f"pool {pool.name}", **REASON}, format="json")
    assert posted.status_code == 401
    assert not Operation.objects.exists()
    assert browser.get("/")["Location"] == "/login/?next=/"
    assert session_api(session).get("/api/pools/").status_code == 401
    login = Client().post("/login/", {"username": user.username, "password": PASSWORD})
    assert login.status_code == 200  # the form again: an inactive account cannot log in


@pytest.mark.django_db
def test_the_api_with_a_session_cookie_needs_a_csrf_token_to_write() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(make_user(Role.OPERATOR))
    body = json.dumps({"kind": "reboot", "scope": f"pool {pool.name}", **REASON})
    response = browser.post("/api/operations/", body, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not Operation.objects.exists()
    assert browser.get("/api/pools/").status_code == 200  # reading needs no token


# --- approvals: the two-person rule and expiry ----------------------------------------------------


def emergency_request(requester: User) -> Approval:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    train = emergency_train_request(
        pool=pool, component="gpu-driver", version="560.35.03", reason="CVE", actor=requester
    )
    return Approval.objects.get(subject_type="trains.train", subject_id=train.pk)


def reonboard_request(requester: User) -> Approval:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="bios")
    assert upgrade_offboard(upgrade=upgrade, reason="bricked hosts", actor="scheduler")
    return upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="fixed in 2.16.1 firmware", actor=requester)


REQUESTS: dict[str, Callable[[User], Approval]] = {
    "emergency train": emergency_request,
    "re-onboard": reonboard_request,
}


def decide_through_api(user: User, approval: Approval, decision: str) -> tuple[int, str]:
    response = token_client(user).post(f"/api/approvals/{approval.pk}/{decision}/", REASON, format="json")
    body = response.json()
    return response.status_code, f"{body.get('code')}: {body.get('detail')}"


def decide_through_ui(user: User, approval: Approval, decision: str) -> tuple[int, str]:
    response = logged_in(user).post(
        f"/approvals/{approval.pk}/decide/", {"decision": decision, **REASON}, headers={"HX-Request": "true"}
    )
    return response.status_code, response.content.decode()


SURFACES = {"api": decide_through_api, "ui": decide_through_ui}
# What each surface answers: (status, words in the answer).
SELF_APPROVAL = {"api": (403, "self_approval"), "ui": (200, "a different operator must decide it (two-person rule)")}
EXPIRED = {"api": (409, "expired"), "ui": (200, "expired at")}


def unchanged(approval: Approval) -> tuple[object, ...]:
    approval.refresh_from_db()
    return approval.state, approval.decided_by_id, Event.objects.count()


@pytest.mark.django_db
@pytest.mark.parametrize("decision", ["approve", "reject"])
@pytest.mark.parametrize("surface", list(SURFACES))
@pytest.mark.parametrize("kind", list(REQUESTS))
@pytest.mark.parametrize("requester_kind", ["operator", "superuser"])
def test_nobody_decides_their_own_request_through_any_surface(
    requester_kind: str, kind: str, surface: str, decision: str
) -> None:
    requester = (
        User.objects.create_superuser(username="root", password=PASSWORD)
        if requester_kind == "superuser"
        else make_user(Role.OPERATOR)
    )
    approval = REQUESTS[kind](requester)
    before = unchanged(approval)
    status, answer = SURFACES[surface](requester, approval, decision)
    assert (status, SELF_APPROVAL[surface][1] in answer) == (SELF_APPROVAL[surface][0], True), answer[:300]
    assert unchanged(approval) == before
    assert before[0] == ApprovalState.PENDING


@pytest.mark.django_db
@pytest.mark.parametrize("decision", ["approve", "reject"])
@pytest.mark.parametrize("surface", list(SURFACES))
@pytest.mark.parametrize("kind", list(REQUESTS))
def test_nobody_decides_a_request_past_its_expiry_and_the_sweep_expires_it(
    kind: str, surface: str, decision: str
) -> None:
    approval = REQUESTS[kind](make_user(Role.OPERATOR))
    before = unchanged(approval)
    with clock.use_clock(lambda: approval.expires_at + dt.timedelta(minutes=1)):
        status, answer = SURFACES[surface](make_user(Role.OPERATOR), approval, decision)
        assert (status, EXPIRED[surface][1] in answer) == (EXPIRED[surface][0], True), answer[:300]
        assert unchanged(approval) == before  # the refusal rolled back; the sweep expires it
        assert approvals_expire() == 1
    approval.refresh_from_db()
    assert approval.state == ApprovalState.EXPIRED
    assert approval.decided_by_id is None


@pytest.mark.django_db
def test_a_request_decided_just_before_its_expiry_is_decided() -> None:
    approval = emergency_request(make_user(Role.OPERATOR))
    with clock.use_clock(lambda: approval.expires_at - dt.timedelta(seconds=1)):
        assert decide_through_api(make_user(Role.OPERATOR), approval, "approve")[0] == 200
    approval.refresh_from_db()
    assert approval.state == ApprovalState.APPROVED


# --- headers and cookies --------------------------------------------------------------------------

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
# (who asks, path, the status expected): pages, API answers, refusals and errors.
HEADER_CASES = [
    (Role.OPERATOR, "/", 200),
    (ANONYMOUS, "/login/", 200),
    (ANONYMOUS, "/", 302),
    (Role.VIEWER, "/approvals/", 403),
    (Role.VIEWER, "/no-such-page/", 404),
    (Role.VIEWER, "/metrics", 200),
    (ANONYMOUS, "/healthz", 200),
    ("token", "/api/pools/", 200),
    ("token", "/api/events/", 200),
    ("token", "/api/docs/", 200),
    ("token", "/api/pools/999999/", 404),
    (ANONYMOUS, "/api/pools/", 401),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("who", "path", "status"), HEADER_CASES, ids=[f"{w} {p}" for w, p, _ in HEADER_CASES])
def test_every_answer_carries_the_security_headers(who: str, path: str, status: int) -> None:
    if who == "token":
        client: Any = token_client(make_user(Role.VIEWER))
    elif who == ANONYMOUS:
        client = Client()
    else:
        client = logged_in(make_user(who))
    response = client.get(path)
    assert response.status_code == status
    expected = dict(SECURITY_HEADERS)
    if path == "/api/docs/":
        # drf-spectacular's Swagger UI relaxes the opener policy on purpose (its OAuth2 pop-up).
        expected["Cross-Origin-Opener-Policy"] = "unsafe-none"
    for header, value in expected.items():
        assert response.headers.get(header) == value, header


@pytest.mark.django_db
def test_an_oversized_request_refused_before_the_views_also_carries_the_security_headers(settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = token_client(make_user(Role.OPERATOR)).post("/api/operations/", {"reason": "x" * 2000}, format="json")
    assert response.status_code == 413
    for header, value in SECURITY_HEADERS.items():
        assert response.headers.get(header) == value, header


@pytest.mark.django_db
def test_the_session_cookie_is_http_only_and_same_site_and_the_csrf_cookie_same_site() -> None:
    user = make_user(Role.VIEWER)
    client = Client()
    client.get("/login/")
    csrf = client.cookies[settings.CSRF_COOKIE_NAME]
    response = client.post("/login/", {"username": user.username, "password": PASSWORD})
    session = response.cookies[settings.SESSION_COOKIE_NAME]
    assert session["httponly"]
    assert session["samesite"] == "Lax"
    assert csrf["samesite"] == "Lax"


def test_in_production_cookies_are_secure_and_no_host_is_allowed_by_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DEBUG", "ALLOWED_HOSTS"}}
    env.update(DEBUG="0", SECRET_KEY="a-real-secret-" + "x" * 40, OPSPLANNER_VAR_DIR=str(tmp_path))
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    expression = (
        "settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SESSION_COOKIE_HTTPONLY, "
        "settings.X_FRAME_OPTIONS, settings.SECURE_CONTENT_TYPE_NOSNIFF, settings.ALLOWED_HOSTS, settings.DEBUG"
    )
    code = f"import django; django.setup(); from django.conf import settings; print(repr(({expression})))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(True, True, True, 'DENY', True, [], False)"


# --- the audit trail ------------------------------------------------------------------------------

EVENT_WRITES = [
    ("post", "/api/events/"),
    ("put", "/api/events/"),
    ("patch", "/api/events/"),
    ("delete", "/api/events/"),
    ("post", "/api/events/{pk}/"),
    ("put", "/api/events/{pk}/"),
    ("patch", "/api/events/{pk}/"),
    ("delete", "/api/events/{pk}/"),
]


def superuser() -> User:
    return User.objects.create_superuser(username="root", password=PASSWORD)


def audit_trail() -> list[tuple[object, ...]]:
    return list(Event.objects.order_by("id").values_list("id", "kind", "actor", "reason", "created_at", "data"))


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["operator", "superuser"])
@pytest.mark.parametrize(("method", "path"), EVENT_WRITES, ids=[f"{m} {p}" for m, p in EVENT_WRITES])
def test_the_api_has_no_way_to_write_the_audit_trail(method: str, path: str, who: str) -> None:
    make_fleet(domains=1, hosts_per_domain=1)
    event = Event.objects.order_by("id").first()
    before = audit_trail()
    client = token_client(superuser() if who == "superuser" else make_user(Role.OPERATOR))
    body = {"kind": "forged", "actor": "nobody", "reason": "rewriting history", "subject_type": "x"}
    response = getattr(client, method)(path.format(pk=event.pk), body, format="json")
    assert (response.status_code, response.json()["code"]) == (405, "method_not_allowed")
    assert audit_trail() == before


def staff_with_every_permission() -> User:
    """A staff operator granted every permission on events and approvals: the admin still refuses."""
    user = make_user(Role.OPERATOR)
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="opsplanner"))
    return user


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["superuser", "staff operator"])
@pytest.mark.parametrize("model", ["event", "approval"])
def test_the_admin_refuses_to_add_change_or_delete_events_and_approvals(model: str, who: str) -> None:
    emergency_request(make_user(Role.OPERATOR))
    event, approval = Event.objects.order_by("id").first(), Approval.objects.get()
    pk = event.pk if model == "event" else approval.pk
    client = logged_in(superuser() if who == "superuser" else staff_with_every_permission())
    base = f"/admin/opsplanner/{model}/"
    before = audit_trail(), list(Approval.objects.values_list("id", "state", "decided_by_id", "expires_at"))
    assert client.get(base).status_code == 200  # readable
    assert client.get(f"{base}{pk}/change/").status_code == 200  # shown read-only
    assert client.get(f"{base}add/").status_code == 403
    assert client.post(f"{base}add/", {"kind": "forged"}).status_code == 403
    assert client.post(f"{base}{pk}/change/", {"kind": "forged", "state": "approved"}).status_code == 403
    assert client.post(f"{base}{pk}/delete/", {"post": "yes"}).status_code == 403
    bulk = client.post(base, {"action": "delete_selected", "_selected_action": [pk], "post": "yes"})
    assert bulk.status_code in (200, 302)
    assert "delete_selected" not in client.get(base).content.decode()  # no bulk delete offered
    assert (audit_trail(), list(Approval.objects.values_list("id", "state", "decided_by_id", "expires_at"))) == before


# --- the websocket --------------------------------------------------------------------------------

ORIGIN = (b"origin", b"http://127.0.0.1")
WS_READERS = frozenset({Role.OPERATOR, Role.SERVICE_OWNER, Role.VIEWER})
WS_ROLES = (Role.OPERATOR, Role.SERVICE_OWNER, Role.VIEWER, Role.EXECUTOR, NO_ROLE, ANONYMOUS)
# Each subscription kind (params formatted with the pool and a host) and the roles that may have it.
WS_KINDS: dict[str, tuple[dict[str, Any], frozenset[str]]] = {
    "overview": ({"watch": "overview", "params": {}}, WS_READERS),
    "gantt": ({"watch": "gantt", "params": {}}, WS_READERS),
    "events": ({"watch": "events", "params": {}}, WS_READERS),
    "trains": ({"watch": "trains", "params": {}}, WS_READERS),
    "upgrades": ({"watch": "trains", "params": {"view": "upgrades"}}, WS_READERS),
    "host": ({"watch": "host", "params": {"host": "{host}"}}, WS_READERS),
    "approvals": ({"watch": "approvals", "params": {}}, frozenset({Role.OPERATOR})),
    "pool group": ({"subscribe": "pool", "id": "{pool}"}, WS_READERS),
}


def cookie_header(client: Client) -> tuple[bytes, bytes]:
    return (b"cookie", f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode())


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async_to_sync(scenario)()


async def try_socket(headers: list[tuple[bytes, bytes]]) -> tuple[WebsocketCommunicator, bool, int | None]:
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=[ORIGIN, *headers])
    accepted, code = await communicator.connect(timeout=5)
    return communicator, accepted, code


def message_for(kind: str, pool_id: int, host_id: int) -> str:
    text = json.dumps(WS_KINDS[kind][0])
    return text.replace('"{pool}"', str(pool_id)).replace("{host}", str(host_id))


_ws_tally = {"cases": 0, "denied": 0}


@pytest.fixture(scope="module")
def websocket_matrix_figures() -> Iterator[None]:
    yield
    total = len(WS_ROLES) * len(WS_KINDS)
    if _ws_tally["cases"] == total:
        append_figures(surface="role matrix websocket", cases=total, denied_as_expected=_ws_tally["denied"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("role", WS_ROLES)
def test_each_role_gets_each_websocket_subscription_only_if_the_matrix_allows_it(
    role: str, websocket_matrix_figures: None
) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    if role == ANONYMOUS:
        headers: list[tuple[bytes, bytes]] = []
    else:
        user = User.objects.create_user(username="no-role", password=PASSWORD) if role == NO_ROLE else make_user(role)
        headers = [cookie_header(logged_in(user))]

    async def scenario() -> None:
        communicator, accepted, code = await try_socket(headers)
        try:
            if role not in WS_READERS:  # refused at the handshake: no subscription of any kind can be made
                assert (accepted, code) == (False, REFUSED)
                assert not any(role in allowed for _, allowed in WS_KINDS.values())
                _ws_tally["denied"] += len(WS_KINDS)
                _ws_tally["cases"] += len(WS_KINDS)
                return
            assert accepted
            for kind, (_, allowed) in WS_KINDS.items():
                await communicator.send_to(text_data=message_for(kind, pool.pk, hosts[0].pk))
                answer = await communicator.receive_from(timeout=5)
                assert answer.startswith('{"error"') == (role not in allowed), f"{kind}: {answer[:200]}"
                assert await communicator.receive_nothing(timeout=0.1)
                _ws_tally["denied"] += role not in allowed
                _ws_tally["cases"] += 1
        finally:
            await communicator.disconnect()

    run(scenario)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["deactivated", "logged out", "password changed"])
def test_a_socket_is_refused_to_a_deactivated_user_and_to_an_ended_session(how: str) -> None:
    make_fleet(domains=1, hosts_per_domain=1)
    user = make_user(Role.OPERATOR)
    browser = logged_in(user)
    headers = [cookie_header(browser)]

    async def connects() -> bool:
        communicator, accepted, _ = await try_socket(headers)
        await communicator.disconnect()
        return accepted

    assert async_to_sync(connects)()
    if how == "deactivated":
        User.objects.filter(pk=user.pk).update(is_active=False)
    elif how == "logged out":
        browser.post("/logout/")
    else:
        user.set_password("another-pass-456")
        user.save()
    assert not async_to_sync(connects)()
