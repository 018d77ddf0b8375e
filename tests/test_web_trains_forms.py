"""The operators' train and upgrade forms through Django's test client: each writes through the same
service as the API, a refusal is shown next to its field (or above the form) and writes nothing,
and only operators see the links and buttons or may post. `train_update` is tested here too."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ValidationError
from django.test import Client

from fleet.models import ComponentVersion
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.test_security import database_state
from tests.trains_builders import make_train, make_user
from trains.models import Train, TrainState, Upgrade, UpgradeState
from trains.services.emergency import emergency_train_request
from trains.services.trains import train_pause, train_update
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db
WEEK = 7 * 24 * 3600


def operator() -> Client:
    client = Client()
    client.force_login(make_user(Role.OPERATOR))
    return client


def train_form(pool_name: str, **overrides: str) -> dict[str, str]:
    return {
        "pool": pool_name,
        "name": "ai-train-east",
        "cycle_slo_s": str(WEEK),
        "visit_estimate_s": "3600",
        "visit_concurrency": "1",
        "domain_order": "",
        "priority": "200",
        "auto_resume_after_s": "",
        **overrides,
    }


def upgrade_form(pool_name: str, *phases: dict[str, str], **overrides: str) -> dict[str, str]:
    data = {
        "pool": pool_name,
        "component": "gpu-driver",
        "version": "560.35.03",
        "reason": "driver with the NCCL fix",
        "scope": "",
        "max_failures": "1",
        "max_failure_rate": "",
        "hosts_per_visit": "",
        **overrides,
    }
    for i, phase in enumerate(phases):
        data.update({f"phase-{i}-{key}": value for key, value in phase.items()})
    return data


CANARY = {"name": "canary", "domain": "rack-0001", "min_successes": "1", "soak_s": "600", "selection": "fixed"}
EVERYWHERE = {"name": "everywhere", "percent": "100", "min_successes": "0", "soak_s": "0", "selection": "any"}


def error_of(response: Any, field: str) -> str:
    """The text of a field's inline errors on the page."""
    html = response.content.decode()
    start = html.index(f'data-field="{field}"')
    return html[start : html.index("</div>", html.index("field-errors", start))]


# --- creating a train ---------------------------------------------------------------------------


def test_an_operator_creates_a_train_with_a_domain_order_through_the_form() -> None:
    pool, _ = make_fleet(domains=3, hosts_per_domain=1)
    form = train_form(pool.name, domain_order="rack-0003\nrack-0001, rack-0002", auto_resume_after_s="900")
    response = operator().post("/trains/new/", form)
    train = Train.objects.get(pool=pool)
    assert response.status_code == 302
    assert response["Location"] == f"/trains/{train.pk}/"
    assert list(train.stops.order_by("position").values_list("domain__name", flat=True)) == [
        "rack-0003",
        "rack-0001",
        "rack-0002",
    ]
    assert (train.cycle_slo_s, train.auto_resume_after_s, train.created_by.groups.get().name) == (
        WEEK,
        900,
        Role.OPERATOR,
    )
    assert Event.objects.filter(kind="train.created", subject_id=train.pk).count() == 1


def test_an_slo_the_visits_cannot_meet_is_refused_next_to_the_slo_and_nothing_is_written() -> None:
    pool, _ = make_fleet(domains=3, hosts_per_domain=1)
    before = database_state()
    response = operator().post("/trains/new/", train_form(pool.name, cycle_slo_s="7200"))
    assert response.status_code == 400
    assert "the SLO of 7200 s cannot be met" in error_of(response, "cycle_slo_s")
    assert 'value="ai-train-east"' in response.content.decode()  # what was typed stays to be fixed
    assert database_state() == before


def test_an_unknown_domain_in_the_order_is_refused_next_to_the_order() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    response = operator().post("/trains/new/", train_form(pool.name, domain_order="rack-0001 rack-9999"))
    assert response.status_code == 400
    assert "has no domain rack-9999" in error_of(response, "domain_order")
    assert not Train.objects.exists()


def test_a_second_train_for_a_pool_is_refused_next_to_the_pool() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    make_train(pool)
    response = operator().post("/trains/new/", train_form(pool.name))
    assert response.status_code == 400
    assert "already has a train" in error_of(response, "pool")


# --- editing a train ----------------------------------------------------------------------------


def test_an_operator_edits_a_trains_slo_concurrency_and_order_and_the_event_says_what_changed() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    train = make_train(pool, cycle_slo_s=WEEK)
    client = operator()
    page = client.get(f"/trains/{train.pk}/edit/").content.decode()
    assert "rack-0001\nrack-0002</textarea>" in page  # the current order, to edit
    data = {"cycle_slo_s": str(2 * WEEK), "visit_concurrency": "2", "domain_order": "rack-0002\nrack-0001"}
    response = client.post(f"/trains/{train.pk}/edit/", data)
    assert response.status_code == 302
    train.refresh_from_db()
    assert (train.cycle_slo_s, train.visit_concurrency) == (2 * WEEK, 2)
    assert list(train.stops.order_by("position").values_list("domain__name", flat=True)) == ["rack-0002", "rack-0001"]
    event = Event.objects.get(kind="train.updated", subject_id=train.pk)
    assert event.data["before"] == {
        "cycle_slo_s": WEEK,
        "visit_concurrency": 1,
        "domain_order": ["rack-0001", "rack-0002"],
    }
    assert event.data["after"]["domain_order"] == ["rack-0002", "rack-0001"]
    assert "saved" in client.get(f"/trains/{train.pk}/").content.decode()


def test_an_edit_below_what_the_visits_need_is_refused_next_to_the_slo() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    train = make_train(pool, visit_estimate_s=3600)
    before = database_state()
    data = {"cycle_slo_s": "3600", "visit_concurrency": "1", "domain_order": "rack-0001 rack-0002"}
    response = operator().post(f"/trains/{train.pk}/edit/", data)
    assert response.status_code == 400
    assert "takes at least 7200 s" in error_of(response, "cycle_slo_s")
    assert database_state() == before


def test_an_emergency_train_cannot_be_edited_and_the_refusal_is_above_the_form() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    train = emergency_train_request(
        pool=pool, component="gpu-driver", version="560.35.03", reason="CVE", actor=make_user(Role.OPERATOR)
    )
    before = database_state()
    data = {"cycle_slo_s": str(WEEK), "visit_concurrency": "1", "domain_order": "rack-0001"}
    response = operator().post(f"/trains/{train.pk}/edit/", data)
    assert response.status_code == 400
    assert 'class="form-errors"' in response.content.decode()
    assert "runs as approved" in response.content.decode()
    assert database_state() == before


def test_train_update_with_nothing_changed_writes_no_event() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    train = make_train(pool)
    train_update(
        train_id=train.pk,
        cycle_slo_s=train.cycle_slo_s,
        visit_concurrency=1,
        domain_order=["rack-0001", "rack-0002"],
        actor="alice",
    )
    assert not Event.objects.filter(kind="train.updated").exists()


def test_train_update_records_only_the_fields_that_changed() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=1)
    train = make_train(pool)
    train_update(train_id=train.pk, visit_concurrency=2, actor="alice")
    event = Event.objects.get(kind="train.updated")
    assert event.data == {"before": {"visit_concurrency": 1}, "after": {"visit_concurrency": 2}}
    assert event.actor == "alice"


def test_a_finished_train_is_not_updated() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    train = make_train(pool)
    Train.objects.filter(pk=train.pk).update(state=TrainState.FINISHED)
    with pytest.raises(ValidationError) as refused:
        train_update(train_id=train.pk, visit_concurrency=2, actor="alice")
    assert refused.value.code == "conflict"


def test_pause_and_resume_are_on_the_train_page_with_a_reason_box() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    train = make_train(pool)
    page = operator().get(f"/trains/{train.pk}/").content.decode()
    assert f'action="/trains/{train.pk}/pause/"' in page
    assert f'action="/trains/{train.pk}/resume/"' in page
    assert f'id="pause-reason-{train.pk}" name="reason"' in page
    assert f'href="/trains/{train.pk}/edit/"' in page


# --- creating and offboarding an upgrade -----------------------------------------------------------


def test_an_operator_creates_an_upgrade_with_two_phases_and_its_page_shows_them() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    client = operator()
    response = client.post(
        "/trains/upgrades/new/", upgrade_form(pool.name, CANARY, EVERYWHERE, max_failure_rate="0.25")
    )
    upgrade = Upgrade.objects.get(pool=pool)
    assert response.status_code == 302
    assert response["Location"] == f"/trains/upgrades/{upgrade.pk}/"
    phases = list(upgrade.phases.order_by("position"))
    assert [(p.name, p.domain.name if p.domain else None, p.percent) for p in phases] == [
        ("canary", "rack-0001", None),
        ("everywhere", None, 100),
    ]
    assert (phases[0].soak_s, phases[1].selection) == (600, "any")
    assert (upgrade.max_failures, str(upgrade.max_failure_rate)) == (1, "0.2500")
    page = client.get(response["Location"]).content.decode()
    assert page.count('class="phase phase-') == 2
    assert "domain rack-0001" in page
    assert "100% of the scope" in page


def test_no_phase_rows_make_one_phase_over_the_scope() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    assert operator().post("/trains/upgrades/new/", upgrade_form(pool.name)).status_code == 302
    assert list(Upgrade.objects.get().phases.values_list("name", "percent")) == [("all", 100)]


def test_an_incompatible_version_is_refused_next_to_the_version() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    before = database_state()
    response = operator().post("/trains/upgrades/new/", upgrade_form(pool.name, version="535.183.01"))
    assert response.status_code == 400
    assert "would break a compatibility rule" in error_of(response, "version")
    assert database_state() == before


def test_a_withdrawn_version_is_offered_as_withdrawn_and_refused_with_its_reason() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    ComponentVersion.objects.filter(version="2.16.0").update(
        withdrawn_at="2030-01-01T00:00Z", withdrawn_reason="bad", withdrawn_by="operator"
    )
    client = operator()
    assert "2.16.0 (withdrawn)" in client.get("/trains/upgrades/new/").content.decode()
    response = client.post("/trains/upgrades/new/", upgrade_form(pool.name, component="bios", version="2.16.0"))
    assert response.status_code == 400
    assert "is withdrawn: bad" in error_of(response, "version")
    assert not Upgrade.objects.exists()


def test_phases_out_of_order_are_refused_above_the_form_and_a_bad_row_next_to_its_cell() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    client = operator()
    response = client.post(
        "/trains/upgrades/new/", upgrade_form(pool.name, {**EVERYWHERE, "min_successes": "1"}, CANARY)
    )
    assert response.status_code == 400
    assert "Phases out of order" in response.content.decode().split('class="form-errors"')[1].split("</div>")[0]
    response = client.post("/trains/upgrades/new/", upgrade_form(pool.name, {**EVERYWHERE, "percent": "150"}))
    assert response.status_code == 400
    cell = response.content.decode().split('data-field="phase-0-percent"')[1].split("</td>")[0]
    assert "less than or equal to 100" in cell
    assert not Upgrade.objects.exists()


def test_an_operator_offboards_an_active_upgrade_from_its_page_with_a_reason() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    client = operator()
    page = client.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()
    assert f'action="/trains/upgrades/{upgrade.pk}/offboard/"' in page
    response = client.post(f"/trains/upgrades/{upgrade.pk}/offboard/", {"reason": "hosts fail to boot"})
    assert response.status_code == 302
    upgrade.refresh_from_db()
    assert (upgrade.state, upgrade.state_reason) == (UpgradeState.OFFBOARDED, "hosts fail to boot")
    assert upgrade.component_version.withdrawn_at is not None
    assert Event.objects.filter(kind="upgrade.offboarded", subject_id=upgrade.pk).count() == 1
    page = client.get(response["Location"]).content.decode()
    assert "offboarded: its pending work is cancelled" in page
    assert f'action="/trains/upgrades/{upgrade.pk}/offboard/"' not in page  # re-onboarding now, not offboarding


def test_offboarding_without_a_reason_or_twice_is_refused_and_writes_nothing() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    client = operator()
    before = database_state()
    response = client.post(f"/trains/upgrades/{upgrade.pk}/offboard/", {"reason": "  "})
    assert response.status_code == 400
    assert "Say why" in error_of(response, "reason")
    assert database_state() == before
    assert client.post(f"/trains/upgrades/{upgrade.pk}/offboard/", {"reason": "bad"}).status_code == 302
    before = database_state()
    response = client.post(f"/trains/upgrades/{upgrade.pk}/offboard/", {"reason": "again"})
    assert response.status_code == 400
    assert "only an active upgrade is offboarded" in response.content.decode()
    assert database_state() == before


# --- who sees and who may post ------------------------------------------------------------------


def test_viewers_and_service_owners_see_no_form_links_or_buttons() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    train_pause(train_id=train.pk, reason="freeze", actor="alice")
    for role in (Role.VIEWER, Role.SERVICE_OWNER):
        client = Client()
        client.force_login(make_user(role))
        pages = "".join(
            client.get(path).content.decode()
            for path in ("/trains/", f"/trains/{train.pk}/", "/trains/upgrades/", f"/trains/upgrades/{upgrade.pk}/")
        )
        for link in ("/trains/new/", f"/trains/{train.pk}/edit/", "/trains/upgrades/new/", "/offboard/", "/resume/"):
            assert link not in pages, (role, link)
    pages = "".join(operator().get(path).content.decode() for path in ("/trains/", "/trains/upgrades/"))
    assert "/trains/new/" in pages
    assert "/trains/upgrades/new/" in pages


@pytest.mark.parametrize("role", [Role.VIEWER, Role.SERVICE_OWNER])
def test_a_post_with_a_valid_csrf_token_from_a_non_operator_is_refused_with_403_and_writes_nothing(
    role: str,
) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    spare, _ = make_fleet(domains=1, hosts_per_domain=1)
    train = make_train(pool)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user(role))
    token = secrets.token_hex(16)
    client.cookies[settings.CSRF_COOKIE_NAME] = token
    posts = {
        "/trains/new/": train_form(spare.name),
        f"/trains/{train.pk}/edit/": {
            "cycle_slo_s": str(2 * WEEK),
            "visit_concurrency": "2",
            "domain_order": "rack-0002",
        },
        "/trains/upgrades/new/": upgrade_form(pool.name, CANARY, EVERYWHERE),
        f"/trains/upgrades/{upgrade.pk}/offboard/": {"reason": "not mine to decide"},
    }
    before = database_state()
    for path, data in posts.items():
        response = client.post(path, {**data, "csrfmiddlewaretoken": token})
        assert response.status_code == 403, path
        assert b"does not allow you to run operations" in response.content
    assert database_state() == before
