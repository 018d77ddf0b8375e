"""Who may call what in the REST API: a role matrix over every endpoint, and the life of a token
(login, who am I, logout, expiry). Whose objects a role may act on (a service owner's windows, an
executor's work items, an approval's requester) is in test_api_roles_scope.py, on the same world."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import override_settings
from knox.models import AuthToken
from rest_framework.test import APIClient

from fleet.models import CapacityReservation, CompatibilityRule, Host, OptOutWindow
from fleet.services import optout_window_create, reservation_create, service_place
from fleet.services.catalogue import component_version_withdraw
from fleet.services.host_changes import host_retire
from fleet.services.inventory import component_version_create
from opsplanner import clock
from opsplanner.models import Approval, Event, HostTask
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_items_claim
from tests.api_helpers import token_client
from tests.builders import make_domain, make_fleet, make_host, make_pool, make_service
from tests.trains_builders import make_train, make_user
from trains.models import Cycle, Visit
from trains.services.emergency import emergency_train_request
from trains.services.offboarding import upgrade_offboard
from trains.services.trains import train_pause
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

ANONYMOUS = "anonymous"
ROLES = (Role.OPERATOR, Role.SERVICE_OWNER, Role.VIEWER, Role.EXECUTOR, ANONYMOUS)
PASSWORD = "x-pass-123"  # what tests.trains_builders.make_user gives every user
FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REASON = {"reason": "because the role matrix says so"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    """Users are made by the dozen here; the production hasher would take most of the run."""
    settings.PASSWORD_HASHERS = FAST_HASHER


class World:
    """A small fleet with one of everything an endpoint can be called on, and a user per role.

    The service owner owns `owned_service` (with a window and a reservation); another owner owns
    `their_service` (with theirs). The approval was requested by `other_operator`, so the operator
    under test may decide it."""

    def __init__(self) -> None:
        self.users = {role: make_user(role) for role in ROLES if role != ANONYMOUS}
        self.other_operator = make_user(Role.OPERATOR)
        self.other_owner = make_user(Role.SERVICE_OWNER)
        self.pool, self.hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2)
        self.owned_service = make_service(owners=[self.users[Role.SERVICE_OWNER]])
        self.their_service = make_service(owners=[self.other_owner])
        service_place(service=self.owned_service, hosts=self.hosts[:2])
        service_place(service=self.their_service, hosts=self.hosts[2:])
        self.window = self._window(self.owned_service)
        self.their_window = self._window(self.their_service)
        self.reservation = self._reservation(self.owned_service)
        self.their_reservation = self._reservation(self.their_service)
        # An open reboot, drained and run by external adapters; the tick makes drain items ready and
        # the executor has claimed one of them (attempt 1).
        self.operation = operation_submit(
            kind="reboot", scope=f"pool {self.pool.name}", reason="kernel fix", drainer="external", executor="external"
        )
        pool_tick(pool_id=self.pool.pk)
        (self.work_item,) = work_items_claim(worker=self.users[Role.EXECUTOR].username, limit=1)
        self.host_task = HostTask.objects.filter(operation=self.operation).order_by("pk").first()
        self.train = make_train(self.pool)
        cycle = Cycle.objects.create(train=self.train, number=1, deadline_at=clock.now() + dt.timedelta(days=7))
        self.visit = Visit.objects.create(train=self.train, cycle=cycle, domain=self.hosts[0].domain, position=0)
        self.paused_train = train_pause(
            train_id=make_train(self._small_pool()).pk, reason="holiday freeze", actor=self.other_operator
        )
        self.pool_without_train = self._small_pool()
        self.upgrade = upgrade_create(pool=self.pool, component="gpu-driver", version="560.35.03", reason="refresh")
        self.offboarded_upgrade = upgrade_create(pool=self.pool, component="bios", version="2.16.0", reason="bios")
        assert upgrade_offboard(upgrade=self.offboarded_upgrade, reason="bricked two hosts", actor=self.other_operator)
        emergency = emergency_train_request(
            pool=self.pool, component="gpu-driver", version="560.35.03", reason="CVE", actor=self.other_operator
        )
        self.approval = Approval.objects.get(subject_type="trains.train", subject_id=emergency.pk)
        self.component = self.upgrade.component_version.component
        hand_withdrawn = component_version_create(component=self.component, version="555.1")  # to release
        component_version_withdraw(version_id=hand_withdrawn.pk, reason="hangs under load", actor=self.other_operator)
        self.rule = CompatibilityRule.objects.order_by("pk").first()
        # Hosts no operation names, to retire and report on; and a retired one to restore.
        self.free_host = Host.objects.get(pool=self.pool_without_train)
        self.retired_host = make_host(make_domain(self.pool_without_train))
        host_retire(hostname=self.retired_host.hostname, reason="left the fleet", actor=self.other_operator)
        self.event = Event.objects.order_by("pk").first()

    def _window(self, service) -> OptOutWindow:
        return optout_window_create(
            service=service, starts_at=soon(days=1), ends_at=soon(days=2), reason="quarter-end training run"
        )

    def _reservation(self, service) -> CapacityReservation:
        return reservation_create(
            service=service,
            pool=self.pool,
            min_hosts_in_service=1,
            starts_at=soon(days=1),
            ends_at=soon(days=2),
            reason="launch",
        )

    @staticmethod
    def _small_pool():
        pool = make_pool()
        make_host(make_domain(pool))
        return pool

    def client(self, role: str) -> APIClient:
        return APIClient() if role == ANONYMOUS else token_client(self.users[role])


def soon(**delta: float) -> dt.datetime:
    return clock.now() + dt.timedelta(**delta)


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> Iterator[World]:
    """Built once for the module inside a transaction that is rolled back at its end; each test runs
    in a savepoint inside it (pytest-django's own), so what one test changes the next never sees."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHER), transaction.atomic():
        yield World()
        transaction.set_rollback(True)


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # formatted with w=the world
    body: Callable[[World], dict[str, Any]] | dict[str, Any] | None = None
    headers: dict[str, str] | None = None

    def send(self, client: APIClient, world: World) -> Any:
        body = self.body(world) if callable(self.body) else self.body
        return getattr(client, self.method)(
            self.path.format(w=world), body or {}, format="json", headers=self.headers or {}
        )


def _statuses(operator: int, service_owner: int, viewer: int, executor: int, anonymous: int = 401) -> dict[str, int]:
    return dict(zip(ROLES, (operator, service_owner, viewer, executor, anonymous), strict=True))


READ = _statuses(200, 200, 200, 403)
READ_WORK = _statuses(200, 200, 200, 200)
OPERATE = _statuses(200, 403, 403, 403)
OPERATE_CREATE = _statuses(201, 403, 403, 403)
OWN_SERVICE = _statuses(200, 200, 403, 403)
OWN_SERVICE_CREATE = _statuses(201, 201, 403, 403)
OPERATE_NO_CONTENT = _statuses(204, 403, 403, 403)
OPERATE_OR_EXECUTE = _statuses(200, 403, 403, 200)
EXECUTE = _statuses(403, 403, 403, 200)
NOT_A_METHOD = _statuses(405, 403, 403, 403)
ANY_USER = _statuses(200, 200, 200, 200)
ANY_USER_NO_CONTENT = _statuses(204, 204, 204, 204)


def window_body(w: World) -> dict[str, Any]:
    return {
        "service": w.owned_service.pk,
        "starts_at": soon(days=3).isoformat(),
        "ends_at": soon(days=4).isoformat(),
        "reason": "model launch",
    }


def reservation_body(w: World) -> dict[str, Any]:
    return {**window_body(w), "pool": w.pool.pk, "min_hosts_in_service": 1}


def host_row(w: World) -> dict[str, Any]:
    return {"hostname": "roles-new-h1", "pool": w.pool.name, "domain": "rack-0001", "sku": "cpu-2s"}


RULE = {
    "job_facing_component": "cuda-runtime",
    "job_facing_version": "12.4.1",
    "lower_component": "bios",
    "max_version": "9",
}
POOL = {"name": "roles-pool", "workload_class": "web", "planned_buffer_hosts": 1, "failure_buffer_hosts": 1}


def fleet_file_body(w: World) -> dict[str, Any]:
    """A fleet file declaring one new pool with one host (a dry run: nothing is written)."""
    pool = {"name": "roles-fleet", "workload_class": "web", "planned_buffer": 1, "failure_buffer": 1}
    host = {"hostname": "roles-fleet-h1", "pool": "roles-fleet", "domain": "rack-1", "sku": "cpu-2s"}
    return {"pools": [{**pool, "domains": ["rack-1"]}], "hosts": [host]}


# Every endpoint (and a few methods it does not have) with the status each role gets. Allowed calls
# are valid requests, so "allowed" means the call succeeded, not only that it got past the check.
ENDPOINTS: list[tuple[str, Call, dict[str, int]]] = [
    ("GET /pools/", Call("get", "/api/pools/"), READ),
    ("GET /pools/{id}/", Call("get", "/api/pools/{w.pool.pk}/"), READ),
    ("GET /pools/{id}/forecast/", Call("get", "/api/pools/{w.pool.pk}/forecast/"), READ),
    ("POST /pools/", Call("post", "/api/pools/", POOL), OPERATE_CREATE),
    ("PATCH /pools/{id}/", Call("patch", "/api/pools/{w.pool.pk}/", {"description": "east"}), OPERATE),
    ("DELETE /pools/{id}/", Call("delete", "/api/pools/{w.pool.pk}/"), NOT_A_METHOD),
    ("GET /domains/", Call("get", "/api/domains/"), READ),
    ("GET /domains/{id}/", Call("get", "/api/domains/{w.hosts[0].domain_id}/"), READ),
    (
        "POST /domains/",
        Call("post", "/api/domains/", lambda w: {"pool": w.pool.pk, "name": "rack-new"}),
        OPERATE_CREATE,
    ),
    ("PATCH /domains/{id}/", Call("patch", "/api/domains/{w.hosts[0].domain_id}/", {"position": 9}), OPERATE),
    ("GET /hosts/", Call("get", "/api/hosts/"), READ),
    ("GET /hosts/{id}/", Call("get", "/api/hosts/{w.hosts[0].pk}/"), READ),
    ("DELETE /hosts/{id}/", Call("delete", "/api/hosts/{w.hosts[0].pk}/"), NOT_A_METHOD),
    ("PUT /hosts/{id}/", Call("put", "/api/hosts/{w.hosts[0].pk}/", {"sku": "x"}), NOT_A_METHOD),
    ("POST /hosts/", Call("post", "/api/hosts/", host_row), OPERATE_CREATE),
    ("PATCH /hosts/{id}/", Call("patch", "/api/hosts/{w.free_host.hostname}/", {"sku": "cpu-4s"}), OPERATE),
    ("POST /hosts/bulk/", Call("post", "/api/hosts/bulk/", lambda w: {"hosts": [host_row(w)]}), OPERATE_CREATE),
    ("POST /hosts/{id}/retire/", Call("post", "/api/hosts/{w.free_host.hostname}/retire/", REASON), OPERATE),
    ("POST /hosts/{id}/restore/", Call("post", "/api/hosts/{w.retired_host.hostname}/restore/", REASON), OPERATE),
    (
        "POST /hosts/{id}/versions/",
        Call("post", "/api/hosts/{w.free_host.hostname}/versions/", {"versions": {"bios": "2.14.0"}}),
        OPERATE_OR_EXECUTE,
    ),
    ("GET /components/", Call("get", "/api/components/"), READ),
    ("GET /components/{id}/", Call("get", "/api/components/{w.component.pk}/"), READ),
    ("POST /components/", Call("post", "/api/components/", {"name": "psu-fw", "layer": "lower_level"}), OPERATE_CREATE),
    ("PATCH /components/{id}/", Call("patch", "/api/components/{w.component.pk}/", {"needs_reboot": False}), OPERATE),
    (
        "POST /components/{id}/versions/",
        Call("post", "/api/components/{w.component.pk}/versions/", {"version": "570.1"}),
        OPERATE_CREATE,
    ),
    (
        "POST /components/{id}/versions/{version}/withdraw/",
        Call("post", "/api/components/{w.component.pk}/versions/535.183.01/withdraw/", REASON),
        OPERATE,
    ),
    (
        "POST /components/{id}/versions/{version}/release/",
        Call("post", "/api/components/{w.component.pk}/versions/555.1/release/", REASON),
        OPERATE,
    ),
    ("GET /compatibility-rules/", Call("get", "/api/compatibility-rules/"), READ),
    ("GET /compatibility-rules/{id}/", Call("get", "/api/compatibility-rules/{w.rule.pk}/"), READ),
    ("POST /compatibility-rules/", Call("post", "/api/compatibility-rules/", RULE), OPERATE_CREATE),
    ("DELETE /compatibility-rules/{id}/", Call("delete", "/api/compatibility-rules/{w.rule.pk}/"), OPERATE_NO_CONTENT),
    ("GET /services/", Call("get", "/api/services/"), READ),
    ("GET /services/{id}/", Call("get", "/api/services/{w.owned_service.pk}/"), READ),
    ("POST /services/", Call("post", "/api/services/", {"name": "roles-svc"}), OPERATE_CREATE),
    ("PATCH /services/{id}/", Call("patch", "/api/services/{w.owned_service.pk}/", {"description": "x"}), OPERATE),
    (
        "POST /services/{id}/placements/",
        Call("post", "/api/services/{w.owned_service.pk}/placements/", lambda w: {"hosts": [w.hosts[0].hostname]}),
        OWN_SERVICE,
    ),
    (
        "POST /services/{id}/placements/remove/",
        Call(
            "post", "/api/services/{w.owned_service.pk}/placements/remove/", lambda w: {"hosts": [w.hosts[0].hostname]}
        ),
        OWN_SERVICE,
    ),
    ("GET /optout-windows/", Call("get", "/api/optout-windows/"), READ),
    ("GET /optout-windows/{id}/", Call("get", "/api/optout-windows/{w.window.pk}/"), READ),
    ("POST /optout-windows/", Call("post", "/api/optout-windows/", window_body), OWN_SERVICE_CREATE),
    (
        "POST /optout-windows/{id}/cancel/",
        Call("post", "/api/optout-windows/{w.window.pk}/cancel/", REASON),
        OWN_SERVICE,
    ),
    ("DELETE /optout-windows/{id}/", Call("delete", "/api/optout-windows/{w.window.pk}/"), NOT_A_METHOD),
    ("GET /reservations/", Call("get", "/api/reservations/"), READ),
    ("GET /reservations/{id}/", Call("get", "/api/reservations/{w.reservation.pk}/"), READ),
    ("POST /reservations/", Call("post", "/api/reservations/", reservation_body), OWN_SERVICE_CREATE),
    (
        "POST /reservations/{id}/cancel/",
        Call("post", "/api/reservations/{w.reservation.pk}/cancel/", REASON),
        OWN_SERVICE,
    ),
    ("GET /operations/", Call("get", "/api/operations/"), READ),
    ("GET /operations/{id}/", Call("get", "/api/operations/{w.operation.pk}/"), READ),
    (
        "POST /operations/",
        Call("post", "/api/operations/", lambda w: {"kind": "reboot", "scope": f"pool {w.pool.name}", **REASON}),
        OPERATE_CREATE,
    ),
    ("POST /operations/{id}/cancel/", Call("post", "/api/operations/{w.operation.pk}/cancel/", REASON), OPERATE),
    ("PUT /operations/{id}/", Call("put", "/api/operations/{w.operation.pk}/", {"priority": 1}), NOT_A_METHOD),
    ("GET /host-tasks/", Call("get", "/api/host-tasks/"), READ),
    ("GET /host-tasks/{id}/", Call("get", "/api/host-tasks/{w.host_task.pk}/"), READ),
    ("GET /work-items/", Call("get", "/api/work-items/"), READ_WORK),
    ("GET /work-items/{id}/", Call("get", "/api/work-items/{w.work_item.pk}/"), READ_WORK),
    ("POST /work-items/claim/", Call("post", "/api/work-items/claim/", {"limit": 1}), EXECUTE),
    (
        "POST /work-items/{id}/heartbeat/",
        Call("post", "/api/work-items/{w.work_item.pk}/heartbeat/", {"attempt": 1}),
        EXECUTE,
    ),
    (
        "POST /work-items/{id}/report/",
        Call(
            "post",
            "/api/work-items/{w.work_item.pk}/report/",
            {"outcome": "done", "attempt": 1},
            headers={"Idempotency-Key": "report-1"},
        ),
        EXECUTE,
    ),
    (
        "POST /work-items/heartbeat/",
        Call("post", "/api/work-items/heartbeat/", lambda w: {"items": [{"id": w.work_item.pk, "attempt": 1}]}),
        EXECUTE,
    ),
    (
        "POST /work-items/report/",
        Call(
            "post",
            "/api/work-items/report/",
            lambda w: {"reports": [{"id": w.work_item.pk, "attempt": 1, "outcome": "done", "report_key": "b-1"}]},
        ),
        EXECUTE,
    ),
    ("DELETE /work-items/{id}/", Call("delete", "/api/work-items/{w.work_item.pk}/"), NOT_A_METHOD),
    ("GET /approvals/", Call("get", "/api/approvals/"), READ),
    ("GET /approvals/{id}/", Call("get", "/api/approvals/{w.approval.pk}/"), READ),
    (
        "POST /approvals/",
        Call(
            "post",
            "/api/approvals/",
            lambda w: {
                "kind": "emergency_train",
                "pool": w.pool.pk,
                "component": "gpu-driver",
                "version": "560.35.03",
                **REASON,
            },
        ),
        OPERATE_CREATE,
    ),
    ("POST /approvals/{id}/approve/", Call("post", "/api/approvals/{w.approval.pk}/approve/", REASON), OPERATE),
    ("POST /approvals/{id}/reject/", Call("post", "/api/approvals/{w.approval.pk}/reject/", REASON), OPERATE),
    ("GET /events/", Call("get", "/api/events/"), READ),
    ("GET /events/{id}/", Call("get", "/api/events/{w.event.pk}/"), READ),
    ("DELETE /events/{id}/", Call("delete", "/api/events/{w.event.pk}/"), NOT_A_METHOD),
    ("GET /trains/", Call("get", "/api/trains/"), READ),
    ("GET /trains/{id}/", Call("get", "/api/trains/{w.train.pk}/"), READ),
    ("GET /trains/{id}/forecast/", Call("get", "/api/trains/{w.train.pk}/forecast/"), READ),
    (
        "POST /trains/",
        Call(
            "post",
            "/api/trains/",
            lambda w: {"pool": w.pool_without_train.pk, "name": "night-train", "cycle_slo_s": 86400},
        ),
        OPERATE_CREATE,
    ),
    ("POST /trains/{id}/pause/", Call("post", "/api/trains/{w.train.pk}/pause/", REASON), OPERATE),
    ("POST /trains/{id}/resume/", Call("post", "/api/trains/{w.paused_train.pk}/resume/", REASON), OPERATE),
    ("GET /visits/", Call("get", "/api/visits/"), READ),
    ("GET /visits/{id}/", Call("get", "/api/visits/{w.visit.pk}/"), READ),
    ("GET /upgrades/", Call("get", "/api/upgrades/"), READ),
    ("GET /upgrades/{id}/", Call("get", "/api/upgrades/{w.upgrade.pk}/"), READ),
    (
        "POST /upgrades/",
        Call(
            "post",
            "/api/upgrades/",
            lambda w: {"pool": w.pool.pk, "component": "gpu-driver", "version": "560.35.03", **REASON},
        ),
        OPERATE_CREATE,
    ),
    ("POST /upgrades/{id}/replan/", Call("post", "/api/upgrades/{w.upgrade.pk}/replan/", {"priority": 900}), OPERATE),
    ("POST /upgrades/{id}/offboard/", Call("post", "/api/upgrades/{w.upgrade.pk}/offboard/", REASON), OPERATE),
    (
        "POST /upgrades/{id}/reonboard/",
        Call("post", "/api/upgrades/{w.offboarded_upgrade.pk}/reonboard/", REASON),
        OPERATE_CREATE,
    ),
    ("POST /fleet/apply/", Call("post", "/api/fleet/apply/?dry_run=true", fleet_file_body), OPERATE),
    ("GET /auth/me/", Call("get", "/api/auth/me/"), ANY_USER),
    ("POST /auth/logout/", Call("post", "/api/auth/logout/"), ANY_USER_NO_CONTENT),
    ("POST /auth/logoutall/", Call("post", "/api/auth/logoutall/"), ANY_USER_NO_CONTENT),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("endpoint", "call", "expected"), ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
def test_each_role_gets_the_status_the_matrix_gives_on_every_endpoint(
    world: World, endpoint: str, call: Call, expected: dict[str, int], role: str
) -> None:
    response = call.send(world.client(role), world)
    assert response.status_code == expected[role], response.content[:500]
    if response.status_code in (401, 403, 404, 405):
        assert set(response.json()) == {"detail", "code"}, response.json()


@pytest.mark.parametrize("role", [role for role in ROLES if role != ANONYMOUS])
def test_every_role_logs_in_with_http_basic_and_gets_a_working_token(world: World, role: str) -> None:
    user = world.users[role]
    client = APIClient()
    response = client.post("/api/auth/login/", headers={"Authorization": basic(user.username, PASSWORD)})
    assert response.status_code == 200, response.content
    assert set(response.json()) == {"token", "expiry"}
    client.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    assert client.get("/api/auth/me/").json()["username"] == user.username


def test_it_refuses_a_login_without_credentials_or_with_a_wrong_password(world: World) -> None:
    user = world.users[Role.VIEWER]
    assert APIClient().post("/api/auth/login/").status_code == 401
    wrong = APIClient().post("/api/auth/login/", headers={"Authorization": basic(user.username, "not-it")})
    assert wrong.status_code == 401
    assert set(wrong.json()) == {"detail", "code"}
    assert not AuthToken.objects.filter(user=user).exists()


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("role", "actions"),
    [
        (Role.OPERATOR, ["approve", "manage_own_service", "operate", "read"]),
        (Role.SERVICE_OWNER, ["manage_own_service", "read"]),
        (Role.VIEWER, ["read"]),
        (Role.EXECUTOR, ["execute"]),
    ],
)
def test_me_names_the_callers_roles_and_what_they_may_do(world: World, role: str, actions: list[str]) -> None:
    body = world.client(role).get("/api/auth/me/").json()
    assert body == {"username": world.users[role].username, "roles": [role], "actions": actions}


def test_a_superuser_is_an_operator(world: World) -> None:
    admin = User.objects.create_superuser("root-of-all", password=PASSWORD)
    body = token_client(admin).get("/api/auth/me/").json()
    assert body["roles"] == [Role.OPERATOR]


def test_a_logged_out_token_is_refused_and_other_tokens_still_work(world: World) -> None:
    user = world.users[Role.VIEWER]
    first, second = token_client(user), token_client(user)
    assert first.post("/api/auth/logout/").status_code == 204
    refused = first.get("/api/pools/")
    assert refused.status_code == 401
    assert set(refused.json()) == {"detail", "code"}
    assert second.get("/api/pools/").status_code == 200


def test_logout_all_revokes_every_token_of_the_user_and_no_one_elses(world: World) -> None:
    user = world.users[Role.OPERATOR]
    first, second = token_client(user), token_client(user)
    someone_else = world.client(Role.VIEWER)
    assert first.post("/api/auth/logoutall/").status_code == 204
    assert first.get("/api/auth/me/").status_code == 401
    assert second.get("/api/auth/me/").status_code == 401
    assert someone_else.get("/api/auth/me/").status_code == 200


def test_an_expired_token_is_refused(world: World) -> None:
    user = world.users[Role.OPERATOR]
    client = token_client(user)
    assert client.get("/api/pools/").status_code == 200
    AuthToken.objects.filter(user=user).update(expiry=clock.now() - dt.timedelta(seconds=1))
    response = client.get("/api/pools/")
    assert response.status_code == 401
    assert set(response.json()) == {"detail", "code"}


def test_an_unknown_token_is_refused_and_the_answer_says_how_to_authenticate(world: World) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 64)
    response = client.get("/api/pools/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    anonymous = APIClient().get("/api/pools/")
    assert (anonymous.status_code, anonymous["WWW-Authenticate"]) == (401, "Token")
    assert anonymous.json()["code"] == "not_authenticated"


def test_an_executor_is_refused_everything_but_work_items_with_the_reason(world: World) -> None:
    response = world.client(Role.EXECUTOR).get("/api/hosts/")
    assert response.status_code == 403
    assert response.json() == {"detail": "Your role does not allow this.", "code": "permission_denied"}
