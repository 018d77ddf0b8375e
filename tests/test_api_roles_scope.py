"""Who may act on whose objects through the REST API, beyond the role matrix of test_api_roles.py:
a service owner's windows and reservations (another owner's do not exist for them), an executor's
work items (only its own claims, only external adapters), and an approval its requester may not decide."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import transaction
from django.test import override_settings

from fleet.models import CapacityReservation, OptOutWindow
from opsplanner.models import WorkItem
from opsplanner.roles import Role
from tests.api_helpers import token_client
from tests.test_api_roles import FAST_HASHER, REASON, World, reservation_body, window_body
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = FAST_HASHER


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker) -> Iterator[World]:
    """The role matrix's world, built once for this module and rolled back at its end."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHER), transaction.atomic():
        yield World()
        transaction.set_rollback(True)


# --- a service owner and another owner's windows and reservations ----------------------------------
WINDOW_KINDS = [("optout-windows", "window", "their_window"), ("reservations", "reservation", "their_reservation")]


@pytest.mark.parametrize(("path", "mine", "theirs"), WINDOW_KINDS)
def test_a_service_owner_lists_only_the_windows_of_services_they_own(
    world: World, path: str, mine: str, theirs: str
) -> None:
    ids = [row["id"] for row in world.client(Role.SERVICE_OWNER).get(f"/api/{path}/").json()["results"]]
    assert ids == [getattr(world, mine).pk]


@pytest.mark.parametrize(("path", "mine", "theirs"), WINDOW_KINDS)
def test_operators_and_viewers_list_every_window(world: World, path: str, mine: str, theirs: str) -> None:
    expected = {getattr(world, mine).pk, getattr(world, theirs).pk}
    for role in (Role.OPERATOR, Role.VIEWER):
        ids = {row["id"] for row in world.client(role).get(f"/api/{path}/").json()["results"]}
        assert ids == expected, role


@pytest.mark.parametrize(("path", "mine", "theirs"), WINDOW_KINDS)
def test_another_owners_window_does_not_exist_for_a_service_owner(
    world: World, path: str, mine: str, theirs: str
) -> None:
    theirs_id = getattr(world, theirs).pk
    client = world.client(Role.SERVICE_OWNER)
    response = client.get(f"/api/{path}/{theirs_id}/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found.", "code": "not_found"}
    filtered = client.get(f"/api/{path}/", {"service": world.their_service.pk}).json()
    assert filtered["results"] == []


@pytest.mark.parametrize(("path", "mine", "theirs"), WINDOW_KINDS)
def test_a_service_owner_cannot_cancel_another_owners_window(world: World, path: str, mine: str, theirs: str) -> None:
    window = getattr(world, theirs)
    response = world.client(Role.SERVICE_OWNER).post(f"/api/{path}/{window.pk}/cancel/", REASON, format="json")
    assert response.status_code == 404
    assert set(response.json()) == {"detail", "code"}
    window.refresh_from_db()
    assert window.cancelled_at is None


@pytest.mark.parametrize(("path", "mine", "theirs"), WINDOW_KINDS)
def test_a_service_owner_cancels_their_own_window(world: World, path: str, mine: str, theirs: str) -> None:
    window = getattr(world, mine)
    response = world.client(Role.SERVICE_OWNER).post(f"/api/{path}/{window.pk}/cancel/", REASON, format="json")
    assert response.status_code == 200
    assert response.json()["cancelled_at"] is not None
    window.refresh_from_db()
    assert window.cancelled_at is not None


def test_an_operator_cancels_any_owners_window(world: World) -> None:
    response = world.client(Role.OPERATOR).post(
        f"/api/optout-windows/{world.their_window.pk}/cancel/", REASON, format="json"
    )
    assert response.status_code == 200
    assert response.json()["cancelled_at"] is not None


@pytest.mark.parametrize(
    ("path", "body"),
    [("optout-windows", window_body), ("reservations", reservation_body)],
    ids=["window", "reservation"],
)
def test_a_service_owner_cannot_create_a_window_for_a_service_they_do_not_own(world: World, path: str, body) -> None:
    model = OptOutWindow if path == "optout-windows" else CapacityReservation
    before = model.objects.count()
    request = {**body(world), "service": world.their_service.pk}
    response = world.client(Role.SERVICE_OWNER).post(f"/api/{path}/", request, format="json")
    assert response.status_code == 400
    message = f"There is no service #{world.their_service.pk} that you own."
    assert response.json() == {"detail": f"service: {message}", "code": "invalid", "errors": {"service": [message]}}
    assert model.objects.count() == before


def test_a_service_owner_creates_a_window_for_their_service_recorded_as_theirs(world: World) -> None:
    response = world.client(Role.SERVICE_OWNER).post("/api/optout-windows/", window_body(world), format="json")
    assert response.status_code == 201
    body = response.json()
    assert (body["service"], body["service_name"]) == (world.owned_service.pk, world.owned_service.name)
    assert body["created_by"] == world.users[Role.SERVICE_OWNER].username


def test_an_executor_cannot_read_windows_at_all(world: World) -> None:
    assert world.client(Role.EXECUTOR).get(f"/api/optout-windows/{world.window.pk}/").status_code == 403


# --- an executor's work items ---------------------------------------------------------------------
def test_an_executor_sees_only_external_work_items(world: World) -> None:
    items = world.client(Role.EXECUTOR).get("/api/work-items/").json()["results"]
    assert items
    assert {item["adapter"] for item in items} == {"external"}


def test_work_items_claimed_through_the_api_are_claimed_by_the_calling_user(world: World) -> None:
    client = world.client(Role.EXECUTOR)
    (item,) = client.post("/api/work-items/claim/", {"limit": 1, "worker": "proc-7"}, format="json").json()
    assert item["claimed_by"] == f"{world.users[Role.EXECUTOR].username}/proc-7"
    assert WorkItem.objects.get(pk=item["id"]).state == "running"


def test_another_executor_can_neither_heartbeat_nor_report_an_item_it_did_not_claim(world: World) -> None:
    stranger = token_client(make_user(Role.EXECUTOR))
    path = f"/api/work-items/{world.work_item.pk}"
    heartbeat = stranger.post(f"{path}/heartbeat/", {"attempt": 1}, format="json")
    report = stranger.post(
        f"{path}/report/", {"outcome": "done", "attempt": 1}, format="json", headers={"Idempotency-Key": "k"}
    )
    for response in (heartbeat, report):
        assert response.status_code == 409
        assert response.json()["code"] == "conflict"
        assert "not for" in response.json()["detail"]
    world.work_item.refresh_from_db()
    assert (world.work_item.state, world.work_item.claimed_by) == ("running", world.users[Role.EXECUTOR].username)


# --- an approval and its requester -----------------------------------------------------------------
def test_the_requester_of_an_approval_cannot_decide_it(world: World) -> None:
    client = token_client(world.other_operator)
    for decision in ("approve", "reject"):
        response = client.post(f"/api/approvals/{world.approval.pk}/{decision}/", REASON, format="json")
        assert response.status_code == 403
        assert response.json()["code"] == "self_approval"
    world.approval.refresh_from_db()
    assert world.approval.state == "pending"
