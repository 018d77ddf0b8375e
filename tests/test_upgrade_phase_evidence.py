"""Rollout phases demand evidence: a phase before the last widens the rollout only after
min_successes real successes and its soak. A phase whose hosts cannot give that evidence picks hosts
of the pool (selection 'any') or holds with the reason, until two operators agree to skip it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.core.exceptions import ValidationError

from console.api.serializers.trains import UpgradeSerializer
from fleet.models import ComponentVersion, Host, Pool
from fleet.services import installed_version_set
from opsplanner import clock
from opsplanner.adapters import Adapter
from opsplanner.models import Approval, ApprovalKind, ApprovalState, Event, HostTask, TaskState, WorkItem, WorkKind
from opsplanner.models.operations import FailureCode
from opsplanner.roles import Role
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.approvals import approval_decide
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim
from tests.api_helpers import token_client
from tests.builders import make_fleet
from tests.driving import busy, drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Pace, Train, Upgrade, UpgradePhase, UpgradeState, Visit
from trains.models.upgrades import PhaseHoldCode
from trains.services.phases import upgrade_phase_skip_request
from trains.services.tick import train_tick, trains_tick
from trains.services.upgrades import upgrade_create, upgrade_phase_failures, upgrade_phase_successes
from trains.services.visits import Step, UpgradePlan, visit_steps_submit

pytestmark = pytest.mark.django_db


def bios_2_16() -> ComponentVersion:
    return ComponentVersion.objects.get(component__name="bios", version="2.16.0")


def already_upgraded(hosts: list[Host]) -> None:
    for host in hosts:
        installed_version_set(host=host, version=bios_2_16())


def hosts_in(hosts: list[Host], domain: str) -> list[Host]:
    return [h for h in hosts if h.domain.name == domain]


def bios_upgrade(pool: Pool, first: dict[str, object]) -> Upgrade:
    return upgrade_create(
        pool=pool,
        component="bios",
        version="2.16.0",
        reason="rollout",
        phases=[{"name": "canary", **first}, {"name": "rest", "percent": 100, "min_successes": 0}],
    )


def touched(upgrade: Upgrade, phase: int | None = None) -> set[int]:
    tasks = HostTask.objects.filter(operation__visit_link__upgrade=upgrade)
    if phase is not None:
        tasks = tasks.filter(operation__visit_link__phase=phase)
    return set(tasks.values_list("host_id", flat=True))


def phase_of(upgrade: Upgrade, position: int = 0) -> UpgradePhase:
    return UpgradePhase.objects.get(upgrade=upgrade, position=position)


def events(kind: str, upgrade: Upgrade) -> list[Event]:
    return list(Event.objects.filter(kind=kind, subject_type="trains.upgrade", subject_id=upgrade.pk).order_by("id"))


def held_canary() -> tuple[Pool, list[Host], Train, Upgrade]:
    """nic-fw style bug report: the canary domain rack-0001 already runs the target."""
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    already_upgraded(hosts_in(hosts, "rack-0001"))
    train = make_train(pool)
    upgrade = bios_upgrade(pool, {"domain": "rack-0001", "min_successes": 1})
    for _ in range(4):
        train_tick(train_id=train.pk)
    return pool, hosts, train, upgrade


class VirtualClock:
    def __init__(self) -> None:
        self.at = clock.now()

    def __call__(self) -> dt.datetime:
        return self.at

    def advance(self, seconds: float) -> Callable[[], None]:
        def step() -> None:
            self.at += dt.timedelta(seconds=seconds)

        return step


def test_a_canary_domain_with_no_host_to_upgrade_holds_and_says_why_instead_of_graduating_on_zero(client) -> None:
    _, _, _, upgrade = held_canary()

    upgrade.refresh_from_db()
    canary = phase_of(upgrade)
    assert upgrade.state == UpgradeState.ACTIVE
    assert upgrade.current_phase == 0
    assert canary.graduated_at is None
    assert canary.successes_reached_at is None
    assert not events("upgrade.phase_graduated", upgrade)
    assert not touched(upgrade), "nothing of the pool may roll out without canary evidence"
    assert canary.held_code == PhaseHoldCode.TOO_FEW_HOSTS
    assert "needs before the rollout widens" in canary.held_reason
    assert "domain rack-0001 has 0 more hosts that still need bios 2.16.0" in canary.held_reason
    assert "4 hosts outside the phase wait" in canary.held_reason
    assert "ask for a skip of the phase" in canary.held_reason
    (alert,) = events("alert.upgrade_phase_held", upgrade)  # one alert when the hold starts, not one per tick
    assert alert.reason == canary.held_reason
    assert alert.data == {"phase": 0, "code": "too_few_hosts"}

    shown = UpgradeSerializer(Upgrade.objects.prefetch_related("phases").get(pk=upgrade.pk)).data
    assert shown["held_code"] == "too_few_hosts"
    assert shown["held_reason"] == canary.held_reason
    client.force_login(make_user(Role.VIEWER))
    page = client.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()
    assert 'data-held="too_few_hosts"' in page
    assert "has 0 more hosts that still need bios 2.16.0" in page


def test_an_any_phase_takes_hosts_of_the_pool_in_the_trains_order_and_graduates_after_real_successes_and_soak() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    already_upgraded(hosts_in(hosts, "rack-0001"))
    train = make_train(pool, domain_order=["rack-0001", "rack-0003", "rack-0002"])
    upgrade = bios_upgrade(pool, {"domain": "rack-0001", "min_successes": 2, "soak_s": 3600, "selection": "any"})
    virtual = VirtualClock()

    with clock.use_clock(virtual):
        drive_trains(
            pool, each_round=virtual.advance(1), until=lambda: bool(events("upgrade.phase_succeeded", upgrade))
        )
        rack_3 = {h.pk for h in hosts_in(hosts, "rack-0003")}
        assert set(phase_of(upgrade).picked_hosts) == rack_3  # the train's order: rack-0003 before rack-0002
        assert touched(upgrade) == rack_3
        assert upgrade_phase_successes(upgrade, 0) == 2
        (picked,) = events("upgrade.phase_hosts_picked", upgrade)
        assert picked.data == {"phase": 0, "hosts": sorted(rack_3)}
        # Two real successes, but the soak is not over: the rollout does not widen yet.
        for _ in range(3):
            virtual.at += dt.timedelta(seconds=600)
            train_tick(train_id=train.pk)
        assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 0
        virtual.at += dt.timedelta(seconds=1801)
        train_tick(train_id=train.pk)
        assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 1
        drive_trains(
            pool,
            each_round=virtual.advance(1),
            until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED and not busy([pool]),
        )

    (graduated,) = events("upgrade.phase_graduated", upgrade)
    assert graduated.data == {"from": 0, "to": 1}
    assert "graduated with 2 successes" in graduated.reason
    assert not events("alert.upgrade_phase_held", upgrade), "hosts of the pool were there to pick: no hold"
    assert touched(upgrade, phase=1) == {h.pk for h in hosts_in(hosts, "rack-0002")}


@pytest.mark.parametrize("selection", ["fixed", "any"])
def test_a_one_percent_phase_whose_only_host_already_runs_the_target_holds_or_picks_a_host(selection: str) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=5)
    already_upgraded(hosts[:1])  # 1% of 10 hosts is the first host, and it needs nothing
    train = make_train(pool)
    upgrade = bios_upgrade(pool, {"percent": 1, "min_successes": 1, "selection": selection})

    train_tick(train_id=train.pk)

    phase = phase_of(upgrade)
    if selection == "fixed":
        assert phase.held_code == PhaseHoldCode.TOO_FEW_HOSTS
        assert "1% of the scope has 0 more hosts" in phase.held_reason
        assert "9 hosts outside the phase wait" in phase.held_reason
        assert not touched(upgrade)
        return
    assert phase.held_code == ""
    assert phase.picked_hosts == [hosts[1].pk]  # the next host of the train's first domain
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).current_phase == 1)
    assert touched(upgrade, phase=0) == {hosts[1].pk}
    assert upgrade_phase_successes(upgrade, 0) == 1


def test_a_held_phase_is_skipped_only_when_a_second_operator_approves_and_the_event_says_who_and_why() -> None:
    pool, hosts, _, upgrade = held_canary()
    requester, approver = make_user(), make_user()

    approval = upgrade_phase_skip_request(
        upgrade_id=upgrade.pk, reason="rack-0001 got 2.16.0 by hand last week", actor=requester
    )
    assert approval.kind == ApprovalKind.SKIP_PHASE
    assert approval.summary["phase_name"] == "canary"
    assert approval.summary["held_code"] == "too_few_hosts"
    (asked,) = events("upgrade.phase_skip_requested", upgrade)
    assert asked.data == {"approval": approval.pk, "phase": 0}
    with pytest.raises(ValidationError, match="two-person rule") as refused:
        approval_decide(approval_id=approval.pk, approve=True, reason="mine", actor=requester)
    assert refused.value.code == "self_approval"
    assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 0

    approval_decide(approval_id=approval.pk, approve=True, reason="checked the rack's versions", actor=approver)

    upgrade.refresh_from_db()
    canary = phase_of(upgrade)
    assert upgrade.current_phase == 1
    assert canary.graduated_at is not None
    assert canary.held_code == ""
    assert canary.held_reason == ""
    assert phase_of(upgrade, 1).started_at is not None
    (skipped,) = events("upgrade.phase_graduated", upgrade)
    assert skipped.actor == approver.username
    assert skipped.data["skipped"] is True
    assert skipped.data["approval"] == approval.pk
    assert skipped.data["requested_by"] == requester.username
    assert skipped.data["approved_by"] == approver.username
    assert skipped.data["decision_reason"] == "checked the rack's versions"
    assert "skipped by approval" in skipped.reason
    assert "rack-0001 got 2.16.0 by hand" in skipped.reason
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED)
    assert touched(upgrade) == {h.pk for h in hosts if h.domain.name != "rack-0001"}


def test_a_skip_is_refused_for_a_phase_that_is_not_held_and_for_a_non_operator() -> None:
    instant_simulator()
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = bios_upgrade(pool, {"domain": "rack-0001", "min_successes": 2})
    train_tick(train_id=train.pk)
    assert phase_of(upgrade).held_code == ""

    with pytest.raises(ValidationError, match="not held") as refused:
        upgrade_phase_skip_request(upgrade_id=upgrade.pk, reason="impatient", actor=make_user())
    assert refused.value.code == "conflict"
    with pytest.raises(ValidationError) as refused:
        upgrade_phase_skip_request(upgrade_id=upgrade.pk, reason="impatient", actor=make_user(Role.VIEWER))
    assert refused.value.code == "permission"
    assert not Approval.objects.filter(kind=ApprovalKind.SKIP_PHASE).exists()


def test_a_rejected_skip_leaves_the_phase_held() -> None:
    _, _, train, upgrade = held_canary()
    approval = upgrade_phase_skip_request(upgrade_id=upgrade.pk, reason="no canary needed", actor=make_user())
    approval_decide(approval_id=approval.pk, approve=False, reason="find a canary first", actor=make_user())
    train_tick(train_id=train.pk)
    assert Approval.objects.get(pk=approval.pk).state == ApprovalState.REJECTED
    assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 0
    assert phase_of(upgrade).held_code == PhaseHoldCode.TOO_FEW_HOSTS


def test_an_operator_asks_for_a_skip_through_the_api() -> None:
    _, _, _, upgrade = held_canary()
    operator = token_client(make_user())

    answer = operator.post(f"/api/upgrades/{upgrade.pk}/skip-phase/", {"reason": "canary rack is done"}, format="json")

    assert answer.status_code == 201, answer.content
    assert answer.json()["kind"] == "skip_phase"
    assert answer.json()["state"] == "pending"
    again = operator.post(f"/api/upgrades/{upgrade.pk}/skip-phase/", {"reason": "again"}, format="json")
    assert again.status_code == 400
    shown = operator.get(f"/api/upgrades/{upgrade.pk}/").json()
    assert shown["held_code"] == "too_few_hosts"
    assert shown["phases"][0]["held_reason"] == shown["held_reason"]


def test_a_normal_canary_graduates_after_its_successes_and_is_never_held() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    make_train(pool)
    upgrade = bios_upgrade(pool, {"domain": "rack-0003", "min_successes": 2})

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED)

    assert touched(upgrade, phase=0) == {h.pk for h in hosts_in(hosts, "rack-0003")}
    (graduated,) = events("upgrade.phase_graduated", upgrade)
    assert graduated.data == {"from": 0, "to": 1}
    assert "with 2 successes" in graduated.reason
    assert not events("alert.upgrade_phase_held", upgrade)
    assert not events("upgrade.phase_hosts_picked", upgrade)


def test_when_the_phase_holds_the_last_hosts_that_need_it_the_upgrade_completes_without_widening() -> None:
    # min_successes larger than what the whole scope still needs: nothing waits outside the phase.
    instant_simulator()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2)
    canary_hosts = hosts_in(hosts, "rack-0001")
    already_upgraded([canary_hosts[0], *hosts_in(hosts, "rack-0002")])
    make_train(pool)
    upgrade = bios_upgrade(pool, {"domain": "rack-0001", "min_successes": 2})

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.COMPLETED)

    assert touched(upgrade) == {canary_hosts[1].pk}
    assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 0
    assert not events("alert.upgrade_phase_held", upgrade)
    assert not events("upgrade.phase_graduated", upgrade)


@pytest.mark.parametrize(
    ("first", "message"),
    [
        ({"domain": "rack-0001", "min_successes": 0}, "needs at least one success before the rollout widens"),
        ({"domain": "rack-0001", "min_successes": 3}, "adds 2 hosts; it cannot wait for 3 successes"),
        ({"domain": "rack-0001", "min_successes": 5, "selection": "any"}, "can take 4 hosts"),
        ({"domain": "rack-0001", "selection": "some"}, "selection is 'fixed'"),
    ],
)
def test_phases_that_could_widen_without_evidence_are_refused_at_creation(first: dict, message: str) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    with pytest.raises(ValidationError, match=message):
        bios_upgrade(pool, first)
    assert not Upgrade.objects.exists()


def test_an_any_canary_may_ask_for_more_successes_than_its_domain_has() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    upgrade = bios_upgrade(pool, {"domain": "rack-0001", "min_successes": 3, "selection": "any"})
    assert phase_of(upgrade).selection == "any"


# --- a phase's last hosts -------------------------------------------------------------------------
def train_round(pool: Pool, before_work: Callable[[], None] | None = None) -> None:
    """Trains, then the pool, then `before_work` (an executor claiming its items), then the simulator."""
    trains_tick()
    pool_tick(pool_id=pool.pk)
    if before_work:
        before_work()
    simulated_work_step()
    assert not check_invariants()


def driver_canary(pool: Pool, *, max_failures: int) -> Upgrade:
    return upgrade_create(
        pool=pool,
        component="gpu-driver",
        version="560.35.03",
        reason="rollout",
        max_failures=max_failures,
        phases=[{"name": "canary", "domain": "rack-0001"}, {"name": "rest", "percent": 100, "min_successes": 0}],
    )


# A free visit slot, or room to slide: the train looks at its phases at every tick.
@pytest.mark.parametrize(("pace", "concurrency"), [(Pace.DOMAIN, 2), (Pace.SLIDING, 1)])
def test_a_canary_waits_for_its_slow_host_whose_failure_then_stops_the_rollout_before_it_widens(
    pace: str, concurrency: int
) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2, planned_buffer_hosts=4)
    make_train(pool, visit_concurrency=concurrency, pace=pace)
    upgrade = driver_canary(pool, max_failures=0)
    slow = hosts_in(hosts, "rack-0001")[-1]
    held: list[WorkItem] = []

    def slow_installer() -> None:  # its executor takes the install and holds it
        held.extend(
            work_items_claim(worker="slow", adapter=Adapter.SIMULATED, kinds=[WorkKind.EXECUTE], host_id=slow.pk)
        )

    for _ in range(12):  # the other canary host succeeds early in these
        train_round(pool, slow_installer)
    canary = phase_of(upgrade)
    assert (upgrade_phase_successes(upgrade, 0), len(held), canary.graduated_at) == (1, 1, None)
    assert Upgrade.objects.get(pk=upgrade.pk).current_phase == 0
    assert touched(upgrade) == {h.pk for h in hosts_in(hosts, "rack-0001")}, "the rollout widened before it"

    work_item_report(item_id=held[0].pk, worker="slow", key="slow", outcome="failed", reason="installer exited 1")
    for _ in range(3):
        train_round(pool)

    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.OFFBOARDED
    assert upgrade.state_reason.startswith("1 hosts failed in phase canary, more than the 0 its policy allows")
    assert touched(upgrade) == {h.pk for h in hosts_in(hosts, "rack-0001")}
    assert not events("upgrade.phase_graduated", upgrade)


def test_a_task_of_an_earlier_phase_failing_after_it_graduated_counts_against_the_phase_in_force() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = driver_canary(pool, max_failures=0)
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).current_phase == 1)
    upgrade.refresh_from_db()
    canary_visit = Visit.objects.get(train=train, domain__name="rack-0001")
    # A catch-up of the canary phase (catch_up.py links it to the phase its visit planned) fails now.
    host = hosts_in(hosts, "rack-0001")[0]
    plan = UpgradePlan(upgrade=upgrade, phase=phase_of(upgrade, 0), allowed=set())
    visit_steps_submit(train, canary_visit, [Step(plan=plan, hosts={host.pk}, work_s=60)], joined=False, catch_up=True)
    HostTask.objects.filter(host=host, operation__visit_link__catch_up=True).update(
        state=TaskState.FAILED,
        failure_code=FailureCode.EXECUTE_FAILED,
        failure_reason="the installer exited 1",
        finished_at=clock.now(),
    )

    assert upgrade_phase_failures(upgrade, phase_of(upgrade, 1)) == 1
    train_tick(train_id=train.pk)
    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.OFFBOARDED
    assert upgrade.state_reason.startswith("1 hosts failed in phase rest, more than the 0 its policy allows")
