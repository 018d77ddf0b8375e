"""Replanning an upgrade (trains/services/replan.py): its priority, deadline, multi-cycle and hosts per
visit changed in place, as a deadline alert advises, through the service, the API and the upgrade's
page; only an active, regular upgrade, by an operator; the next visit takes the new plan."""

from __future__ import annotations

import datetime as dt
import re
import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import Client

from fleet.models import Pool
from opsplanner import clock
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.builders import make_fleet
from tests.driving import drive_trains, in_threads, instant_simulator
from tests.test_security import database_state
from tests.test_train_budget import SLO_S, create_upgrades, four_components_fleet
from tests.test_upgrade_forecast import CYCLE, create, forecast_of, one_upgrade_per_visit
from tests.test_web_trains_forms import error_of, operator
from tests.trains_builders import make_train, make_user
from trains.models import Train, Upgrade, UpgradeState, Visit
from trains.services.emergency import emergency_train_request
from trains.services.offboarding import upgrade_offboard
from trains.services.replan import upgrade_replan
from trains.services.tick import train_tick
from trains.services.upgrade_forecast import DeadlineFix
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db
ALERT = "alert.upgrade_deadline_at_risk"


def bios_upgrade(pool: Pool, **fields: object) -> Upgrade:
    return upgrade_create(pool=pool, component="bios", version="2.16.0", reason="rollout", **fields)  # type: ignore[arg-type]


def replanned_events(upgrade: Upgrade) -> list[Event]:
    return list(Event.objects.filter(kind="upgrade.replanned", subject_id=upgrade.pk))


# --- the service --------------------------------------------------------------------------------


def test_it_raises_an_upgrades_priority_and_records_what_changed() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)

    upgrade_replan(upgrade_id=upgrade.pk, priority=900, actor="alice")

    upgrade.refresh_from_db()
    assert upgrade.priority == 900
    (event,) = replanned_events(upgrade)
    assert event.data == {"priority": [100, 900]}
    assert event.actor == "alice"
    assert event.pool_id == pool.pk
    assert f"upgrade #{upgrade.pk} replanned: priority 100 → 900; from its next visit" in event.reason


def test_only_the_fields_given_change_and_a_deadline_is_recorded_as_its_time() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, priority=300)
    deadline = clock.now() + dt.timedelta(days=3)

    upgrade_replan(upgrade_id=upgrade.pk, deadline=deadline, actor="alice")

    upgrade.refresh_from_db()
    assert (upgrade.priority, upgrade.deadline, upgrade.multi_cycle) == (300, deadline, False)
    assert replanned_events(upgrade)[0].data == {"deadline": [None, deadline.isoformat()]}


def test_nothing_changed_writes_no_event() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, priority=300)
    before = database_state()

    upgrade_replan(upgrade_id=upgrade.pk, priority=300, deadline=None, multi_cycle=False, actor="alice")
    upgrade_replan(upgrade_id=upgrade.pk, actor="alice")

    assert database_state() == before
    assert replanned_events(upgrade) == []


@pytest.mark.parametrize("state", [UpgradeState.COMPLETED, UpgradeState.OFFBOARDED, UpgradeState.CANCELLED])
def test_it_refuses_to_replan_a_completed_upgrade_and_says_why(state: str) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    Upgrade.objects.filter(pk=upgrade.pk).update(state=state)
    before = database_state()

    with pytest.raises(ValidationError) as refused:
        upgrade_replan(upgrade_id=upgrade.pk, priority=900, actor="alice")

    assert refused.value.code == "conflict"
    assert f"Upgrade #{upgrade.pk} is {state}; only an active upgrade" in refused.value.messages[0]
    assert database_state() == before


def test_it_refuses_to_replan_an_emergency_upgrade_its_train_runs_as_approved() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    train = emergency_train_request(
        pool=pool, component="gpu-driver", version="560.35.03", reason="CVE", actor=make_user(Role.OPERATOR)
    )
    before = database_state()

    with pytest.raises(ValidationError) as refused:
        upgrade_replan(upgrade_id=train.upgrade_id, priority=900, actor="alice")

    assert refused.value.code == "conflict"
    assert "emergency upgrade" in refused.value.messages[0]
    assert database_state() == before


def test_it_refuses_bad_values_by_field_with_the_rules_upgrade_create_applies() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    before = database_state()
    refusals = {
        "priority": {"priority": 1001},
        "hosts_per_visit": {"multi_cycle": True},
        "deadline": {"deadline": clock.now() - dt.timedelta(minutes=1)},
    }
    for field, change in refusals.items():
        with pytest.raises(ValidationError) as refused:
            upgrade_replan(upgrade_id=upgrade.pk, actor="alice", **change)  # type: ignore[arg-type]
        assert list(refused.value.message_dict) == [field], change
    with pytest.raises(ValidationError) as refused:
        upgrade_replan(upgrade_id=upgrade.pk, hosts_per_visit=3, actor="alice")
    # The same words as upgrade_create's refusal: one rule (trains/limits.py).
    with pytest.raises(ValidationError) as created:
        bios_upgrade(pool, hosts_per_visit=3)
    assert refused.value.message_dict == created.value.message_dict
    assert database_state() == before


def test_a_deadline_already_passed_does_not_block_another_change() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, deadline=clock.now() + dt.timedelta(days=1))
    passed = clock.now() - dt.timedelta(hours=1)
    Upgrade.objects.filter(pk=upgrade.pk).update(deadline=passed)

    upgrade_replan(upgrade_id=upgrade.pk, priority=500, deadline=passed, actor="alice")

    upgrade.refresh_from_db()
    assert (upgrade.priority, upgrade.deadline) == (500, passed)


def test_turning_multi_cycle_off_drops_its_hosts_per_visit() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, multi_cycle=True, hosts_per_visit=1)

    upgrade_replan(upgrade_id=upgrade.pk, multi_cycle=False, actor="alice")

    upgrade.refresh_from_db()
    assert (upgrade.multi_cycle, upgrade.hosts_per_visit) == (False, None)
    assert replanned_events(upgrade)[0].data == {"multi_cycle": [True, False], "hosts_per_visit": [1, None]}


# --- the deadline alert and the promise ------------------------------------------------------------


def test_clearing_the_deadline_clears_the_deadline_alert_mark() -> None:
    pool, _ = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)
    late = create(pool, "bios", "2.16.0", deadline=clock.now() + CYCLE + dt.timedelta(minutes=30))
    assert Upgrade.objects.get(pk=late.pk).deadline_alerted_at is not None

    upgrade_replan(upgrade_id=late.pk, deadline=None, actor="alice")

    late.refresh_from_db()
    assert (late.deadline, late.deadline_alerted_at) == (None, None)
    assert replanned_events(late)[0].data["deadline"][1] is None


def test_raising_the_priority_as_the_alert_advises_meets_the_deadline_and_raises_no_new_alert() -> None:
    pool, _ = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)
    late = create(pool, "bios", "2.16.0", deadline=clock.now() + CYCLE + dt.timedelta(minutes=30))
    assert Event.objects.get(kind=ALERT, subject_id=late.pk).data["fix"] == DeadlineFix.RAISE_PRIORITY

    upgrade_replan(upgrade_id=late.pk, priority=1000, actor="alice")

    assert forecast_of(late).deadline_met is True
    assert Upgrade.objects.get(pk=late.pk).deadline_alerted_at is None
    train_tick(train_id=Train.objects.get(pool=pool).pk)
    assert Event.objects.filter(kind=ALERT, subject_id=late.pk).count() == 1


def test_a_new_deadline_still_missed_is_alerted_again_and_the_promise_is_kept() -> None:
    pool, _ = one_upgrade_per_visit()
    rushed = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(minutes=30))
    promised = Upgrade.objects.values_list("promise_made_at", "promised_cycle", "promised_at").get(pk=rushed.pk)
    assert promised[0] is not None

    upgrade_replan(upgrade_id=rushed.pk, deadline=clock.now() + dt.timedelta(minutes=40), actor="alice")

    alerts = Event.objects.filter(kind=ALERT, subject_id=rushed.pk).order_by("id")
    assert [a.data["fix"] for a in alerts] == [DeadlineFix.NONE_KNOWN] * 2
    assert Upgrade.objects.get(pk=rushed.pk).deadline_alerted_at is not None  # judged again at once
    assert Upgrade.objects.values_list("promise_made_at", "promised_cycle", "promised_at").get(pk=rushed.pk) == promised


def test_whole_visits_as_the_alert_advises_meet_a_multi_cycle_upgrades_deadline() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=6)
    make_train(pool, visit_estimate_s=3600)
    slow = bios_upgrade(pool, multi_cycle=True, hosts_per_visit=1, deadline=clock.now() + dt.timedelta(hours=3))
    assert Event.objects.get(kind=ALERT, subject_id=slow.pk).data["fix"] == DeadlineFix.WHOLE_VISITS

    upgrade_replan(upgrade_id=slow.pk, multi_cycle=False, actor="alice")

    assert forecast_of(Upgrade.objects.get(pk=slow.pk)).deadline_met is True


# --- the next visit takes the new plan -------------------------------------------------------------


def visits_started(train: Train) -> list[Visit]:
    return list(Visit.objects.filter(train=train, started_at__isnull=False).order_by("started_at", "id"))


def test_a_raised_priority_moves_the_upgrade_ahead_in_the_next_visit() -> None:
    pool = four_components_fleet()
    train = make_train(pool, cycle_slo_s=SLO_S, visit_overhead_s=600)
    first, _, _, last = create_upgrades(pool, [100, 100, 100, 100])
    train_tick(train_id=train.pk)
    (running,) = visits_started(train)
    plan = dict(running.plan)

    upgrade_replan(upgrade_id=last.pk, priority=900, actor="alice")
    drive_trains(pool, until=lambda: len(visits_started(train)) == 2)

    running.refresh_from_db()
    assert running.plan["upgrades"] == plan["upgrades"]  # the running visit kept its plan
    assert last.pk not in [u["upgrade"] for u in plan["upgrades"]]
    following = visits_started(train)[1]
    assert [u["upgrade"] for u in following.plan["upgrades"]] == [last.pk, first.pk]


def test_turning_multi_cycle_off_lets_the_next_visit_take_every_host() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=3)
    train = make_train(pool)
    upgrade = bios_upgrade(pool, multi_cycle=True, hosts_per_visit=2)
    train_tick(train_id=train.pk)
    assert len(visits_started(train)[0].plan["hosts"]) == 2

    upgrade_replan(upgrade_id=upgrade.pk, multi_cycle=False, actor="alice")
    drive_trains(pool, until=lambda: len(visits_started(train)) == 2)

    assert len(visits_started(train)[0].plan["hosts"]) == 2  # started under the old plan
    assert len(visits_started(train)[1].plan["hosts"]) == 3


# --- the API --------------------------------------------------------------------------------------


def test_an_operator_replans_through_the_api_and_gets_the_upgrade_back() -> None:
    pool, _ = one_upgrade_per_visit()
    upgrade = create(pool, "bios", "2.16.0", deadline=clock.now() + dt.timedelta(days=2))

    response = role_client(Role.OPERATOR).post(
        f"/api/upgrades/{upgrade.pk}/replan/", {"priority": 700, "deadline": None}, format="json"
    )

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["priority"], body["deadline"]) == (upgrade.pk, 700, None)
    assert body["forecast"]["deadline_met"] is None
    assert replanned_events(upgrade)[0].data["priority"] == [100, 700]


def test_the_api_refuses_a_bad_priority_by_field_and_writes_nothing() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    client = role_client(Role.OPERATOR)
    before = database_state()

    shape = client.post(f"/api/upgrades/{upgrade.pk}/replan/", {"priority": 5000}, format="json")
    rule = client.post(f"/api/upgrades/{upgrade.pk}/replan/", {"hosts_per_visit": 3}, format="json")

    assert shape.status_code == 400
    assert list(shape.json()["errors"]) == ["priority"]
    assert rule.status_code == 400
    assert "Only a multi-cycle upgrade" in rule.json()["errors"]["hosts_per_visit"][0]
    assert database_state() == before


def test_the_api_refuses_a_completed_upgrade_with_a_conflict_that_names_its_state() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    Upgrade.objects.filter(pk=upgrade.pk).update(state=UpgradeState.COMPLETED)

    response = role_client(Role.OPERATOR).post(f"/api/upgrades/{upgrade.pk}/replan/", {"priority": 9}, format="json")

    assert response.status_code == 409
    assert "is completed" in response.json()["detail"]


def test_a_replay_with_the_same_idempotency_key_replans_once() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    client = role_client(Role.OPERATOR)
    path, headers = f"/api/upgrades/{upgrade.pk}/replan/", {"Idempotency-Key": "replan-1"}

    answers = [client.post(path, {"priority": 400}, format="json", headers=headers) for _ in range(2)]

    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()
    assert len(replanned_events(upgrade)) == 1


# --- the upgrade's page ---------------------------------------------------------------------------
INPUT = re.compile(r"<input\b[^>]*>")


def as_posted(page: str, **changes: str | None) -> dict[str, str]:
    """What the page's form posts, as a browser sends it (the values it shows, each field's hidden
    initial value, a ticked box as "on"), with `changes` typed in (None: emptied or unticked)."""
    posted = {}
    for tag in INPUT.findall(page):
        attrs = dict(re.findall(r'(\w[\w-]*)="([^"]*)"', tag))
        name = attrs.get("name", "")
        if not name or name == "csrfmiddlewaretoken":
            continue
        if attrs.get("type") == "checkbox":
            if re.search(r"\schecked\b", tag):
                posted[name] = "on"
            continue
        posted[name] = attrs.get("value", "")
    for name, value in changes.items():
        posted.pop(name, None)
        if value is not None:
            posted[name] = value
    return posted


def test_an_operator_replans_from_the_upgrade_page() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, multi_cycle=True, hosts_per_visit=1)
    client = operator()
    assert (
        f'href="/trains/upgrades/{upgrade.pk}/replan/"'
        in client.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()
    )
    page = client.get(f"/trains/upgrades/{upgrade.pk}/replan/").content.decode()
    assert 'name="priority" value="100"' in page

    # Multi-cycle unticked with the old bound still in its box: whole visits, the bound dropped.
    changed = as_posted(page, priority="900", multi_cycle=None)
    assert changed["hosts_per_visit"] == "1"
    response = client.post(f"/trains/upgrades/{upgrade.pk}/replan/", changed)

    assert response.status_code == 302
    upgrade.refresh_from_db()
    assert (upgrade.priority, upgrade.multi_cycle, upgrade.hosts_per_visit) == (900, False, None)
    assert "replanned" in client.get(response["Location"]).content.decode()


def test_the_page_says_nothing_changed_when_the_operator_saves_it_as_shown() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, multi_cycle=True, hosts_per_visit=1)
    client = operator()
    page = client.get(f"/trains/upgrades/{upgrade.pk}/replan/").content.decode()

    response = client.post(f"/trains/upgrades/{upgrade.pk}/replan/", as_posted(page))

    assert response.status_code == 302
    shown = client.get(response["Location"]).content.decode()
    assert f"Nothing changed: upgrade #{upgrade.pk} keeps its plan." in shown
    assert "replanned;" not in shown
    assert replanned_events(upgrade) == []


def test_a_refused_replan_is_shown_next_to_its_field_and_writes_nothing() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    before = database_state()

    response = operator().post(f"/trains/upgrades/{upgrade.pk}/replan/", {"priority": "100", "multi_cycle": "on"})

    assert response.status_code == 400
    assert "needs a number of hosts per visit" in error_of(response, "hosts_per_visit")
    assert database_state() == before


def test_a_deadline_shown_to_the_minute_and_posted_back_stays_exact() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    deadline = (clock.now() + dt.timedelta(days=2)).replace(second=17, microsecond=5)
    upgrade = bios_upgrade(pool, deadline=deadline)
    shown = f"{deadline:%Y-%m-%dT%H:%M}"
    page = operator().get(f"/trains/upgrades/{upgrade.pk}/replan/").content.decode()
    assert f'value="{shown}"' in page

    response = operator().post(f"/trains/upgrades/{upgrade.pk}/replan/", as_posted(page, priority="200"))

    assert response.status_code == 302
    upgrade.refresh_from_db()
    assert (upgrade.priority, upgrade.deadline) == (200, deadline)
    assert replanned_events(upgrade)[0].data == {"priority": [100, 200]}


def test_the_page_replans_only_what_the_operator_changed_not_what_an_api_call_changed_meanwhile() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    page = operator().get(f"/trains/upgrades/{upgrade.pk}/replan/").content.decode()  # priority 100 shown
    upgrade_replan(upgrade_id=upgrade.pk, priority=700, actor="integration")  # meanwhile, through the API
    deadline = (clock.now() + dt.timedelta(days=3)).replace(second=0, microsecond=0)

    response = operator().post(
        f"/trains/upgrades/{upgrade.pk}/replan/", as_posted(page, deadline=f"{deadline:%Y-%m-%dT%H:%M}")
    )

    assert response.status_code == 302
    upgrade.refresh_from_db()
    assert (upgrade.priority, upgrade.deadline) == (700, deadline)  # the page showed 100 and left it


def test_a_missed_deadline_on_the_upgrade_page_points_an_operator_to_replan() -> None:
    pool, _ = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)
    late = create(pool, "bios", "2.16.0", deadline=clock.now() + CYCLE + dt.timedelta(minutes=30))

    page = operator().get(f"/trains/upgrades/{late.pk}/").content.decode()

    assert 'class="replan-hint"' in page


def test_a_viewer_cannot_replan() -> None:
    pool, _ = one_upgrade_per_visit()
    create(pool, "gpu-driver", "560.35.03", priority=500)
    late = create(pool, "bios", "2.16.0", deadline=clock.now() + CYCLE + dt.timedelta(minutes=30))
    viewer = Client()
    viewer.force_login(make_user(Role.VIEWER))
    before = database_state()

    page = viewer.get(f"/trains/upgrades/{late.pk}/").content.decode()
    form = viewer.get(f"/trains/upgrades/{late.pk}/replan/")
    posted = viewer.post(f"/trains/upgrades/{late.pk}/replan/", {"priority": "1000"})
    api = role_client(Role.VIEWER).post(f"/api/upgrades/{late.pk}/replan/", {"priority": 1000}, format="json")

    assert "/replan/" not in page
    assert (form.status_code, posted.status_code, api.status_code) == (403, 403, 403)
    assert database_state() == before


def test_an_upgrade_that_is_not_active_shows_no_replan_link() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    Upgrade.objects.filter(pk=upgrade.pk).update(state=UpgradeState.COMPLETED)

    page = operator().get(f"/trains/upgrades/{upgrade.pk}/").content.decode()

    assert "/replan/" not in page


# --- racing an offboarding -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_offboarding_that_commits_first_is_never_overwritten_by_a_replan() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = bios_upgrade(pool)
    locked = threading.Event()
    refusals: list[str] = []

    def offboard_holding_the_row() -> None:
        with transaction.atomic():
            Upgrade.objects.select_for_update().get(pk=upgrade.pk)
            locked.set()
            time.sleep(0.5)  # the replan waits on the row meanwhile
            assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks hosts", actor="bob")

    def replan_meanwhile() -> None:
        locked.wait(30)
        started = time.monotonic()
        try:
            upgrade_replan(upgrade_id=upgrade.pk, priority=900, actor="alice")
        except ValidationError as refused:
            refusals.append(refused.messages[0])
        assert time.monotonic() - started > 0.2  # it waited for the offboarding's commit

    assert in_threads(offboard_holding_the_row, replan_meanwhile) == []
    assert refusals == [f"Upgrade #{upgrade.pk} is offboarded; only an active upgrade, which still has work to do, "
                        "is replanned."]  # fmt: skip
    upgrade.refresh_from_db()
    assert (upgrade.state, upgrade.priority) == (UpgradeState.OFFBOARDED, 100)
    assert replanned_events(upgrade) == []


@pytest.mark.django_db(transaction=True)
def test_a_replan_beside_a_tick_holding_the_train_waits_for_it_rather_than_deadlocking() -> None:
    # The tick holds its train and writes the upgrades (a completion, a graduation, the deadline
    # mark); the replan writes the train (train_says_at_once: the budget verdict). It locked the
    # upgrade first, and the two deadlocked.
    pool, _ = make_fleet(domains=1, hosts_per_domain=3, planned_buffer_hosts=1)
    train = make_train(pool, cycle_slo_s=3600, visit_overhead_s=600)
    slow = upgrade_create(pool=pool, component="bios", version="2.16.0", reason="slow", duration_s=900)
    locked = threading.Event()
    order: list[str] = []

    def tick_holding_the_train() -> None:
        with transaction.atomic():
            Train.objects.select_for_update(of=("self",)).get(pk=train.pk)
            locked.set()
            time.sleep(0.5)  # the replan starts meanwhile
            Upgrade.objects.filter(pk=slow.pk, deadline_alerted_at__isnull=True).update(deadline_alerted_at=clock.now())
            order.append("tick")

    def replan_meanwhile() -> None:
        locked.wait(30)
        # What the train's over-budget alert advises: a bounded number of hosts per visit.
        upgrade_replan(upgrade_id=slow.pk, multi_cycle=True, hosts_per_visit=1, actor="alice")
        order.append("replan")

    assert in_threads(tick_holding_the_train, replan_meanwhile) == []
    assert order == ["tick", "replan"]
    slow.refresh_from_db()
    assert (slow.multi_cycle, slow.hosts_per_visit, slow.deadline_alerted_at) == (True, 1, None)


def test_the_page_keeps_a_deadline_an_api_call_set_meanwhile_though_the_one_it_showed_had_seconds() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    shown = (clock.now() + dt.timedelta(days=2)).replace(second=17, microsecond=5)
    upgrade = bios_upgrade(pool, deadline=shown)
    page = operator().get(f"/trains/upgrades/{upgrade.pk}/replan/").content.decode()
    meanwhile = (clock.now() + dt.timedelta(days=5)).replace(second=0, microsecond=0)
    upgrade_replan(upgrade_id=upgrade.pk, deadline=meanwhile, actor="integration")

    response = operator().post(f"/trains/upgrades/{upgrade.pk}/replan/", as_posted(page, priority="200"))

    assert response.status_code == 302
    upgrade.refresh_from_db()
    assert (upgrade.priority, upgrade.deadline) == (200, meanwhile)


# --- racing other writers of the pool's upgrades ---------------------------------------------------


def race_beside_offboarding(*, offboard_both: bool) -> tuple[Upgrade, list[str]]:
    """An offboarding of the pool's first upgrade (and of its second: a version's withdrawal) holds
    its row while the second upgrade is replanned; the first had no promise yet, which the replan's
    forecast check would make."""
    pool, _ = one_upgrade_per_visit()
    first, second = create(pool, "bios", "2.16.0"), create(pool, "gpu-driver", "560.35.03")
    Upgrade.objects.filter(pk=first.pk).update(promise_made_at=None, promised_cycle=None, promised_at=None)
    holding = threading.Event()
    errors: list[str] = []

    def offboarding() -> None:
        with transaction.atomic():
            upgrade_offboard(upgrade=Upgrade.objects.get(pk=first.pk), reason="withdrawn", actor="file")
            holding.set()
            time.sleep(0.5)  # the replan starts meanwhile
            if offboard_both:
                upgrade_offboard(upgrade=Upgrade.objects.get(pk=second.pk), reason="withdrawn", actor="file")

    def replan() -> None:
        holding.wait(30)
        try:
            upgrade_replan(upgrade_id=second.pk, priority=900, actor="alice")
        except ValidationError as refused:
            errors.append(refused.messages[0])

    assert in_threads(offboarding, replan) == []  # no deadlock either way
    first.refresh_from_db()
    return first, errors


@pytest.mark.django_db(transaction=True)
def test_a_replan_beside_a_withdrawal_offboarding_two_upgrades_waits_and_refuses_without_deadlock() -> None:
    _, errors = race_beside_offboarding(offboard_both=True)

    assert len(errors) == 1
    assert "is offboarded; only an active upgrade" in errors[0]


@pytest.mark.django_db(transaction=True)
def test_a_replan_gives_no_promise_to_an_upgrade_offboarded_while_it_waited() -> None:
    first, errors = race_beside_offboarding(offboard_both=False)

    assert errors == []
    assert (first.state, first.promise_made_at) == (UpgradeState.OFFBOARDED, None)
    # Only the promise it was made as it was created (the race begins with it taken away).
    assert Event.objects.filter(kind="upgrade.promised", subject_id=first.pk).count() == 1
