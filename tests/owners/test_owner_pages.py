"""The service owners' pages: their services, when trains will next visit their hosts, and the forms
that register, edit and cancel opt-out windows and capacity reservations (Django test client)."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from fleet import services
from fleet.models import CapacityReservation, OptOutWindow
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.builders import make_fleet, make_service
from tests.owners.helpers import NOW, counts, field_block, hours, make_reservation, make_window, window_data
from tests.trains_builders import make_train, make_user

pytestmark = pytest.mark.django_db


# Who may see the pages.


def test_the_services_page_asks_for_a_login(client) -> None:
    response = client.get("/fleet/services/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_a_viewer_is_refused_the_services_pages_with_the_reason(client, service) -> None:
    client.force_login(make_user(Role.VIEWER))
    for url in ("/fleet/services/", "/fleet/services/llm-train/", "/fleet/services/llm-train/optouts/new/"):
        response = client.get(url)
        assert response.status_code == 403, url
        assert "does not allow you to manage services" in response.content.decode()
    before = counts()
    assert client.post("/fleet/services/llm-train/optouts/new/", window_data()).status_code == 403
    assert counts() == before


def test_a_service_owner_sees_only_the_services_they_own_with_their_live_windows(
    client, owner, service, other_service, fleet
) -> None:
    make_window(service, reason="model launch")
    make_reservation(service, fleet[0], hosts=3)
    cancelled = make_window(service, reason="scrapped plan")
    services.optout_window_cancel(window_id=cancelled.pk, reason="no longer needed")
    make_window(other_service, reason="secret")
    client.force_login(owner)

    page = client.get("/fleet/services/").content.decode()

    assert 'id="service-llm-train"' in page
    assert 'href="/fleet/services/llm-train/"' in page
    assert "web-search" not in page
    assert "2031-03-10 14:00 → 2031-03-10 18:00" in page  # the live window
    assert "3 in ai-train-east" in page
    assert page.count('class="window') == 2  # the cancelled window is not live


def test_an_operator_sees_every_service(client, service, other_service) -> None:
    client.force_login(make_user(Role.OPERATOR))
    page = client.get("/fleet/services/").content.decode()
    assert 'id="service-llm-train"' in page
    assert 'id="service-web-search"' in page


def test_the_services_page_costs_the_same_queries_for_more_services(
    client, owner, fleet, django_assert_max_num_queries
) -> None:
    for n in range(4):
        service = make_service(name=f"svc-{n}", owners=[owner])
        make_window(service)
        make_reservation(service, fleet[0])
    client.force_login(owner)
    # session, user, roles, owned ids, services, owners, windows, reservations (with pools)
    with django_assert_max_num_queries(9):
        assert client.get("/fleet/services/").status_code == 200


# When trains will next visit.


def test_the_service_page_shows_when_a_running_train_will_next_visit_its_hosts(client, owner, service, fleet) -> None:
    train = make_train(fleet[0], visit_estimate_s=3600)  # no cycle yet: rack-0001 now, then rack-0002
    client.force_login(owner)

    page = client.get("/fleet/services/llm-train/").content.decode()

    assert f"Train <strong>{train.name}</strong> is expected to visit domain" in page
    assert "<strong>rack-0002</strong>" in page
    assert 'datetime="2031-03-10T13:00:00+00:00">2031-03-10 13:00</time> to' in page
    assert 'datetime="2031-03-10T14:00:00+00:00">2031-03-10 14:00</time> UTC.' in page
    row = re.search(r'<tr class="visit[^"]*" data-domain="rack-0002">(.*?)</tr>', page, re.S).group(1)
    assert train.name in row
    assert '<td class="starts">2031-03-10 13:00</td>' in row
    assert '<td class="ends">2031-03-10 14:00</td>' in row
    assert 'data-domain="rack-0001"' not in page  # the service has no hosts there


def test_the_service_page_shows_a_skip_reason_and_an_overlapping_opt_out_window(client, owner, service, fleet) -> None:
    from trains.models import Cycle, Visit

    train = make_train(fleet[0], visit_estimate_s=3600)
    cycle = Cycle.objects.create(train=train, number=1, started_at=NOW, deadline_at=hours(24 * 7))
    stop = train.stops.get(domain__name="rack-0002")
    Visit.objects.create(
        train=train, cycle=cycle, domain=stop.domain, position=stop.position, skip_reason="opt-out of llm-train"
    )
    window = make_window(service, starts=0.5, ends=1.5)
    client.force_login(owner)

    page = client.get("/fleet/services/llm-train/").content.decode()

    assert "Skipped: opt-out of llm-train" in page
    assert f"Overlaps your opt-out window #{window.pk}" in page


def test_the_service_page_says_when_its_hosts_are_being_visited_now(client, owner, service, fleet) -> None:
    from trains.models import Cycle, Visit, VisitState

    train = make_train(fleet[0], visit_estimate_s=3600)
    cycle = Cycle.objects.create(train=train, number=1, started_at=hours(-1), deadline_at=hours(24 * 7))
    stop = train.stops.get(domain__name="rack-0002")
    Visit.objects.create(
        train=train,
        cycle=cycle,
        domain=stop.domain,
        position=stop.position,
        state=VisitState.RUNNING,
        started_at=hours(-0.5),
    )
    client.force_login(owner)

    page = client.get("/fleet/services/llm-train/").content.decode()

    assert f"Train <strong>{train.name}</strong> is visiting domain <strong>rack-0002</strong> now" in page
    assert "since 2031-03-10 11:30, expected until 2031-03-10 12:30 UTC" in page


def test_the_service_page_says_a_paused_trains_times_assume_it_resumes(client, owner, service, fleet) -> None:
    from trains.models import Train, TrainState

    train = make_train(fleet[0], visit_estimate_s=3600)
    Train.objects.filter(pk=train.pk).update(state=TrainState.PAUSED, state_reason="change freeze")
    client.force_login(owner)

    page = client.get("/fleet/services/llm-train/").content.decode()

    assert "UTC, if it resumes now (it is paused: change freeze)." in page


def test_the_service_page_says_so_when_no_train_visits_its_hosts(client, owner, service) -> None:
    client.force_login(owner)
    page = client.get("/fleet/services/llm-train/").content.decode()
    assert "No train is expected to visit this service's hosts" in page
    assert "No train runs on pool ai-train-east" in page


def test_the_service_page_says_so_when_the_service_runs_nowhere(client, owner) -> None:
    make_service(name="idle", owners=[owner])
    client.force_login(owner)
    page = client.get("/fleet/services/idle/").content.decode()
    assert "This service runs on no hosts" in page


def test_the_service_page_greys_cancelled_windows_and_hides_finished_ones(client, owner, service, fleet) -> None:
    live = make_window(service, reason="live one")
    cancelled = make_window(service, reason="cancelled one")
    services.optout_window_cancel(window_id=cancelled.pk, reason="changed plans")
    with clock.use_clock(lambda: NOW - dt.timedelta(days=2)):
        make_window(service, starts=-40, ends=-30, reason="long over")
    reservation = make_reservation(service, fleet[0])
    client.force_login(owner)

    page = client.get("/fleet/services/llm-train/").content.decode()

    assert f'<tr id="optout-{live.pk}" class="upcoming">' in page
    assert f'<tr id="optout-{cancelled.pk}" class="cancelled">' in page
    assert f"/optouts/{live.pk}/edit/" in page
    assert f"/optouts/{cancelled.pk}/edit/" not in page  # no buttons on a cancelled window
    assert "long over" not in page
    assert f'<tr id="reservation-{reservation.pk}" class="upcoming">' in page


# Opt-out windows: register, edit, cancel.


def test_a_service_owner_registers_an_opt_out_window(client, owner, service) -> None:
    client.force_login(owner)
    form = client.get("/fleet/services/llm-train/optouts/new/").content.decode()
    assert 'type="datetime-local"' in form
    assert "Times are in UTC." in form

    response = client.post("/fleet/services/llm-train/optouts/new/", window_data(reason="quarterly run"))

    assert response.status_code == 302
    assert response["Location"] == "/fleet/services/llm-train/"
    window = OptOutWindow.objects.get(service=service)
    assert (window.starts_at, window.ends_at, window.reason) == (hours(2), hours(6), "quarterly run")
    assert window.created_by == owner
    event = Event.objects.get(kind="optout_window.created")
    assert event.actor == owner.username
    page = client.get(response["Location"]).content.decode()
    assert f"Opt-out window #{window.pk} registered." in page
    assert f'id="optout-{window.pk}"' in page


def test_a_form_posted_with_htmx_redirects_the_browser_on_success(client, owner, service) -> None:
    client.force_login(owner)
    response = client.post("/fleet/services/llm-train/optouts/new/", window_data(), headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/fleet/services/llm-train/"
    assert OptOutWindow.objects.filter(service=service).count() == 1


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (window_data(starts=6, ends=2), "ends_at", "The end must be after the start."),
        (window_data(starts=-10, ends=-5), "ends_at", "This window is already over"),
        (window_data(reason="  "), "reason", "Say why"),
        ({**window_data(), "starts_at": "tomorrow"}, "starts_at", "Enter a valid date/time."),
    ],
    ids=["end-before-start", "in-the-past", "empty-reason", "not-a-time"],
)
def test_a_bad_opt_out_window_is_refused_next_to_its_field_and_nothing_is_written(
    client, owner, service, data, field, message
) -> None:
    client.force_login(owner)
    before = counts()

    response = client.post("/fleet/services/llm-train/optouts/new/", data)

    assert response.status_code == 200
    page = response.content.decode()
    assert message in field_block(page, field)
    assert 'aria-invalid="true"' in field_block(page, field)
    assert counts() == before


def test_an_htmx_post_gets_only_the_form_back_with_the_error_inline(client, owner, service) -> None:
    client.force_login(owner)
    before = counts()

    response = client.post(
        "/fleet/services/llm-train/optouts/new/", window_data(starts=6, ends=2), headers={"HX-Request": "true"}
    )

    page = response.content.decode()
    assert response.status_code == 200  # htmx swaps 2xx answers only
    assert page.lstrip().startswith("{#") or page.lstrip().startswith("<form")
    assert "<html" not in page
    assert "The end must be after the start." in field_block(page, "ends_at")
    assert counts() == before


def test_a_service_owner_edits_an_opt_out_window(client, owner, service) -> None:
    window = make_window(service)
    client.force_login(owner)
    form = client.get(f"/fleet/services/llm-train/optouts/{window.pk}/edit/").content.decode()
    assert 'value="2031-03-10T14:00"' in form  # the current start, in UTC

    response = client.post(f"/fleet/services/llm-train/optouts/{window.pk}/edit/", window_data(3, 8, "moved"))

    assert response.status_code == 302
    window.refresh_from_db()
    assert (window.starts_at, window.ends_at, window.reason) == (hours(3), hours(8), "moved")
    event = Event.objects.get(kind="optout_window.updated")
    assert event.subject_id == window.pk
    assert event.data["before"]["reason"] == "big run"


def test_editing_an_opt_out_window_into_the_past_is_refused_inline(client, owner, service) -> None:
    window = make_window(service)
    client.force_login(owner)
    before = counts()

    response = client.post(f"/fleet/services/llm-train/optouts/{window.pk}/edit/", window_data(-9, -8))

    assert "This window is already over" in field_block(response.content.decode(), "ends_at")
    window.refresh_from_db()
    assert window.starts_at == hours(2)
    assert counts() == before


def test_editing_a_cancelled_opt_out_window_is_refused_with_the_reason(client, owner, service) -> None:
    window = make_window(service)
    services.optout_window_cancel(window_id=window.pk, reason="off")
    client.force_login(owner)
    before = counts()

    response = client.post(f"/fleet/services/llm-train/optouts/{window.pk}/edit/", window_data(3, 8, "again"))

    page = response.content.decode()
    assert f"Opt-out window #{window.pk} was cancelled at 2031-03-10 12:00 UTC and cannot be edited" in page
    window.refresh_from_db()
    assert window.reason == "big run"
    assert counts() == before


def test_a_service_owner_cancels_an_opt_out_window_giving_a_reason(client, owner, service) -> None:
    window = make_window(service)
    client.force_login(owner)
    url = f"/fleet/services/llm-train/optouts/{window.pk}/cancel/"
    assert 'name="reason"' in client.get(url).content.decode()

    no_reason = client.post(url, {"reason": ""})
    assert "Say why" in field_block(no_reason.content.decode(), "reason")
    window.refresh_from_db()
    assert window.cancelled_at is None

    response = client.post(url, {"reason": "training moved to April"})

    assert response.status_code == 302
    window.refresh_from_db()
    assert window.cancelled_at == NOW
    assert Event.objects.get(kind="optout_window.cancelled").reason == "training moved to April"


def test_cancelling_an_already_cancelled_window_says_so(client, owner, service) -> None:
    window = make_window(service)
    services.optout_window_cancel(window_id=window.pk, reason="first")
    client.force_login(owner)
    before = counts()
    response = client.post(f"/fleet/services/llm-train/optouts/{window.pk}/cancel/", {"reason": "second"})
    assert f"Opt-out window #{window.pk} was already cancelled." in response.content.decode()
    assert counts() == before


# Capacity reservations: register, edit, cancel.


def test_a_service_owner_reserves_capacity_in_a_pool(client, owner, service, fleet) -> None:
    pool = fleet[0]
    make_fleet(domains=1, hosts_per_domain=2, pool_name="aaa-elsewhere")
    client.force_login(owner)
    form = client.get("/fleet/services/llm-train/reservations/new/").content.decode()
    # The pool the service runs in comes first (and is preselected), with its size.
    assert form.index("ai-train-east (6 hosts)") < form.index("aaa-elsewhere (2 hosts)")

    response = client.post(
        "/fleet/services/llm-train/reservations/new/",
        {"pool": pool.pk, "min_hosts_in_service": 4, **window_data(reason="launch week")},
    )

    assert response.status_code == 302
    reservation = CapacityReservation.objects.get(service=service)
    assert (reservation.pool, reservation.min_hosts_in_service, reservation.reason) == (pool, 4, "launch week")
    assert Event.objects.get(kind="reservation.created").pool_id == pool.pk


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"min_hosts_in_service": 7}, "min_hosts_in_service", "Pool ai-train-east has only 6 hosts; cannot reserve 7."),
        ({"min_hosts_in_service": 0}, "min_hosts_in_service", "greater than or equal to 1"),
        (window_data(starts=6, ends=2), "ends_at", "The end must be after the start."),
        (window_data(starts=-10, ends=-5), "ends_at", "This window is already over"),
        ({"reason": ""}, "reason", "Say why"),
        ({"pool": 999_999}, "pool", "There is no such pool"),
    ],
    ids=["more-than-the-pool", "zero-hosts", "end-before-start", "in-the-past", "empty-reason", "unknown-pool"],
)
def test_a_bad_reservation_is_refused_next_to_its_field_and_nothing_is_written(
    client, owner, service, fleet, data, field, message
) -> None:
    client.force_login(owner)
    before = counts()

    response = client.post(
        "/fleet/services/llm-train/reservations/new/",
        {"pool": fleet[0].pk, "min_hosts_in_service": 2, **window_data(), **data},
    )

    assert response.status_code == 200
    assert message in field_block(response.content.decode(), field)
    assert counts() == before


def test_a_service_owner_edits_a_reservation_but_not_beyond_the_pool(client, owner, service, fleet) -> None:
    reservation = make_reservation(service, fleet[0], hosts=2)
    client.force_login(owner)
    url = f"/fleet/services/llm-train/reservations/{reservation.pk}/edit/"
    assert 'name="pool"' not in client.get(url).content.decode()  # the pool stays
    before = counts()

    too_many = client.post(url, {"min_hosts_in_service": 9, **window_data()})

    assert "cannot reserve 9" in field_block(too_many.content.decode(), "min_hosts_in_service")
    assert counts() == before

    response = client.post(url, {"min_hosts_in_service": 5, **window_data(1, 9, "bigger launch")})

    assert response.status_code == 302
    reservation.refresh_from_db()
    assert (reservation.min_hosts_in_service, reservation.ends_at, reservation.reason) == (5, hours(9), "bigger launch")
    event = Event.objects.get(kind="reservation.updated")
    assert event.pool_id == fleet[0].pk
    assert event.data["before"]["min_hosts_in_service"] == 2


def test_a_service_owner_cancels_a_reservation_giving_a_reason(client, owner, service, fleet) -> None:
    reservation = make_reservation(service, fleet[0])
    client.force_login(owner)
    url = f"/fleet/services/llm-train/reservations/{reservation.pk}/cancel/"
    assert "Hosts kept in service" in client.get(url).content.decode()

    response = client.post(url, {"reason": "launch postponed"})

    assert response.status_code == 302
    reservation.refresh_from_db()
    assert reservation.cancelled_at == NOW
    event = Event.objects.get(kind="reservation.cancelled")
    assert (event.reason, event.pool_id) == ("launch postponed", fleet[0].pk)


# Another owner's service.
