"""The trains and upgrades pages: what they show, who may pause, resume and ask to re-onboard, what a
refusal says, and that their query count does not grow with the number of trains or upgrades."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from dataclasses import replace
from html import escape

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from fleet.models import Component, HostState, InstalledVersion
from fleet.services import optout_window_create, service_place
from opsplanner import clock
from opsplanner.models import OPEN_TASK_STATES, Approval, ApprovalKind, ApprovalState, Event, HostTask, TaskState
from opsplanner.roles import Role
from tests.builders import make_fleet, make_service, make_version
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Train, TrainState, Upgrade, UpgradeState, Visit, VisitState
from trains.selectors import train_forecast
from trains.selectors_web import LIST_FORECAST_ROWS, phases_with_counts, trains_forecasts
from trains.services.offboarding import upgrade_offboard
from trains.services.tick import train_tick
from trains.services.trains import train_pause
from trains.services.upgrades import (
    upgrade_create,
    upgrade_phase_failures,
    upgrade_phase_successes,
)

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}
_versions = itertools.count(1)
REFUSED_TO_VIEWERS = "Your role does not allow you to run operations, trains and upgrades."


def train_with_a_skipped_domain(pool_name: str | None = None) -> tuple[Train, str]:
    """A running train in its first cycle: rack-0001 skipped under an opt-out window, rack-0002 visited."""
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2, pool_name=pool_name)
    service = make_service()
    service_place(service=service, hosts=[h for h in hosts if h.domain.name == "rack-0001"])
    now = clock.now()
    window = optout_window_create(
        service=service, starts_at=now - dt.timedelta(minutes=1), ends_at=now + dt.timedelta(hours=2), reason="launch"
    )
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)
    return train, f"opt-out window #{window.pk} of service {service.name}"


def offboarded_upgrade() -> Upgrade:
    """Offboarding withdraws the version, so each gets a bios version of its own."""
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    version = make_version(Component.objects.get(name="bios"), f"3.{next(_versions)}.0")
    upgrade = upgrade_create(pool=pool, component="bios", version=version.version, reason="rollout")
    with transaction.atomic():
        assert upgrade_offboard(upgrade=upgrade, reason="failed on 3 hosts in phase all")
    return upgrade


# --- the trains page --------------------------------------------------------------------------------
def test_the_trains_page_lists_each_train_with_its_cycle_forecast_and_skip_reasons(client) -> None:
    train, skip_reason = train_with_a_skipped_domain()
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/").content.decode()

    assert f'id="train-{train.pk}"' in page
    assert train.name in page
    assert train.pool.name in page
    assert 'data-state="running"' in page
    assert '<dd class="cycle-number">1</dd>' in page
    assert "0 / 3 domains visited" in page
    assert "meets its SLO" in page
    assert "Skipped this cycle" in page
    assert skip_reason in page
    # The forecast: the visit under way, then the other domains, each with its forecast start and end.
    for domain in ("rack-0001", "rack-0002", "rack-0003"):
        assert f'data-domain="{domain}"' in page
    assert 'class="domain visit-running" data-domain="rack-0002"' in page


def test_the_train_page_shows_every_domains_forecast_and_the_trains_events(client) -> None:
    train, skip_reason = train_with_a_skipped_domain()
    client.force_login(make_user(Role.VIEWER))

    page = client.get(f"/trains/{train.pk}/").content.decode()

    forecast = train_forecast(train)
    assert f'data-live-page="trains" data-live-params="{{&quot;train&quot;: {train.pk}}}"' in page
    assert f'id="train-{train.pk}-forecast"' in page
    for domain in forecast.domains:
        assert f'data-domain="{domain.domain}"' in page
    assert skip_reason in page
    assert "train.domain_skipped" in page
    assert "train.visit_started" in page
    assert client.get("/trains/999999/").status_code == 404


def test_the_list_shows_the_next_few_domains_and_the_train_page_all_of_them(client) -> None:
    pool, _ = make_fleet(domains=10, hosts_per_domain=1)
    train = make_train(pool)
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout")
    train_tick(train_id=train.pk)
    client.force_login(make_user(Role.VIEWER))

    listed = client.get("/trains/").content.decode()
    detail = client.get(f"/trains/{train.pk}/").content.decode()

    assert listed.count('<tr class="domain ') == LIST_FORECAST_ROWS
    assert f"The next {LIST_FORECAST_ROWS} of 10 domains still to visit" in listed
    assert detail.count('<tr class="domain ') == 10


def test_one_read_forecasts_every_kind_of_train_in_five_queries() -> None:
    instant_simulator()
    running, _ = train_with_a_skipped_domain()
    paused, _ = train_with_a_skipped_domain()
    train_pause(train_id=paused.pk, reason="vendor advisory", actor=make_user())
    driven_pool, _ = make_fleet(domains=3, hosts_per_domain=2)
    driven = make_train(driven_pool, visit_concurrency=2)
    upgrade_create(pool=driven_pool, component="bios", version="2.16.0", reason="rollout")
    drive_trains(driven_pool, until=lambda: Visit.objects.filter(train=driven, state=VisitState.DONE).exists())
    idle = make_train(make_fleet(domains=2, hosts_per_domain=1)[0])  # no upgrade: no cycle
    trains = list(Train.objects.filter(pk__in=[running.pk, paused.pk, driven.pk, idle.pk]))
    now = clock.now() + dt.timedelta(minutes=5)

    with CaptureQueriesContext(connection) as queries:
        together = trains_forecasts(trains, now=now)

    assert len(queries) == 5
    assert together[paused.pk].domains[0].skip_reason
    assert together[idle.pk].cycle is None
    assert together[idle.pk].cycle_end is None
    for domain in together[driven.pk].domains:
        if domain.state == VisitState.DONE:
            assert domain.last_visited_at == domain.ends_at, domain.domain
        else:
            assert domain.starts_at is not None, domain.domain
            assert domain.ends_at >= now, domain.domain
    assert together[driven.pk].cycle_end >= now
    # The single-train call is the same read for a list of one.
    assert train_forecast(driven, now=now) == together[driven.pk]

    # What the train tick and the upgrades' forecast read: the same times, without when each domain
    # was last visited, in one query fewer.
    with CaptureQueriesContext(connection) as queries:
        ahead = trains_forecasts(trains, now=now, last_visits=False)

    assert len(queries) == 4
    for train in trains:
        assert all(domain.last_visited_at is None for domain in ahead[train.pk].domains)
        unvisited = [replace(domain, last_visited_at=None) for domain in together[train.pk].domains]
        assert ahead[train.pk] == replace(together[train.pk], domains=unvisited)
    assert any(domain.last_visited_at for domain in together[driven.pk].domains)


def test_an_operator_pauses_a_train_with_a_reason_and_resumes_it(client) -> None:
    train, _ = train_with_a_skipped_domain()
    operator = make_user(Role.OPERATOR)
    client.force_login(operator)

    page = client.get("/trains/").content.decode()
    assert f'action="/trains/{train.pk}/pause/"' in page
    assert 'href="/approvals/"' in page  # the page's own `can` keeps the whole navigation
    response = client.post(f"/trains/{train.pk}/pause/", {"reason": "vendor advisory", "next": "/trains/"})

    assert response.status_code == 302
    assert response["Location"] == "/trains/"
    train.refresh_from_db()
    assert train.state == TrainState.PAUSED
    assert train.state_reason == "vendor advisory"
    assert Event.objects.filter(kind="train.paused", subject_id=train.pk, actor=operator.username).exists()
    followed = client.get("/trains/").content.decode()
    assert f"Train {train.name} paused: vendor advisory" in followed
    assert 'data-state="paused"' in followed

    # The same from HTMX: the status comes back with the new state, the actions with the notice.
    resumed = client.post(f"/trains/{train.pk}/resume/", {"reason": "advisory resolved"}, **HTMX)

    assert resumed.status_code == 200
    html = resumed.content.decode()
    assert f'<div id="train-{train.pk}" class="train-status" data-state="running"' in html
    assert f'id="train-{train.pk}-actions" class="train-actions" hx-swap-oob="true"' in html
    # The notice goes outside the list, where a live resync cannot wipe it.
    assert '<div id="trains-notice" class="page-notices" aria-live="polite" hx-swap-oob="true">' in html
    assert f"Train {train.name} resumed: advisory resolved" in html
    assert f'id="resume-reason-{train.pk}" name="reason" maxlength="500" required value=""' in html  # emptied
    train.refresh_from_db()
    assert train.state == TrainState.RUNNING
    assert Event.objects.filter(kind="train.resumed", subject_id=train.pk, actor=operator.username).exists()


def test_pausing_without_a_reason_is_refused_with_a_message_and_nothing_changes(client) -> None:
    train, _ = train_with_a_skipped_domain()
    client.force_login(make_user(Role.OPERATOR))
    events_before = Event.objects.count()

    response = client.post(f"/trains/{train.pk}/pause/", {"reason": "   "}, follow=True)

    assert "Nothing changed: Say why the train is paused." in response.content.decode()
    htmx = client.post(f"/trains/{train.pk}/pause/", {"reason": ""}, **HTMX).content.decode()
    assert "Nothing changed: Say why the train is paused." in htmx
    assert 'role="alert"' in htmx
    train.refresh_from_db()
    assert train.state == TrainState.RUNNING
    assert Event.objects.count() == events_before


def test_resuming_a_running_train_is_refused_with_the_reason_and_the_typed_reason_is_kept(client) -> None:
    train, _ = train_with_a_skipped_domain()
    client.force_login(make_user(Role.OPERATOR))

    html = client.post(f"/trains/{train.pk}/resume/", {"reason": "just in case"}, **HTMX).content.decode()

    assert f"Nothing changed: Train {train.name} is running; only a paused or autostopped train resumes." in html
    assert 'value="just in case"' in html
    assert f'id="resume-reason-{train.pk}" name="reason" maxlength="500" required hx-preserve' in html  # kept as typed
    train.refresh_from_db()
    assert train.state == TrainState.RUNNING


def test_a_viewer_sees_no_pause_or_resume_buttons_and_their_post_is_refused(client) -> None:
    train, _ = train_with_a_skipped_domain()
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/").content.decode()
    detail = client.get(f"/trains/{train.pk}/").content.decode()
    response = client.post(f"/trains/{train.pk}/pause/", {"reason": "I want to"})

    for html in (page, detail):
        assert "pause-form" not in html
        assert "resume-form" not in html
        assert "train-actions" not in html
    assert response.status_code == 403
    assert REFUSED_TO_VIEWERS in response.content.decode()
    train.refresh_from_db()
    assert train.state == TrainState.RUNNING
    assert not Event.objects.filter(kind="train.paused").exists()


def test_pause_and_resume_only_accept_a_post(client) -> None:
    train, _ = train_with_a_skipped_domain()
    client.force_login(make_user(Role.OPERATOR))
    assert client.get(f"/trains/{train.pk}/pause/").status_code == 405
    assert client.post("/trains/999999/pause/", {"reason": "x"}).status_code == 404


def test_an_executor_gets_neither_page(client) -> None:
    client.force_login(make_user(Role.EXECUTOR))
    assert client.get("/trains/").status_code == 403
    assert client.get("/trains/upgrades/").status_code == 403


# --- the upgrades page ------------------------------------------------------------------------------
def test_the_upgrades_page_shows_each_phase_with_its_successes_and_failures_and_the_offboarding_reason(
    client,
) -> None:
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"failure_rate": 1.0}})
    good_pool, _ = make_fleet(domains=2, hosts_per_domain=3, failure_buffer_hosts=4)
    bad_pool, _ = make_fleet(domains=2, hosts_per_domain=3, failure_buffer_hosts=4)
    make_train(good_pool)
    make_train(bad_pool)
    canary = [{"name": "canary", "domain": "rack-0001", "min_successes": 3}, {"name": "all", "percent": 100}]
    good = upgrade_create(pool=good_pool, component="bios", version="2.16.0", reason="rollout", phases=canary)
    bad = upgrade_create(
        pool=bad_pool, component="gpu-driver", version="560.35.03", reason="rollout", phases=canary, max_failures=1
    )
    drive_trains(
        good_pool,
        bad_pool,
        until=lambda: (
            Upgrade.objects.get(pk=bad.pk).state == UpgradeState.OFFBOARDED
            and Upgrade.objects.get(pk=good.pk).current_phase == 1
        ),
    )
    good.refresh_from_db()
    bad.refresh_from_db()
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/upgrades/").content.decode()

    good_canary, bad_canary = good.phases.get(position=0), bad.phases.get(position=0)
    assert upgrade_phase_successes(good, 0) == 3
    assert upgrade_phase_failures(good, good_canary) == 0
    assert upgrade_phase_failures(bad, bad_canary) >= 2
    assert f'id="upgrade-{good.pk}"' in page
    assert "bios → 2.16.0" in page
    assert "gpu-driver → 560.35.03" in page
    assert '<td class="num successes">3 / 3</td>' in page
    assert f'<td class="num failures bad">{upgrade_phase_failures(bad, bad_canary)}</td>' in page
    assert "failed in phase canary" in bad.state_reason
    assert f'<span class="offboard-reason">{bad.state_reason}</span>' in page
    # Offboarded upgrades come first: they wait for a decision.
    assert page.index(f'id="upgrade-{bad.pk}"') < page.index(f'id="upgrade-{good.pk}"')


def test_a_phase_success_is_a_host_back_in_service_at_or_beyond_the_target_counted_once() -> None:
    # One definition (trains.services.upgrades.phase_successes), used by the tick and the pages.
    instant_simulator(execute_by_kind={"upgrade:gpu-driver:560.35.03": {"failure_rate": 0.5}})
    pool, _ = make_fleet(domains=2, hosts_per_domain=4, failure_buffer_hosts=8)
    make_train(pool)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", max_failures=100)
    drive_trains(
        pool,
        until=lambda: (
            Visit.objects.filter(state=VisitState.DONE).count() >= 2
            and not HostTask.objects.filter(state__in=OPEN_TASK_STATES).exists()
        ),
    )
    target = upgrade.component_version
    at_target = set(
        InstalledVersion.objects.filter(
            component_id=target.component_id, version__sort_key__gte=target.sort_key
        ).values_list("host_id", flat=True)
    )
    finished = HostTask.objects.filter(
        operation__visit_link__upgrade=upgrade, state__in=[TaskState.DONE, TaskState.HANDED_OVER]
    )
    expected = {t.host_id for t in finished.select_related("host") if t.host.state == HostState.IN_SERVICE} & at_target
    (phase,) = phases_with_counts([upgrade.pk])
    assert phase.successes == len(expected) == upgrade_phase_successes(upgrade, 0)
    assert phase.failures >= 1
    # A host whose install failed catches up after its repair (trains/services/catch_up.py): if that
    # succeeds it has a failed task and a done one and counts once; a host whose every try failed
    # is no success. Every host ends in service (the repairs succeed).
    failed = set(
        HostTask.objects.filter(operation__visit_link__upgrade=upgrade, state=TaskState.FAILED).values_list(
            "host_id", flat=True
        )
    )
    never = failed - {t.host_id for t in finished}
    assert failed
    assert not never & expected
    assert phase.successes == 8 - len(never)


def test_reonboarding_asks_for_an_approval_and_the_page_then_says_it_is_waiting(client) -> None:
    upgrade = offboarded_upgrade()
    operator = make_user(Role.OPERATOR)
    client.force_login(operator)

    before = client.get("/trains/upgrades/").content.decode()
    assert f'action="/trains/upgrades/{upgrade.pk}/reonboard/"' in before
    assert 'data-reonboard="none"' in before
    html = client.post(f"/trains/upgrades/{upgrade.pk}/reonboard/", {"reason": "vendor fixed it"}, **HTMX)

    approval = Approval.objects.get()
    assert approval.kind == ApprovalKind.REONBOARD_UPGRADE
    assert approval.subject_type == "trains.upgrade"
    assert approval.subject_id == upgrade.pk
    assert approval.state == ApprovalState.PENDING
    assert approval.requested_by == operator
    assert f"approval #{approval.pk}" in html.content.decode()
    page = client.get("/trains/upgrades/").content.decode()
    assert 'data-reonboard="pending"' in page
    assert f"Re-onboarding requested by {operator.username}, waiting for approval" in page
    assert "approval.requested" in client.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()
    # Asking twice is refused with the reason; still one request.
    again = client.post(f"/trains/upgrades/{upgrade.pk}/reonboard/", {"reason": "again"}, follow=True)
    assert "Nothing was requested: A request for this is already pending." in again.content.decode()
    assert Approval.objects.count() == 1
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED


def test_reonboarding_without_a_reason_or_of_an_active_upgrade_is_refused_with_the_reason(client) -> None:
    upgrade = offboarded_upgrade()
    active = upgrade_create(pool=make_fleet()[0], component="bios", version="2.14.0", reason="pin")
    client.force_login(make_user(Role.OPERATOR))

    no_reason = client.post(f"/trains/upgrades/{upgrade.pk}/reonboard/", {"reason": " "}, **HTMX).content.decode()
    not_offboarded = client.post(f"/trains/upgrades/{active.pk}/reonboard/", {"reason": "why not"}, follow=True)

    assert "Nothing was requested: Say why this is needed." in no_reason
    assert (
        f"Nothing was requested: Upgrade #{active.pk} is active; only an offboarded upgrade is re-onboarded."
        in not_offboarded.content.decode()
    )
    assert not Approval.objects.exists()


def test_a_viewer_sees_no_reonboard_button_and_their_post_is_refused(client) -> None:
    upgrade = offboarded_upgrade()
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/upgrades/").content.decode()
    detail = client.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()
    response = client.post(f"/trains/upgrades/{upgrade.pk}/reonboard/", {"reason": "please"})

    for html in (page, detail):
        assert "reonboard-form" not in html
        assert "failed on 3 hosts in phase all" in html
    assert response.status_code == 403
    assert REFUSED_TO_VIEWERS in response.content.decode()
    assert not Approval.objects.exists()


def test_the_upgrades_page_filters_by_state(client) -> None:
    offboarded = offboarded_upgrade()
    active = upgrade_create(pool=make_fleet()[0], component="bios", version="2.14.0", reason="pin")
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/upgrades/?state=offboarded").content.decode()

    assert f'id="upgrade-{offboarded.pk}"' in page
    assert f'id="upgrade-{active.pk}"' not in page
    # The live params are JSON inside a double-quoted attribute: escaped, so the attribute stays whole.
    assert f'data-live-params="{escape(json.dumps({"view": "upgrades", "state": "offboarded"}))}"' in page
    assert client.get("/trains/upgrades/?state=bogus").status_code == 200


# --- query counts -----------------------------------------------------------------------------------
def queries_for(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def test_the_trains_page_costs_the_same_queries_for_six_trains_as_for_two(
    client, django_assert_max_num_queries
) -> None:
    client.force_login(make_user(Role.OPERATOR))
    for _ in range(2):
        train_with_a_skipped_domain()
    for_two = queries_for(client, "/trains/")
    for _ in range(4):
        train_with_a_skipped_domain()
    # session, user, roles, pending approvals (an operator's nav), trains, open cycles, recent visit
    # lengths, last visits, current visits, stops
    with django_assert_max_num_queries(min(for_two, 10)):
        assert client.get("/trains/").content.decode().count('class="train-status"') == 6


def test_the_upgrades_page_costs_the_same_queries_for_six_upgrades_as_for_two(
    client, django_assert_max_num_queries
) -> None:
    client.force_login(make_user(Role.OPERATOR))
    for _ in range(2):
        offboarded_upgrade()
    for_two = queries_for(client, "/trains/upgrades/")
    for _ in range(2):
        offboarded_upgrade()
    pool = make_fleet(domains=2)[0]
    phases = [{"name": "canary", "domain": "rack-0001"}, {"name": "all", "percent": 100}]
    upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", phases=phases)
    upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout", phases=phases)
    # session, user, roles, pending approvals (an operator's nav), upgrades, phases with their counts,
    # pending re-onboarding requests; the active upgrades' forecast (trains, upgrades: no train here)
    with django_assert_max_num_queries(min(for_two, 7) + 2):
        assert client.get("/trains/upgrades/").content.decode().count('class="upgrade-status"') == 6
