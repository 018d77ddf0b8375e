"""Schemathesis over the whole OpenAPI schema of the REST API, in-process against the real app and
PostgreSQL: no 5xx, and no response that contradicts the schema.

The schema is the one the app serves at /api/schema/. Every operation in it is one test: its cases
(schemathesis' coverage phase and fuzzing, valid and invalid input) go through Django's WSGI handler
in this process, inside the test's database transaction. The requests carry real knox tokens: an
operator's, or an executor's for the executor endpoints (claim, heartbeat, report); login gets the
operator's password over HTTP Basic. A small world (a fleet, a train with a visit, an operation with
external work items, windows, reservations, upgrades, an approval) is seeded once for the module, and
fuzzed ids and references in paths and bodies are often swapped for ones of real rows. Random input
rarely gets past validation, so each operation also gets one hand-written valid request, which must
succeed with the documented status and body: the success paths' response schemas are checked too.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection, transaction
from django.db.models import Model
from django.test import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from knox.models import AuthToken
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    Component,
    Host,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
)
from fleet.services import optout_window_create, reservation_create, service_place
from fleet.services.catalogue import component_version_withdraw
from fleet.services.host_changes import host_retire
from fleet.services.inventory import component_version_create
from opsplanner import clock
from opsplanner.models import AdvisorRun, Approval, Event, HostTask, Operation, WorkItem
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_items_claim
from simulation.advisor_runs import advisor_run_request
from tests.builders import make_domain, make_fleet, make_host, make_pool, make_service
from tests.trains_builders import make_train, make_user
from trains.models import Cycle, Train, Upgrade, UpgradePhase, Visit
from trains.services.emergency import emergency_train_request
from trains.services.offboarding import upgrade_offboard
from trains.services.trains import train_pause
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

PASSWORD = "x-pass-123"  # what tests.trains_builders.make_user gives every user
FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# No 5xx; a documented status answers with its documented body and content type. Statuses the schema
# does not list (400, 404, 409 ... which DRF and the error handler add to every operation) are not
# checked against a body schema, and are not failures by themselves.
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
# The executor role is the only one that may claim, heartbeat and report; everything else is an operator's.
EXECUTOR_PATHS = (
    "/api/work-items/claim/",
    "/api/work-items/{id}/heartbeat/",
    "/api/work-items/{id}/report/",
    "/api/work-items/heartbeat/",
    "/api/work-items/report/",
)
# The tokens of these are revoked by the call itself, so each call gets a fresh one.
REVOKING_PATHS = ("/api/auth/logout/", "/api/auth/logoutall/")
# The model behind `{id}` of each resource.
RESOURCES: dict[str, type[Model]] = {
    "pools": Pool,
    "domains": MaintenanceDomain,
    "hosts": Host,
    "components": Component,
    "compatibility-rules": CompatibilityRule,
    "services": Service,
    "optout-windows": OptOutWindow,
    "reservations": CapacityReservation,
    "operations": Operation,
    "host-tasks": HostTask,
    "work-items": WorkItem,
    "approvals": Approval,
    "events": Event,
    "trains": Train,
    "visits": Visit,
    "upgrades": Upgrade,
    "advisor-runs": AdvisorRun,
}


class InTransactionApp:
    """Django's WSGI handler, for requests inside the test's transaction (so they see its rows).

    Django's handler closes the database connection around each request; like django.test.Client,
    this one does not. Each request runs in a savepoint, rolled back when it fails (4xx, 5xx) as it
    would be in production, where a request is its own transaction: a database error behind a 500
    leaves no aborted transaction for the requests after it."""

    def __init__(self) -> None:
        self.handler = WSGIHandler()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        status: list[int] = []

        def start(status_line: str, headers: Any, exc_info: Any = None) -> Any:
            status.append(int(status_line.split()[0]))
            return start_response(status_line, headers, exc_info)

        # The schema is loaded at import, outside any transaction and before the database is allowed.
        savepoint = transaction.savepoint() if connection.in_atomic_block else None
        request_started.disconnect(close_old_connections)
        request_finished.disconnect(close_old_connections)
        try:
            response = self.handler(environ, start)
            try:
                body = list(response)
            finally:
                response.close()
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)
        if savepoint is not None:
            if status and status[0] < 400:
                transaction.savepoint_commit(savepoint)
            else:
                transaction.savepoint_rollback(savepoint)
        return body


schema = schemathesis.openapi.from_wsgi("/api/schema/", InTransactionApp())


# Real rows for generated references ------------------------------------------------------------


_IDS: dict[type[Model], list[int]] = {}


def _ids(model: type[Model]) -> list[int]:
    """Read once for the module (the world's rows): an example that retires a host or deletes a rule
    must not change what the next examples draw from (hypothesis needs the same strategy)."""
    if model not in _IDS:
        _IDS[model] = list(model._base_manager.order_by("pk").values_list("pk", flat=True)[:8])
    return _IDS[model]


@schema.hook
def flatmap_path_parameters(context: schemathesis.HookContext, path_parameters: dict[str, Any]) -> Any:
    """Half the time or so, `{id}` is the id of a real row of the resource."""
    if not isinstance(path_parameters, dict) or "id" not in path_parameters or context.operation is None:
        return st.just(path_parameters)
    model = RESOURCES.get(context.operation.path.split("/")[2])
    ids = _ids(model) if model is not None else []
    if not ids:
        return st.just(path_parameters)
    return st.one_of(st.just(path_parameters), st.sampled_from(ids).map(lambda pk: {**path_parameters, "id": pk}))


def _real_values() -> dict[str, list[Any]]:
    pools = list(Pool.objects.order_by("pk").values_list("pk", "name")[:4])
    return {
        "pool": [pk for pk, _ in pools],
        "service": _ids(Service),
        "upgrade": _ids(Upgrade),
        "scope": ["", *(f"pool {name}" for _, name in pools)],
        "hosts": [list(Host.objects.order_by("pk").values_list("hostname", flat=True)[:2])],
        "component": ["gpu-driver", "bios"],
        "version": ["560.35.03", "2.16.0", "535.183.01"],
        "starts_at": [soon(days=1).isoformat()],
        "ends_at": [soon(days=2).isoformat()],
    }


@schema.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> Any:
    """References in a JSON body (pool, service, upgrade, scope, hosts, component and version, a
    window in the future) are each either as generated or real ones."""
    if not isinstance(body, dict):
        return st.just(body)
    real = {key: values for key, values in _real_values().items() if key in body and values}
    if not real:
        return st.just(body)
    choices = {key: st.one_of(st.just(body[key]), st.sampled_from(values)) for key, values in real.items()}
    return st.fixed_dictionaries(choices).map(lambda chosen: {**body, **chosen})


# The world ------------------------------------------------------------------------------------------


class World:
    """One of everything an endpoint can be called on, made through the services.

    Another operator requested the approval and offboarded an upgrade, so the operator under test may
    decide the one and ask to re-onboard the other. The executor has claimed one drain item (attempt 1).
    One window and one reservation outlived the user who made them (created_by is SET_NULL)."""

    def __init__(self) -> None:
        self.operator = make_user(Role.OPERATOR)
        self.executor = make_user(Role.EXECUTOR)
        other_operator = make_user(Role.OPERATOR)
        self.pool, self.hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
        self.pool_without_train = make_pool()
        make_host(make_domain(self.pool_without_train))
        departed = make_user(Role.SERVICE_OWNER)
        self.service = make_service(owners=[departed])
        service_place(service=self.service, hosts=self.hosts[:2])
        self.window = optout_window_create(
            service=self.service, starts_at=soon(days=1), ends_at=soon(days=2), reason="quarter-end", actor=departed
        )
        self.reservation = reservation_create(
            service=self.service,
            pool=self.pool,
            min_hosts_in_service=1,
            starts_at=soon(days=1),
            ends_at=soon(days=2),
            reason="launch",
            actor=departed,
        )
        departed.delete()
        # An open reboot drained and run by external adapters: ready drain items, one claimed.
        self.operation = operation_submit(
            kind="reboot", scope=f"pool {self.pool.name}", reason="kernel fix", drainer="external", executor="external"
        )
        pool_tick(pool_id=self.pool.pk)
        (self.work_item,) = work_items_claim(worker=self.executor.username, limit=1)
        self.host_task = HostTask.objects.filter(operation=self.operation).order_by("pk").first()
        self.train = make_train(self.pool)
        cycle = Cycle.objects.create(train=self.train, number=1, deadline_at=soon(days=7))
        self.visit = Visit.objects.create(train=self.train, cycle=cycle, domain=self.hosts[0].domain, position=0)
        paused_pool = make_pool()
        make_host(make_domain(paused_pool))
        self.paused_train = train_pause(
            train_id=make_train(paused_pool).pk, reason="holiday freeze", actor=other_operator
        )
        self.upgrade = upgrade_create(pool=self.pool, component="gpu-driver", version="560.35.03", reason="refresh")
        self.offboarded_upgrade = upgrade_create(pool=self.pool, component="bios", version="2.16.0", reason="bios")
        upgrade_offboard(upgrade=self.offboarded_upgrade, reason="bricked two hosts", actor=other_operator)
        # A canary held for want of hosts to upgrade (as the train tick holds it), so it may be skipped.
        canary = {"name": "canary", "domain": self.hosts[0].domain.name}
        self.held_upgrade = upgrade_create(
            pool=self.pool, component="gpu-driver", version="560.35.03", reason="canary first",
            phases=[canary, {"name": "rest", "percent": 100, "min_successes": 0}],
        )  # fmt: skip
        UpgradePhase.objects.filter(upgrade=self.held_upgrade, position=0).update(
            held_code="too_few_hosts", held_reason="no host of the canary needs it", held_at=clock.now()
        )
        emergency = emergency_train_request(
            pool=self.pool, component="gpu-driver", version="560.35.03", reason="CVE", actor=other_operator
        )
        self.approval = Approval.objects.get(subject_type="trains.train", subject_id=emergency.pk)
        self.component = self.upgrade.component_version.component
        # A version an operator withdrew by hand, to release.
        hand_withdrawn = component_version_create(component=self.component, version="555.1", actor=other_operator)
        component_version_withdraw(version_id=hand_withdrawn.pk, reason="hangs under load", actor=other_operator)
        self.rule = CompatibilityRule.objects.order_by("pk").first()
        self.advisor_run = advisor_run_request(
            pool_hosts=400, sizes=[16, 40], interruption_cost=100, capacity_hour_cost=1, actor=other_operator
        )
        # A finished run: only one may be active at a time, and the POST below makes one.
        AdvisorRun.objects.filter(pk=self.advisor_run.pk).update(
            state="failed", failure_reason="schema test", finished_at=clock.now()
        )
        # Hosts no operation names (to change, retire and report on), and a retired one to restore.
        self.free_host = Host.objects.get(pool=self.pool_without_train)
        self.retired_host = make_host(make_domain(self.pool_without_train))
        host_retire(hostname=self.retired_host.hostname, reason="left the fleet", actor=other_operator)
        self.event = Event.objects.order_by("pk").first()


def soon(**delta: float) -> dt.datetime:
    return clock.now() + dt.timedelta(**delta)


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    """Built once for the module in a transaction rolled back at its end; each test runs in a
    savepoint inside it (pytest-django's), so what one operation's examples change the next never sees."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHER), transaction.atomic():
        yield World()
        transaction.set_rollback(True)


@pytest.fixture
def tokens(world: World, settings: Any) -> dict[str, str]:
    settings.PASSWORD_HASHERS = FAST_HASHER
    return {Role.OPERATOR: _token(world.operator), Role.EXECUTOR: _token(world.executor)}


def _token(user: User) -> str:
    return AuthToken.objects.create(user)[1]


def _auth_header(case: schemathesis.Case, world: World, tokens: dict[str, str]) -> str:
    path = case.operation.path
    if path == "/api/auth/login/":
        return "Basic " + base64.b64encode(f"{world.operator.username}:{PASSWORD}".encode()).decode()
    if path in REVOKING_PATHS:
        return f"Token {_token(world.operator)}"
    return f"Token {tokens[Role.EXECUTOR if path in EXECUTOR_PATHS else Role.OPERATOR]}"


@pytest.fixture(autouse=True)
def claims_do_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuzzed claims may ask for a long poll: answer at once, so the fuzzing does not sleep."""
    monkeypatch.setattr("opsplanner.services.work_items.MAX_WAIT_SECONDS", 0)


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_the_api_answers_as_its_schema_says(case: schemathesis.Case, world: World, tokens: dict[str, str]) -> None:
    case.call_and_validate(headers={"Authorization": _auth_header(case, world, tokens)}, checks=CHECKS)


# One valid request per operation -----------------------------------------------------------------


@dataclass(frozen=True)
class Valid:
    """A request that succeeds: `{id}` and the body are made from the world."""

    method: str
    path: str
    id: Callable[[World], int] | None = None
    body: Callable[[World], dict[str, Any]] | dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # path parameters other than `{id}`
    query: dict[str, str] = field(default_factory=dict)
    status: int | None = None  # the documented 2xx it answers; None: the lowest documented


REASON = {"reason": "schema conformance test"}
# A fleet file declaring one new pool with one host.
FLEET_POOL = {"name": "schema-fleet", "workload_class": "web", "planned_buffer": 1, "failure_buffer": 1}
FLEET_FILE = {
    "pools": [{**FLEET_POOL, "domains": ["rack-1"]}],
    "hosts": [{"hostname": "schema-fleet-h1", "pool": "schema-fleet", "domain": "rack-1", "sku": "cpu-2s"}],
}


def _window(w: World) -> dict[str, Any]:
    return {
        "service": w.service.pk,
        "starts_at": soon(days=3).isoformat(),
        "ends_at": soon(days=4).isoformat(),
        "reason": "model launch",
    }


def _host_row(hostname: str) -> Callable[[World], dict[str, Any]]:
    return lambda w: {"hostname": hostname, "pool": w.pool.name, "domain": "rack-0001", "sku": "cpu-2s"}


INVENTORY_WRITES = [
    Valid("POST", "/api/pools/", body={"name": "schema-pool", "workload_class": "web", "planned_buffer_hosts": 1,
                                        "failure_buffer_fraction": "0.05", "executor": "ssh"}),
    Valid("PATCH", "/api/pools/{id}/", lambda w: w.pool.pk, {"description": "east", "drainer": "external"}),
    Valid("POST", "/api/domains/", body=lambda w: {"pool": w.pool.pk, "name": "rack-new", "kind": "row"}),
    Valid("PATCH", "/api/domains/{id}/", lambda w: w.hosts[0].domain_id, {"position": 7}),
    Valid("POST", "/api/hosts/", body=_host_row("schema-new-h1")),
    Valid("PATCH", "/api/hosts/{id}/", lambda w: w.free_host.pk, {"sku": "cpu-4s", "labels": {"row": 3}}),
    Valid("POST", "/api/hosts/bulk/", body=lambda w: {"hosts": [_host_row("schema-new-h2")(w)]}, status=201),
    Valid(
        "POST", "/api/hosts/bulk/", body=lambda w: {"hosts": [_host_row("schema-new-h3")(w)]},
        query={"dry_run": "true"}, status=200,
    ),
    Valid("POST", "/api/hosts/{id}/retire/", lambda w: w.free_host.pk, REASON),
    Valid("POST", "/api/hosts/{id}/restore/", lambda w: w.retired_host.pk, REASON),
    Valid("POST", "/api/hosts/{id}/versions/", lambda w: w.free_host.pk, {"versions": {"bios": "2.14.0"}}),
    Valid("POST", "/api/components/", body={"name": "psu-fw", "layer": "lower_level"}),
    Valid("PATCH", "/api/components/{id}/", lambda w: w.component.pk, {"display_name": "GPU driver"}),
    Valid("POST", "/api/components/{id}/versions/", lambda w: w.component.pk, {"version": "570.1"}),
    Valid("POST", "/api/components/{id}/versions/{version}/withdraw/", lambda w: w.component.pk, REASON,
          params={"version": "535.183.01"}),
    Valid("POST", "/api/components/{id}/versions/{version}/release/", lambda w: w.component.pk, REASON,
          params={"version": "555.1"}),
    Valid("POST", "/api/compatibility-rules/", body={"job_facing_component": "cuda-runtime",
                                                    "job_facing_version": "12.4.1", "lower_component": "bios",
                                                    "min_version": "2.0"}),
    Valid("DELETE", "/api/compatibility-rules/{id}/", lambda w: w.rule.pk),
    Valid("POST", "/api/services/", body={"name": "schema-svc", "owners": []}),
    Valid("PATCH", "/api/services/{id}/", lambda w: w.service.pk, {"description": "trainer"}),
    Valid("POST", "/api/services/{id}/placements/", lambda w: w.service.pk,
          lambda w: {"hosts": [w.hosts[2].hostname], "running_jobs": 2}),
    Valid("POST", "/api/services/{id}/placements/remove/", lambda w: w.service.pk,
          lambda w: {"hosts": [w.hosts[0].hostname]}),
]  # fmt: skip

VALID = [
    *INVENTORY_WRITES,
    Valid("GET", "/api/auth/me/"),
    Valid("POST", "/api/fleet/apply/", body=FLEET_FILE),
    Valid("POST", "/api/auth/login/"),
    Valid("POST", "/api/auth/logout/"),
    Valid("POST", "/api/auth/logoutall/"),
    Valid("GET", "/api/pools/"),
    Valid("GET", "/api/pools/{id}/", lambda w: w.pool.pk),
    Valid("GET", "/api/pools/{id}/forecast/", lambda w: w.pool.pk),
    Valid("GET", "/api/domains/"),
    Valid("GET", "/api/domains/{id}/", lambda w: w.hosts[0].domain_id),
    Valid("GET", "/api/hosts/"),
    Valid("GET", "/api/hosts/{id}/", lambda w: w.hosts[0].pk),
    Valid("GET", "/api/components/"),
    Valid("GET", "/api/components/{id}/", lambda w: w.component.pk),
    Valid("GET", "/api/compatibility-rules/"),
    Valid("GET", "/api/compatibility-rules/{id}/", lambda w: w.rule.pk),
    Valid("GET", "/api/services/"),
    Valid("GET", "/api/services/{id}/", lambda w: w.service.pk),
    Valid("GET", "/api/optout-windows/"),
    Valid("POST", "/api/optout-windows/", body=_window),
    Valid("GET", "/api/optout-windows/{id}/", lambda w: w.window.pk),
    Valid("POST", "/api/optout-windows/{id}/cancel/", lambda w: w.window.pk, REASON),
    Valid("GET", "/api/reservations/"),
    Valid("POST", "/api/reservations/", body=lambda w: {**_window(w), "pool": w.pool.pk, "min_hosts_in_service": 1}),
    Valid("GET", "/api/reservations/{id}/", lambda w: w.reservation.pk),
    Valid("POST", "/api/reservations/{id}/cancel/", lambda w: w.reservation.pk, REASON),
    Valid("GET", "/api/operations/"),
    Valid("POST", "/api/operations/", body=lambda w: {"kind": "reboot", "scope": f"pool {w.pool.name}", **REASON}),
    Valid("GET", "/api/operations/{id}/", lambda w: w.operation.pk),
    Valid("POST", "/api/operations/{id}/cancel/", lambda w: w.operation.pk, REASON),
    Valid("GET", "/api/host-tasks/"),
    Valid("GET", "/api/host-tasks/{id}/", lambda w: w.host_task.pk),
    Valid("GET", "/api/work-items/"),
    Valid("GET", "/api/work-items/{id}/", lambda w: w.work_item.pk),
    Valid("POST", "/api/work-items/claim/", body={"limit": 2}),
    Valid("POST", "/api/work-items/{id}/heartbeat/", lambda w: w.work_item.pk, {"attempt": 1}),
    Valid(
        "POST",
        "/api/work-items/{id}/report/",
        lambda w: w.work_item.pk,
        {"outcome": "done", "attempt": 1},
        {"Idempotency-Key": "schema-report-1"},
    ),
    Valid("POST", "/api/work-items/heartbeat/", body=lambda w: {"items": [{"id": w.work_item.pk, "attempt": 1}]}),
    Valid(
        "POST",
        "/api/work-items/report/",
        body=lambda w: {"reports": [{"id": w.work_item.pk, "attempt": 1, "outcome": "done"}], "claim_next": True},
        headers={"Idempotency-Key": "schema-batch-1"},
    ),
    Valid("GET", "/api/approvals/"),
    Valid(
        "POST",
        "/api/approvals/",
        body=lambda w: {
            "kind": "emergency_train",
            "pool": w.pool.pk,
            "component": "gpu-driver",
            "version": "560.35.03",
            **REASON,
        },
    ),
    Valid("GET", "/api/approvals/{id}/", lambda w: w.approval.pk),
    Valid("POST", "/api/approvals/{id}/approve/", lambda w: w.approval.pk, REASON),
    Valid("POST", "/api/approvals/{id}/reject/", lambda w: w.approval.pk, REASON),
    Valid("GET", "/api/events/"),
    Valid("GET", "/api/events/{id}/", lambda w: w.event.pk),
    Valid("GET", "/api/trains/"),
    Valid(
        "POST",
        "/api/trains/",
        body=lambda w: {"pool": w.pool_without_train.pk, "name": "night-train", "cycle_slo_s": 86400},
    ),
    Valid("GET", "/api/trains/{id}/", lambda w: w.train.pk),
    Valid("GET", "/api/trains/{id}/forecast/", lambda w: w.train.pk),
    Valid("POST", "/api/trains/{id}/pause/", lambda w: w.train.pk, REASON),
    Valid("POST", "/api/trains/{id}/resume/", lambda w: w.paused_train.pk, REASON),
    Valid("GET", "/api/visits/"),
    Valid("GET", "/api/visits/{id}/", lambda w: w.visit.pk),
    Valid("GET", "/api/upgrades/"),
    Valid(
        "POST",
        "/api/upgrades/",
        body=lambda w: {"pool": w.pool.pk, "component": "gpu-driver", "version": "560.35.03", **REASON},
    ),
    Valid("GET", "/api/upgrades/{id}/", lambda w: w.upgrade.pk),
    Valid("POST", "/api/upgrades/{id}/replan/", lambda w: w.upgrade.pk, {"priority": 900}),
    Valid("POST", "/api/upgrades/{id}/offboard/", lambda w: w.upgrade.pk, REASON),
    Valid("POST", "/api/upgrades/{id}/reonboard/", lambda w: w.offboarded_upgrade.pk, REASON),
    Valid("POST", "/api/upgrades/{id}/skip-phase/", lambda w: w.held_upgrade.pk, REASON),
    Valid("GET", "/api/advisor-runs/"),
    Valid(
        "POST",
        "/api/advisor-runs/",
        body={"pool_hosts": 400, "sizes": [16, 40, 80], "interruption_cost": 100, "capacity_hour_cost": 1},
    ),
    Valid("GET", "/api/advisor-runs/{id}/", lambda w: w.advisor_run.pk),
]


def test_every_operation_of_the_schema_has_a_valid_request_below() -> None:
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert operations == {(v.method, v.path) for v in VALID}


@pytest.mark.parametrize("valid", VALID, ids=[f"{v.method} {v.path}" for v in VALID])
def test_a_valid_request_succeeds_and_answers_as_the_schema_says(
    valid: Valid, world: World, tokens: dict[str, str]
) -> None:
    operation = schema[valid.path][valid.method]
    body = valid.body(world) if callable(valid.body) else valid.body
    case = operation.Case(
        path_parameters={"id": valid.id(world), **valid.params} if valid.id else None,
        headers=valid.headers,
        query=valid.query or None,
        **({"body": body, "media_type": "application/json"} if body is not None else {}),
    )
    response = case.call_and_validate(headers={"Authorization": _auth_header(case, world, tokens)}, checks=CHECKS)
    documented = sorted(int(code) for code in operation.definition.raw["responses"] if code.startswith("2"))
    assert valid.status is None or valid.status in documented
    assert response.status_code == (valid.status or documented[0]), response.text[:1000]


# Authentication schemes ---------------------------------------------------------------------------

# Login exchanges a password (HTTP Basic) or a session for a token: the one operation without a token.
TOKENLESS_OPERATIONS = {("POST", "/api/auth/login/")}


def _spectacular_schema() -> dict[str, Any]:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def _operations(openapi: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in openapi["paths"].items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def test_the_token_scheme_is_defined_as_a_knox_authorization_header() -> None:
    scheme = _spectacular_schema()["components"]["securitySchemes"]["tokenAuth"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == ("apiKey", "header", "Authorization")
    assert "Token" in scheme["description"]


def test_every_operation_that_requires_authentication_accepts_a_token() -> None:
    openapi = _spectacular_schema()
    without_token = [
        (method, path)
        for method, path, operation in _operations(openapi)
        if (method, path) not in TOKENLESS_OPERATIONS
        and {} not in operation.get("security", [])
        and not any("tokenAuth" in requirement for requirement in operation.get("security", []))
    ]
    assert without_token == []
    assert len(list(_operations(openapi))) > 50


def test_operations_outside_auth_accept_both_a_token_and_the_session_cookie() -> None:
    for method, path, operation in _operations(_spectacular_schema()):
        if not path.startswith("/api/auth/"):
            assert {"tokenAuth": []} in operation["security"], (method, path)
            assert {"cookieAuth": []} in operation["security"], (method, path)


def test_login_asks_for_a_password_or_a_session_not_a_token() -> None:
    operation = _spectacular_schema()["paths"]["/api/auth/login/"]["post"]
    assert operation["security"] == [{"basicAuth": []}, {"cookieAuth": []}]
