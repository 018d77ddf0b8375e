"""What the REST API does, beyond who may call it: retried creates and reports (Idempotency-Key),
external executors driving an operation, several executors claiming at once, the error shapes, the
two-person rule, and list endpoints whose query count does not grow with the page."""

from __future__ import annotations

import datetime as dt
import functools
import threading
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from fleet.models import (
    CapacityReservation,
    Host,
    OptOutWindow,
)
from fleet.services import optout_window_create, service_place
from opsplanner import clock
from opsplanner.models import Approval, Event, IdempotencyRecord, Operation, WorkItem
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.api_helpers import token_client
from tests.builders import make_fleet, make_service
from tests.driving import in_threads
from tests.trains_builders import make_train, make_user
from trains.models import Train, Upgrade

pytestmark = pytest.mark.django_db

FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]
REASON = {"reason": "api behaviour test"}


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = FAST_HASHER


@pytest.fixture
def operator() -> APIClient:
    return token_client(make_user(Role.OPERATOR))


@pytest.fixture
def executor() -> APIClient:
    return token_client(make_user(Role.EXECUTOR))


def reboot_intent(pool, **extra: Any) -> dict[str, Any]:
    return {"kind": "reboot", "scope": f"pool {pool.name}", "reason": "kernel fix", **extra}


def external_reboot(operator: APIClient, hosts: int = 2) -> tuple[Any, dict[str, Any]]:
    """A pool whose reboot is drained and run by external adapters, submitted through the API and
    ticked once: the first hosts have drain items ready."""
    pool, _ = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    response = operator.post(
        "/api/operations/", reboot_intent(pool, executor="external", drainer="external"), format="json"
    )
    assert response.status_code == 201, response.content
    pool_tick(pool_id=pool.pk)
    return pool, response.json()


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The one error shape: detail and code, plus the field messages on a 400."""
    assert response.status_code == status, response.content[:500]
    body = response.json()
    expected_keys = {"detail", "code", "errors"} if status == 400 else {"detail", "code"}
    assert set(body) == expected_keys, body
    assert isinstance(body["detail"], str)
    assert isinstance(body["code"], str)
    assert body["detail"]
    if status == 400:
        assert body["errors"], body
        assert all(isinstance(m, list) and all(isinstance(s, str) for s in m) for m in body["errors"].values())
    if code is not None:
        assert body["code"] == code, body
    return body


# Idempotency of creates.


def test_a_create_retried_with_the_same_key_returns_the_first_answer_and_makes_one_object(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    intent = reboot_intent(pool)
    first = operator.post("/api/operations/", intent, format="json", headers={"Idempotency-Key": "op-1"})
    again = operator.post("/api/operations/", intent, format="json", headers={"Idempotency-Key": "op-1"})
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Operation.objects.count() == 1


def test_the_same_key_with_another_body_is_a_conflict_and_makes_nothing(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operator.post("/api/operations/", reboot_intent(pool), format="json", headers={"Idempotency-Key": "op-1"})
    other = operator.post(
        "/api/operations/", reboot_intent(pool, priority=7), format="json", headers={"Idempotency-Key": "op-1"}
    )
    body = assert_error(other, 409, "idempotency_key_reused")
    assert "op-1" in body["detail"]
    assert Operation.objects.count() == 1


def test_a_key_is_per_user_so_two_users_do_not_collide(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    colleague = token_client(make_user(Role.OPERATOR))
    for client in (operator, colleague):
        response = client.post("/api/operations/", reboot_intent(pool), format="json", headers={"Idempotency-Key": "k"})
        assert response.status_code == 201
    assert Operation.objects.count() == 2


def test_a_refused_create_stores_no_answer_so_a_corrected_retry_with_the_key_succeeds(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    refused = operator.post(
        "/api/operations/", reboot_intent(pool, scope="pool nowhere"), format="json", headers={"Idempotency-Key": "k"}
    )
    assert_error(refused, 400)
    retried = operator.post("/api/operations/", reboot_intent(pool), format="json", headers={"Idempotency-Key": "k"})
    assert retried.status_code == 201
    assert Operation.objects.count() == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/optout-windows/",
            lambda service, pool: {"service": service.pk, "starts_at": _in(days=1), "ends_at": _in(days=2), **REASON},
        ),
        (
            "/api/reservations/",
            lambda service, pool: {
                "service": service.pk,
                "pool": pool.pk,
                "min_hosts_in_service": 1,
                "starts_at": _in(days=1),
                "ends_at": _in(days=2),
                **REASON,
            },
        ),
        ("/api/trains/", lambda service, pool: {"pool": pool.pk, "name": "night-train", "cycle_slo_s": 86400}),
        (
            "/api/upgrades/",
            lambda service, pool: {"pool": pool.pk, "component": "gpu-driver", "version": "560.35.03", **REASON},
        ),
        (
            "/api/approvals/",
            lambda service, pool: {
                "kind": "emergency_train",
                "pool": pool.pk,
                "component": "gpu-driver",
                "version": "560.35.03",
                **REASON,
            },
        ),
    ],
    ids=["optout-window", "reservation", "train", "upgrade", "approval"],
)
def test_every_create_honours_the_idempotency_key(operator, path: str, body) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    service = make_service()
    service_place(service=service, hosts=hosts)
    request = body(service, pool)
    first = operator.post(path, request, format="json", headers={"Idempotency-Key": "create-1"})
    assert first.status_code == 201, first.content
    rows = _rows()
    again = operator.post(path, request, format="json", headers={"Idempotency-Key": "create-1"})
    assert (again.status_code, again.json()) == (201, first.json())
    assert _rows() == rows


def _in(**delta: float) -> str:
    return (clock.now() + dt.timedelta(**delta)).isoformat()


def _rows() -> dict[str, int]:
    models = (OptOutWindow, CapacityReservation, Train, Upgrade, Approval, Operation, Event)
    return {model.__name__: model.objects.count() for model in models}


def test_an_idempotency_key_that_is_too_long_is_refused_with_the_reason(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    response = operator.post(
        "/api/operations/", reboot_intent(pool), format="json", headers={"Idempotency-Key": "k" * 129}
    )
    body = assert_error(response, 400)
    assert "Idempotency-Key" in body["detail"]
    assert Operation.objects.count() == 0


def race(clients: list[APIClient], path: str, body: dict[str, Any], key: str) -> list[Any]:
    """POST the same request from every client at the same moment, each in its own thread."""
    barrier = threading.Barrier(len(clients))
    answers: list[Any] = [None] * len(clients)

    def post(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            answers[index] = clients[index].post(path, body, format="json", headers={"Idempotency-Key": key})
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(index,)) for index in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


@pytest.mark.django_db(transaction=True)
def test_two_requests_racing_with_one_key_make_one_object_and_get_one_answer() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    user = make_user(Role.OPERATOR)
    clients = [token_client(user), token_client(user)]
    for attempt in range(3):
        key = f"race-{attempt}"
        answers = race(clients, "/api/operations/", reboot_intent(pool), key)
        assert [a.status_code for a in answers] == [201, 201], [a.content for a in answers]
        assert answers[0].json() == answers[1].json()
        assert IdempotencyRecord.objects.filter(user=user, key=key).count() == 1
    assert Operation.objects.count() == 3


# External executors through the API.


def test_an_executor_claims_heartbeats_and_reports_a_drain_and_a_retried_report_changes_nothing(
    operator, executor
) -> None:
    pool, operation = external_reboot(operator)
    assert operation["executor"] == operation["drainer"] == "external"
    claimed = executor.post("/api/work-items/claim/", {"kinds": ["drain"], "pool": pool.pk, "limit": 1}, format="json")
    assert claimed.status_code == 200
    (item,) = claimed.json()
    username = executor.user.get_username()
    assert (item["kind"], item["state"], item["attempt"], item["claimed_by"]) == ("drain", "running", 1, username)
    path = f"/api/work-items/{item['id']}"

    beat = executor.post(f"{path}/heartbeat/", {"attempt": 1, "lease_seconds": 600}, format="json")
    assert beat.status_code == 200
    assert dt.datetime.fromisoformat(beat.json()["lease_expires_at"]) > clock.now() + dt.timedelta(seconds=500)

    report = {"outcome": "done", "attempt": 1, "reason": "drained cleanly"}
    first = executor.post(f"{path}/report/", report, format="json", headers={"Idempotency-Key": "drain-report-1"})
    assert first.status_code == 200, first.content
    assert (first.json()["state"], first.json()["outcome_reason"]) == ("done", "drained cleanly")
    events = Event.objects.filter(subject_type="opsplanner.workitem", subject_id=item["id"]).count()

    again = executor.post(f"{path}/report/", report, format="json", headers={"Idempotency-Key": "drain-report-1"})
    assert (again.status_code, again.json()) == (200, first.json())
    assert Event.objects.filter(subject_type="opsplanner.workitem", subject_id=item["id"]).count() == events
    assert Event.objects.filter(kind="work_item.done", subject_id=item["id"]).count() == 1

    other = executor.post(
        f"{path}/report/", {"outcome": "failed", "attempt": 1}, format="json", headers={"Idempotency-Key": "drain-2"}
    )
    body = assert_error(other, 409, "conflict")
    assert "already reported done with another key" in body["detail"]
    assert WorkItem.objects.get(pk=item["id"]).state == "done"


def test_a_heartbeat_or_report_with_a_stale_attempt_is_a_conflict_that_names_the_attempt(operator, executor) -> None:
    pool, _ = external_reboot(operator, hosts=1)
    (item,) = executor.post("/api/work-items/claim/", {"pool": pool.pk}, format="json").json()
    path = f"/api/work-items/{item['id']}"
    report = executor.post(
        f"{path}/report/", {"outcome": "done", "attempt": 2}, format="json", headers={"Idempotency-Key": "r"}
    )
    assert "attempt" in assert_error(report, 409, "conflict")["detail"]
    beat = executor.post(f"{path}/heartbeat/", {"attempt": 2}, format="json")
    assert "attempt" in assert_error(beat, 409, "conflict")["detail"]
    assert WorkItem.objects.get(pk=item["id"]).state == "running"


def test_a_report_needs_an_idempotency_key(operator, executor) -> None:
    pool, _ = external_reboot(operator, hosts=1)
    (item,) = executor.post("/api/work-items/claim/", {"pool": pool.pk}, format="json").json()
    response = executor.post(f"/api/work-items/{item['id']}/report/", {"outcome": "done", "attempt": 1}, format="json")
    body = assert_error(response, 400)
    assert "Idempotency-Key" in body["detail"]
    assert WorkItem.objects.get(pk=item["id"]).state == "running"


def test_a_malformed_report_names_the_field(operator, executor) -> None:
    pool, _ = external_reboot(operator, hosts=1)
    (item,) = executor.post("/api/work-items/claim/", {"pool": pool.pk}, format="json").json()
    response = executor.post(
        f"/api/work-items/{item['id']}/report/",
        {"outcome": "finished", "attempt": 1, "result": {"versions": ["560"]}},
        format="json",
        headers={"Idempotency-Key": "r"},
    )
    body = assert_error(response, 400, "invalid")
    assert set(body["errors"]) == {"outcome", "result.versions"}


def test_an_operation_run_entirely_by_an_external_executor_through_the_api_completes(operator, executor) -> None:
    pool, operation = external_reboot(operator, hosts=2)
    kinds_seen: set[str] = set()
    for _round in range(30):
        pool_tick(pool_id=pool.pk)
        if Operation.objects.get(pk=operation["id"]).state != "open":
            break
        items = executor.post("/api/work-items/claim/", {"pool": pool.pk, "limit": 50}, format="json").json()
        for item in items:
            kinds_seen.add(item["kind"])
            result = {"passed": True} if item["kind"] == "verify" else {}
            response = executor.post(
                f"/api/work-items/{item['id']}/report/",
                {"outcome": "done", "attempt": item["attempt"], "result": result},
                format="json",
                headers={"Idempotency-Key": f"report-{item['id']}-{item['attempt']}"},
            )
            assert response.status_code == 200, response.content
    answer = operator.get(f"/api/operations/{operation['id']}/").json()
    assert answer["state"] == "completed", answer
    assert answer["tasks"] == {"done": 2}
    assert {"drain", "execute", "undrain"} <= kinds_seen
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {"in_service"}


@pytest.mark.django_db(transaction=True)
def test_several_executors_claiming_at_once_never_claim_an_item_twice() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=12, planned_buffer_hosts=24, failure_buffer_hosts=0)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external", executor="external")
    pool_tick(pool_id=pool.pk)
    ready = set(WorkItem.objects.filter(state="ready", adapter="external").values_list("id", flat=True))
    assert len(ready) == 24
    clients = [token_client(make_user(Role.EXECUTOR)) for _ in range(6)]
    barrier = threading.Barrier(len(clients))
    claims: dict[str, list[int]] = {client.user.get_username(): [] for client in clients}

    def claim_until_empty(client: APIClient) -> None:
        barrier.wait(timeout=10)
        while True:
            response = client.post("/api/work-items/claim/", {"limit": 2, "pool": pool.pk}, format="json")
            assert response.status_code == 200, response.content
            if not response.json():
                return
            claims[client.user.get_username()].extend(item["id"] for item in response.json())

    errors = in_threads(*(functools.partial(claim_until_empty, client) for client in clients), timeout=60)
    assert not errors, errors
    every_claim = [item_id for ids in claims.values() for item_id in ids]
    assert len(every_claim) == len(set(every_claim)), "an item was claimed twice"
    assert set(every_claim) == ready
    holders = dict(WorkItem.objects.filter(pk__in=ready).values_list("id", "claimed_by"))
    assert {holders[item_id] for ids in claims.values() for item_id in ids} <= set(claims)
    for username, ids in claims.items():
        assert all(holders[item_id] == username for item_id in ids)
    assert set(WorkItem.objects.filter(pk__in=ready).values_list("state", "attempts")) == {("running", 1)}
    assert Event.objects.filter(kind="work_item.claimed").count() == 24


# Error shapes.


def test_a_bad_intent_is_a_400_naming_each_bad_field(operator) -> None:
    response = operator.post("/api/operations/", {"kind": "explode", "reason": "", "priority": -1}, format="json")
    body = assert_error(response, 400, "invalid")
    assert set(body["errors"]) == {"kind", "reason", "priority"}
    assert body["detail"].startswith("kind: ")


def test_an_intent_the_planner_refuses_is_a_400_with_the_reason(operator) -> None:
    make_fleet(domains=1, hosts_per_domain=1)
    unknown_scope = operator.post(
        "/api/operations/", {"kind": "reboot", "scope": "pool nowhere", **REASON}, format="json"
    )
    assert "scope" in assert_error(unknown_scope, 400, "invalid")["errors"]
    unknown_hosts = operator.post("/api/operations/", {"kind": "reboot", "hosts": ["ghost-1"], **REASON}, format="json")
    body = assert_error(unknown_hosts, 400, "invalid")
    assert body["errors"] == {"hosts": ["Unknown hosts: ghost-1."]}
    both = operator.post(
        "/api/operations/", {"kind": "reboot", "scope": "pool x", "hosts": ["a"], **REASON}, format="json"
    )
    assert "scope" in assert_error(both, 400, "invalid")["errors"]
    assert Operation.objects.count() == 0


def test_an_unknown_id_in_a_body_is_a_400_naming_the_field(operator) -> None:
    response = operator.post(
        "/api/upgrades/", {"pool": 987654, "component": "gpu-driver", "version": "1", **REASON}, format="json"
    )
    body = assert_error(response, 400, "invalid")
    assert body["errors"] == {"pool": ["There is no pool #987654."]}


def test_an_emergency_train_request_without_its_target_names_what_is_missing(operator) -> None:
    response = operator.post("/api/approvals/", {"kind": "emergency_train", **REASON}, format="json")
    assert set(assert_error(response, 400, "invalid")["errors"]) == {"pool", "component", "version"}


def test_a_body_that_is_not_json_is_a_400_in_the_error_shape(operator) -> None:
    response = operator.post("/api/operations/", "{not json", content_type="application/json")
    assert_error(response, 400)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/operations/987654/"),
        ("post", "/api/operations/987654/cancel/"),
        ("get", "/api/hosts/987654/"),
        ("get", "/api/trains/987654/forecast/"),
        ("post", "/api/approvals/987654/approve/"),
        ("get", "/api/work-items/987654/"),
    ],
)
def test_an_unknown_id_is_a_404_in_the_error_shape(operator, method: str, path: str) -> None:
    response = getattr(operator, method)(path, REASON, format="json") if method == "post" else operator.get(path)
    assert assert_error(response, 404, "not_found") == {"detail": "Not found.", "code": "not_found"}


def test_cancelling_a_cancelled_operation_is_a_409(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operation = operator.post("/api/operations/", reboot_intent(pool), format="json").json()
    cancelled = operator.post(f"/api/operations/{operation['id']}/cancel/", REASON, format="json")
    assert (cancelled.status_code, cancelled.json()["state"]) == (200, "cancelled")
    again = operator.post(f"/api/operations/{operation['id']}/cancel/", REASON, format="json")
    body = assert_error(again, 409, "conflict")
    assert body["detail"] == f"Operation #{operation['id']} is cancelled; only open operations can be cancelled."


def test_cancelling_a_completed_operation_is_a_409(operator) -> None:
    from tests.driving import drive, instant_simulator

    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operation = operator.post("/api/operations/", reboot_intent(pool), format="json").json()
    drive(pool)
    assert Operation.objects.get(pk=operation["id"]).state == "completed"
    response = operator.post(f"/api/operations/{operation['id']}/cancel/", REASON, format="json")
    assert "is completed" in assert_error(response, 409, "conflict")["detail"]


def test_pausing_a_paused_train_and_resuming_a_running_one_are_409s(operator) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    train = make_train(pool)
    path = f"/api/trains/{train.pk}"
    assert_error(operator.post(f"{path}/resume/", REASON, format="json"), 409, "conflict")
    paused = operator.post(f"{path}/pause/", REASON, format="json")
    assert (paused.status_code, paused.json()["state"]) == (200, "paused")
    again = operator.post(f"{path}/pause/", REASON, format="json")
    assert "only a running or autostopped train pauses" in assert_error(again, 409, "conflict")["detail"]
    assert Train.objects.get(pk=train.pk).state == "paused"


def test_cancelling_a_cancelled_window_is_a_409(operator) -> None:
    service = make_service()
    window = optout_window_create(
        service=service, starts_at=clock.now(), ends_at=clock.now() + dt.timedelta(hours=1), reason="r"
    )
    path = f"/api/optout-windows/{window.pk}/cancel/"
    assert operator.post(path, REASON, format="json").status_code == 200
    body = assert_error(operator.post(path, REASON, format="json"), 409, "conflict")
    assert body["detail"].endswith(f"window #{window.pk} was already cancelled.")


def test_401_403_and_405_answers_have_the_error_shape(operator) -> None:
    assert_error(APIClient().get("/api/operations/"), 401, "not_authenticated")
    assert_error(token_client(make_user(Role.VIEWER)).post("/api/operations/", {}, format="json"), 403)
    assert_error(operator.delete("/api/operations/1/"), 405, "method_not_allowed")


# Approvals: the two-person rule.


def test_the_requester_of_an_emergency_train_cannot_approve_it_and_another_operator_can(operator) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    request = {"kind": "emergency_train", "pool": pool.pk, "component": "gpu-driver", "version": "560.35.03", **REASON}
    created = operator.post("/api/approvals/", request, format="json")
    assert created.status_code == 201, created.content
    approval = created.json()
    assert (approval["kind"], approval["state"], approval["requester"]) == (
        "emergency_train",
        "pending",
        operator.user.get_username(),
    )
    train = Train.objects.get(pk=approval["subject_id"])
    assert train.state == "awaiting_approval"

    own = operator.post(f"/api/approvals/{approval['id']}/approve/", REASON, format="json")
    assert "two-person rule" in assert_error(own, 403, "self_approval")["detail"]
    assert Approval.objects.get(pk=approval["id"]).state == "pending"

    colleague = token_client(make_user(Role.OPERATOR))
    approved = colleague.post(f"/api/approvals/{approval['id']}/approve/", REASON, format="json")
    assert approved.status_code == 200, approved.content
    assert (approved.json()["state"], approved.json()["decider"]) == ("approved", colleague.user.get_username())
    assert Train.objects.get(pk=train.pk).state == "running"

    twice = colleague.post(f"/api/approvals/{approval['id']}/reject/", REASON, format="json")
    assert "already approved" in assert_error(twice, 409, "conflict")["detail"]


def test_a_viewer_cannot_decide_an_approval(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    request = {"kind": "emergency_train", "pool": pool.pk, "component": "gpu-driver", "version": "560.35.03", **REASON}
    approval = operator.post("/api/approvals/", request, format="json").json()
    viewer = token_client(make_user(Role.VIEWER))
    assert_error(viewer.post(f"/api/approvals/{approval['id']}/approve/", REASON, format="json"), 403)
    assert Approval.objects.get(pk=approval["id"]).state == "pending"


# Query counts of the list endpoints.


def test_an_exhausted_connection_pool_is_a_busy_503_with_retry_after_and_other_database_errors_are_not() -> None:
    from django.db import OperationalError
    from psycopg_pool import PoolTimeout

    from console.api.errors import exception_handler

    try:
        try:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")
        except PoolTimeout as timeout:
            raise OperationalError("couldn't get a connection") from timeout
    except OperationalError as error:
        busy = exception_handler(error, {})
    assert busy is not None
    assert (busy.status_code, busy.data["code"], busy["Retry-After"]) == (503, "busy", "2")
    assert "retry" in busy.data["detail"]
    assert exception_handler(OperationalError("server closed the connection unexpectedly"), {}) is None
