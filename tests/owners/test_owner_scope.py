"""The service owners' pages keep each owner to their own services; the update services refuse
what cannot be edited."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleet import services
from fleet.models import CapacityReservation, OptOutWindow
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.owners.helpers import counts, hours, make_reservation, make_window, window_data
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db


def _other_urls(other_service, fleet) -> list[str]:
    window = make_window(other_service)
    reservation = make_reservation(other_service, fleet[0])
    base = "/fleet/services/web-search"
    return [
        f"{base}/",
        f"{base}/optouts/new/",
        f"{base}/optouts/{window.pk}/edit/",
        f"{base}/optouts/{window.pk}/cancel/",
        f"{base}/reservations/new/",
        f"{base}/reservations/{reservation.pk}/edit/",
        f"{base}/reservations/{reservation.pk}/cancel/",
    ]


def test_a_service_owner_cannot_see_or_open_the_forms_of_another_owners_service(
    client, owner, service, other_service, fleet
) -> None:
    client.force_login(owner)
    for url in _other_urls(other_service, fleet):
        response = client.get(url)
        assert response.status_code == 404, url  # as the API answers: not in their scope
        assert "There is no service web-search among the services you own" in response.content.decode()


def test_a_service_owner_cannot_create_edit_or_cancel_anything_of_another_owners_service(
    client, owner, service, other_service, fleet
) -> None:
    urls = _other_urls(other_service, fleet)
    client.force_login(owner)
    before = counts()
    data = {"pool": fleet[0].pk, "min_hosts_in_service": 1, **window_data(reason="mine now")}
    for url in urls[1:]:
        response = client.post(url, data)
        assert response.status_code == 404, url
        assert "among the services you own" in response.content.decode()
    assert counts() == before
    assert not OptOutWindow.objects.filter(cancelled_at__isnull=False).exists()
    assert not CapacityReservation.objects.filter(cancelled_at__isnull=False).exists()


def test_a_service_owner_cannot_reach_another_owners_window_through_their_own_service(
    client, owner, service, other_service, fleet
) -> None:
    window = make_window(other_service)
    reservation = make_reservation(other_service, fleet[0])
    client.force_login(owner)
    before = counts()

    edit = client.post(f"/fleet/services/llm-train/optouts/{window.pk}/edit/", window_data(reason="mine"))
    cancel = client.post(f"/fleet/services/llm-train/reservations/{reservation.pk}/cancel/", {"reason": "mine"})

    assert edit.status_code == cancel.status_code == 404
    assert f"Service llm-train has no opt-out window #{window.pk}." in edit.content.decode()
    assert f"Service llm-train has no capacity reservation #{reservation.pk}." in cancel.content.decode()
    assert counts() == before


def test_an_unknown_service_is_not_found_and_says_so(client, owner) -> None:
    client.force_login(owner)
    response = client.get("/fleet/services/nope/optouts/new/")
    assert response.status_code == 404
    assert "There is no service nope" in response.content.decode()


# Operators.


def test_an_operator_manages_any_service(client, service, other_service, fleet) -> None:
    client.force_login(make_user(Role.OPERATOR))
    assert client.get("/fleet/services/web-search/").status_code == 200

    created = client.post("/fleet/services/web-search/optouts/new/", window_data(reason="ops maintenance freeze"))
    window = OptOutWindow.objects.get(service=other_service)
    edited = client.post(f"/fleet/services/web-search/optouts/{window.pk}/edit/", window_data(3, 7, "moved"))
    reserved = client.post(
        "/fleet/services/llm-train/reservations/new/",
        {"pool": fleet[0].pk, "min_hosts_in_service": 1, **window_data()},
    )
    reservation = CapacityReservation.objects.get(service=service)
    cancelled = client.post(f"/fleet/services/llm-train/reservations/{reservation.pk}/cancel/", {"reason": "done"})

    assert [r.status_code for r in (created, edited, reserved, cancelled)] == [302] * 4
    window.refresh_from_db()
    reservation.refresh_from_db()
    assert window.reason == "moved"
    assert reservation.cancelled_at is not None


def test_an_operator_asking_for_an_unknown_service_is_told_it_does_not_exist(client) -> None:
    client.force_login(make_user(Role.OPERATOR))
    response = client.get("/fleet/services/nope/")
    assert response.status_code == 404
    assert "There is no service nope." in response.content.decode()


# The update services themselves (the single writers the forms call).


def test_updating_a_finished_window_is_refused_with_the_reason(service) -> None:
    window = make_window(service, starts=1, ends=2)
    with clock.use_clock(lambda: hours(3)), pytest.raises(ValidationError) as refused:
        services.optout_window_update(window_id=window.pk, starts_at=hours(4), ends_at=hours(5), reason="again")
    assert "is already over (it ended at 2031-03-10 14:00 UTC)" in refused.value.messages[0]


def test_updating_a_window_without_a_change_records_no_event(service) -> None:
    window = make_window(service)
    before = Event.objects.count()
    services.optout_window_update(window_id=window.pk, starts_at=hours(2), ends_at=hours(6), reason="big run")
    assert Event.objects.count() == before


def test_updating_a_cancelled_reservation_is_refused_with_the_reason(service, fleet) -> None:
    reservation = make_reservation(service, fleet[0])
    services.reservation_cancel(reservation_id=reservation.pk, reason="off")
    with pytest.raises(ValidationError, match="was cancelled at"):
        services.reservation_update(
            reservation_id=reservation.pk, min_hosts_in_service=1, starts_at=hours(1), ends_at=hours(2), reason="x"
        )
