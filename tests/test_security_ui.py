"""Who may do what in the browser: every page and every form of the UI against every role (a user
without a role and an anonymous visitor included), and CSRF on every URL that takes a POST.

A refused POST writes nothing: before and after it, the row count and a digest of the contents of
every table of the project's apps are the same (opsplanner/fleet/trains; every state change is
also an event, so an update shows too). The tables drive the tests; a new page or form is one row,
and a URL pattern that is in no table fails `test_every_ui_url_pattern_is_in_the_role_matrix`."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from fleet.services import optout_window_create, reservation_create, service_place
from fleet.services.hosts import host_transition
from opsplanner import clock
from opsplanner.models import Approval
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from simulation import advisor_runs
from tests.builders import make_domain, make_fleet, make_host, make_pool, make_service
from tests.test_security import FAST_HASHER, append_figures, database_state
from tests.trains_builders import make_train, make_user
from trains.services.emergency import emergency_train_request
from trains.services.offboarding import upgrade_offboard
from trains.services.trains import train_pause
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

ANONYMOUS, NO_ROLE = "anonymous", "no_role"
ROLES = (Role.OPERATOR, Role.SERVICE_OWNER, Role.VIEWER, Role.EXECUTOR, NO_ROLE, ANONYMOUS)
READERS = frozenset({Role.OPERATOR, Role.SERVICE_OWNER, Role.VIEWER})
MANAGERS = frozenset({Role.OPERATOR, Role.SERVICE_OWNER})
OPERATORS = frozenset({Role.OPERATOR})
EVERYONE = frozenset(ROLES)
POOL_NAME = "secret-pool-east"  # must never appear on a refusal page


class World:
    """One of everything a page or form acts on. The service owner owns `service` (with a window and
    a reservation); the pending emergency train was requested by `other_operator`, so the operator
    under test may decide it; `spare_pool` has nothing pending, for the emergency form."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {role: make_user(role) for role in Role.ALL}
        self.users[NO_ROLE] = User.objects.create_user(username="no-role-at-all", password="x-pass-123")
        self.other_operator = make_user(Role.OPERATOR)
        self.pool, self.hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2, pool_name=POOL_NAME)
        self.spare_pool, _ = make_fleet(domains=1, hosts_per_domain=2)
        self.service = make_service(owners=[self.users[Role.SERVICE_OWNER]])
        service_place(service=self.service, hosts=self.hosts[:2])
        starts, ends = soon(days=1), soon(days=2)
        self.window = optout_window_create(service=self.service, starts_at=starts, ends_at=ends, reason="training run")
        self.reservation = reservation_create(
            service=self.service, pool=self.pool, min_hosts_in_service=1, starts_at=starts, ends_at=ends, reason="x"
        )
        self.train = make_train(self.pool)
        small_pool = make_pool()
        make_host(make_domain(small_pool))
        self.paused_train = train_pause(
            train_id=make_train(small_pool).pk, reason="holiday freeze", actor=self.other_operator
        )
        self.offboarded = upgrade_create(pool=self.pool, component="bios", version="2.16.0", reason="bios")
        assert upgrade_offboard(upgrade=self.offboarded, reason="bricked two hosts", actor=self.other_operator)
        self.active_upgrade = upgrade_create(pool=self.pool, component="gpu-driver", version="560.35.03", reason="x")
        emergency = emergency_train_request(
            pool=self.pool, component="gpu-driver", version="560.35.03", reason="CVE", actor=self.other_operator
        )
        self.approval = Approval.objects.get(subject_type="trains.train", subject_id=emergency.pk)
        self.operation = operation_submit(kind="reboot", scope=f"hosts: {self.hosts[3].hostname}", reason="x")
        self.escalated = make_host(make_domain(make_pool()))  # failed, then escalated to a human
        for expected, new in (("in_service", "failed"), ("failed", "escalated")):
            host_transition(host_id=self.escalated.pk, expected=expected, new=new, reason="repairs failed")

    def client(self, role: str, **options: Any) -> Client:
        client = Client(**options)
        if role != ANONYMOUS:
            client.force_login(self.users[role])
        return client


def soon(**delta: float) -> dt.datetime:
    return clock.now() + dt.timedelta(**delta)


def local(moment: dt.datetime) -> str:
    """How a datetime-local input sends a time."""
    return moment.strftime("%Y-%m-%dT%H:%M")


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> Iterator[World]:
    """Built once inside a transaction rolled back at the end; each test runs in its own savepoint."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHER), transaction.atomic():
        yield World()
        transaction.set_rollback(True)


@pytest.fixture(autouse=True)
def no_advisor_runs_sent(monkeypatch) -> None:
    monkeypatch.setattr(advisor_runs, "_enqueue", lambda run_id: None)


# --- the tables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    path: str  # formatted with w=the world
    allowed: frozenset[str]
    ok: int = 200


def svc(rest: str = "") -> str:
    return "/fleet/services/{w.service.name}/" + rest


PAGES: list[Page] = [
    Page("/", READERS),
    Page("/gantt/", READERS),
    Page("/events/", READERS),
    Page("/approvals/", OPERATORS),
    Page("/simulations/advisor/", READERS),
    Page("/live/fragments/?page=overview", READERS),
    Page("/metrics", READERS),
    Page("/healthz", EVERYONE),
    Page("/healthz/workers", EVERYONE, ok=503),  # no worker heartbeat in this world
    Page("/login/", EVERYONE),
    Page("/fleet/pools/{w.pool.name}/", READERS),
    Page("/fleet/hosts/{w.hosts[0].hostname}/", READERS),
    Page("/fleet/services/", MANAGERS),
    Page(svc(), MANAGERS),
    Page(svc("optouts/new/"), MANAGERS),
    Page(svc("optouts/{w.window.pk}/edit/"), MANAGERS),
    Page(svc("optouts/{w.window.pk}/cancel/"), MANAGERS),
    Page(svc("reservations/new/"), MANAGERS),
    Page(svc("reservations/{w.reservation.pk}/edit/"), MANAGERS),
    Page(svc("reservations/{w.reservation.pk}/cancel/"), MANAGERS),
    Page("/trains/", READERS),
    Page("/trains/{w.train.pk}/", READERS),
    Page("/trains/upgrades/", READERS),
    Page("/trains/upgrades/{w.offboarded.pk}/", READERS),
    Page("/trains/emergency/new/", OPERATORS),
    Page("/operations/", READERS),
    Page("/operations/{w.operation.pk}/", READERS),
    Page("/operations/new/", OPERATORS),
    Page("/operations/preview/?scope=pool+{w.spare_pool.name}", OPERATORS),
    Page("/escalations/{w.escalated.hostname}/retry/", OPERATORS),
    Page("/trains/new/", OPERATORS),
    Page("/trains/{w.train.pk}/edit/", OPERATORS),
    Page("/trains/upgrades/new/", OPERATORS),
    Page("/trains/upgrades/{w.active_upgrade.pk}/replan/", OPERATORS),
    Page("/trains/upgrades/{w.active_upgrade.pk}/offboard/", OPERATORS),
]


def _window_form(w: World) -> dict[str, str]:
    return {"starts_at": local(soon(days=3)), "ends_at": local(soon(days=4)), "reason": "model launch"}


def _reservation_edit_form(w: World) -> dict[str, str]:
    return {**_window_form(w), "min_hosts_in_service": "1"}


def _reservation_form(w: World) -> dict[str, str]:
    return {**_reservation_edit_form(w), "pool": str(w.pool.pk)}


def _emergency_form(w: World) -> dict[str, str]:
    return {
        "pool": w.spare_pool.name,
        "component": "gpu-driver",
        "version": "560.35.03",
        "scope": "",
        "domains_at_once": "1",
        "visit_estimate_s": "1800",
        "reason": "CVE-2031-0001 in the driver",
    }


def _train_form(w: World) -> dict[str, str]:
    return {
        "pool": w.spare_pool.name,
        "name": "spare-train",
        "cycle_slo_s": "604800",
        "visit_estimate_s": "3600",
        "visit_concurrency": "1",
        "domain_order": "rack-0001",
        "priority": "200",
        "auto_resume_after_s": "",
    }


TRAIN_EDIT_FORM = {"cycle_slo_s": "1209600", "visit_concurrency": "2", "domain_order": "rack-0002\nrack-0001"}


def _upgrade_form(w: World) -> dict[str, str]:
    phases = {"name": "canary", "domain": "rack-0001", "min_successes": "1", "soak_s": "60", "selection": "fixed"}
    return {
        "pool": w.spare_pool.name,
        "component": "gpu-driver",
        "version": "560.35.03",
        "reason": "driver with the NCCL fix",
        "scope": "",
        "max_failures": "2",
        "max_failure_rate": "0.5",
        "hosts_per_visit": "",
        **{f"phase-0-{key}": value for key, value in phases.items()},
        **{f"phase-1-{key}": value for key, value in {"name": "all", "percent": "100", "min_successes": "0"}.items()},
    }


def _operation_form(w: World) -> dict[str, str]:
    scope = f"hosts: {w.hosts[0].hostname}"
    return {"kind": "reboot", "scope": scope, "priority": "100", "needs_drain": "", "reason": "kernel fix"}


LIVE_FORECAST_FORM = {"kind": "live_forecast", "live-pool": POOL_NAME, "live-days": "1", "live-policies": ["rolling"]}
ADVISOR_FORM = {
    "pool_hosts": "120",
    "sizes": "20, 40",
    "interruption_cost": "100",
    "capacity_hour_cost": "1",
    "cycle_slo_hours": "24",
}
REASON = {"reason": "because the role matrix says so"}


@dataclass(frozen=True)
class Form:
    """A POST that succeeds (and writes) for an allowed role."""

    path: str
    data: Callable[[World], dict[str, str]] | dict[str, str]
    allowed: frozenset[str]

    def post(self, client: Client, w: World, **extra: Any) -> HttpResponse:
        data = self.data(w) if callable(self.data) else self.data
        return client.post(self.path.format(w=w), data, **extra)


FORMS: dict[str, Form] = {
    "approve": Form("/approvals/{w.approval.pk}/decide/", {"decision": "approve", **REASON}, OPERATORS),
    "reject": Form("/approvals/{w.approval.pk}/decide/", {"decision": "reject", **REASON}, OPERATORS),
    "advisor run": Form("/simulations/advisor/", ADVISOR_FORM, OPERATORS),
    "live forecast": Form("/simulations/advisor/", LIVE_FORECAST_FORM, OPERATORS),
    "opt-out new": Form(svc("optouts/new/"), _window_form, MANAGERS),
    "opt-out edit": Form(svc("optouts/{w.window.pk}/edit/"), _window_form, MANAGERS),
    "opt-out cancel": Form(svc("optouts/{w.window.pk}/cancel/"), REASON, MANAGERS),
    "reservation new": Form(svc("reservations/new/"), _reservation_form, MANAGERS),
    "reservation edit": Form(svc("reservations/{w.reservation.pk}/edit/"), _reservation_edit_form, MANAGERS),
    "reservation cancel": Form(svc("reservations/{w.reservation.pk}/cancel/"), REASON, MANAGERS),
    "train pause": Form("/trains/{w.train.pk}/pause/", REASON, OPERATORS),
    "train resume": Form("/trains/{w.paused_train.pk}/resume/", REASON, OPERATORS),
    "upgrade re-onboard": Form("/trains/upgrades/{w.offboarded.pk}/reonboard/", REASON, OPERATORS),
    "emergency train": Form("/trains/emergency/new/", _emergency_form, OPERATORS),
    "operation new": Form("/operations/new/", _operation_form, OPERATORS),
    "operation cancel": Form("/operations/{w.operation.pk}/cancel/", REASON, OPERATORS),
    "escalation retry": Form("/escalations/{w.escalated.hostname}/retry/", REASON, OPERATORS),
    "escalation release": Form("/escalations/{w.escalated.hostname}/release/", REASON, OPERATORS),
    "train new": Form("/trains/new/", _train_form, OPERATORS),
    "train edit": Form("/trains/{w.train.pk}/edit/", TRAIN_EDIT_FORM, OPERATORS),
    "upgrade new": Form("/trains/upgrades/new/", _upgrade_form, OPERATORS),
    "upgrade replan": Form("/trains/upgrades/{w.active_upgrade.pk}/replan/", {"priority": "777"}, OPERATORS),
    "upgrade offboard": Form("/trains/upgrades/{w.active_upgrade.pk}/offboard/", REASON, OPERATORS),
}
# URL patterns proven elsewhere: logging in and out (test_security.py, sessions).
EXEMPT = {"logout/"}


# --- the role matrix ------------------------------------------------------------------------------

_tally = {"cases": 0, "denied": 0}


@pytest.fixture(scope="module", autouse=True)
def role_matrix_figures() -> Iterator[None]:
    """The results table's line, written once every case of the matrix passed."""
    yield
    total = len(ROLES) * (len(PAGES) + len(FORMS))
    if _tally["cases"] == total:
        append_figures(surface="role matrix ui", cases=total, denied_as_expected=_tally["denied"])


def assert_refused(response: HttpResponse, role: str, path: str) -> None:
    if role == ANONYMOUS:
        if path.startswith("/metrics"):
            assert response.status_code == 401
        else:
            assert response.status_code == 302
            assert response["Location"].startswith("/login/?next=")
    else:
        assert response.status_code == 403
    assert POOL_NAME not in response.content.decode(errors="replace")


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("page", PAGES, ids=[p.path for p in PAGES])
def test_each_role_gets_each_page_only_if_the_matrix_allows_it(world: World, page: Page, role: str) -> None:
    path = page.path.format(w=world)
    response = world.client(role).get(path)
    if role in page.allowed:
        assert response.status_code == page.ok, response.content[:300]
    else:
        assert_refused(response, role, path)
        _tally["denied"] += 1
    _tally["cases"] += 1


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", list(FORMS))
def test_each_role_may_post_each_form_only_if_the_matrix_allows_it_and_a_refusal_writes_nothing(
    world: World, name: str, role: str
) -> None:
    form = FORMS[name]
    before = database_state()
    response = form.post(world.client(role), world)
    if role in form.allowed:
        assert response.status_code == 302, response.content[:500]
        assert not response["Location"].startswith("/login/")
        assert database_state() != before, "an allowed POST that wrote nothing does not prove the form works"
    else:
        assert_refused(response, role, form.path)
        assert database_state() == before
        _tally["denied"] += 1
    _tally["cases"] += 1


def _ui_patterns(patterns: list[Any] | None = None, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    """Every URL pattern of the UI (the API and the admin have their own proofs)."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if route.startswith(("api/", "admin/")):
            continue
        if isinstance(pattern, URLResolver):
            yield from _ui_patterns(pattern.url_patterns, route)
        else:
            yield route, pattern


def route_of(path: str) -> str:
    return resolve(path.split("?")[0]).route


def test_every_ui_url_pattern_is_in_the_role_matrix(world: World) -> None:
    covered = {route_of(p.path.format(w=world)) for p in PAGES} | {
        route_of(f.path.format(w=world)) for f in FORMS.values()
    }
    routes = {route for route, _ in _ui_patterns()}
    assert len(routes) >= 30  # the enumeration itself works
    assert routes - covered - EXEMPT == set(), "add these URL patterns to PAGES or FORMS"


# --- CSRF -----------------------------------------------------------------------------------------


def accepted_methods(pattern: URLPattern) -> set[str] | None:
    """The methods a view takes: from require_http_methods' list (found in the decorators'
    closures) or a class-based view's handlers; None when the view takes any method."""
    view_class = getattr(pattern.callback, "view_class", None)
    if view_class is not None:
        return {m.upper() for m in view_class.http_method_names if hasattr(view_class, m) and m != "options"}
    function: Any = pattern.callback
    while function is not None:
        for cell in function.__closure__ or ():
            value = cell.cell_contents
            if isinstance(value, list | tuple) and value and all(isinstance(m, str) and m.isupper() for m in value):
                return set(value)
        function = getattr(function, "__wrapped__", None)
    return None


POST_PATTERNS = sorted(
    route for route, pattern in _ui_patterns() if (methods := accepted_methods(pattern)) is None or "POST" in methods
)
# Every form of FORMS, login and logout, and the read pages that take any method (events, gantt, host).
MIN_POST_PATTERNS = 17


def test_the_enumeration_finds_every_form_and_login_and_logout(world: World) -> None:
    assert len(POST_PATTERNS) >= MIN_POST_PATTERNS, POST_PATTERNS
    assert {"login/", "logout/"} | {route_of(f.path.format(w=world)) for f in FORMS.values()} <= set(POST_PATTERNS)


def _path_for(route: str, w: World) -> tuple[str, Form | None]:
    """A concrete path of the route (and its form, when it is one)."""
    for form in FORMS.values():
        path = form.path.format(w=w)
        if route_of(path) == route:
            return path, form
    for page in PAGES:
        path = page.path.format(w=w).split("?")[0]
        if route_of(path) == route:
            return path, None
    return "/" + route, None


def csrf_client(w: World) -> Client:
    return w.client(Role.OPERATOR, enforce_csrf_checks=True)


@pytest.mark.parametrize("route", POST_PATTERNS)
def test_a_post_without_a_csrf_token_is_refused_and_writes_nothing(world: World, route: str) -> None:
    path, form = _path_for(route, world)
    client = csrf_client(world)
    before = database_state()
    response = form.post(client, world) if form else client.post(path, {})
    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert database_state() == before
    assert client.get("/").status_code == 200  # still logged in: not even logout got through


@pytest.mark.parametrize("name", list(FORMS))
def test_the_same_form_with_the_csrf_token_goes_through(world: World, name: str) -> None:
    """The control: the refusals above are the CSRF check's, not the forms'."""
    client = csrf_client(world)
    token = secrets.token_hex(16)  # a 32-character secret; Django also accepts it unmasked
    client.cookies[settings.CSRF_COOKIE_NAME] = token
    before = database_state()
    response = FORMS[name].post(client, world, headers={"X-CSRFToken": token})
    assert response.status_code == 302, response.content[:300]
    assert database_state() != before
