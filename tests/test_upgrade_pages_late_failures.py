"""The upgrade pages show each failure once, in the phase the failure policy counts it against: a task
of an earlier phase that fails after that phase graduated (a catch-up linked to it) counts against the
phase in force (trains/services/upgrades.py: _counted_failures), not against its own phase as well."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from fleet.models import Host, Pool
from opsplanner import clock
from opsplanner.events import event_record
from opsplanner.models import HostTask, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.driving import drive_trains, instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import Train, Upgrade, UpgradePhase, UpgradeState, Visit
from trains.selectors_web import phases_with_counts
from trains.services.tick import train_tick
from trains.services.upgrade_policy import train_upgrades
from trains.services.upgrades import upgrade_create, upgrade_phase_failures
from trains.services.visits import Step, UpgradePlan, visit_steps_submit

pytestmark = pytest.mark.django_db
PHASE_FAILURES = re.compile(r'data-phase="(\d+)">.*?<td class="num failures[^"]*">(\d+)</td>', re.DOTALL)


def shown_failures(page: str) -> dict[int, int]:
    """{phase position: failures} as the page's phase table shows them."""
    return {int(position): int(n) for position, n in PHASE_FAILURES.findall(page)}


def phase_of(upgrade: Upgrade, position: int) -> UpgradePhase:
    return UpgradePhase.objects.get(upgrade=upgrade, position=position)


def rollout(pool: Pool, *, max_failures: int, phases: list[dict[str, object]]) -> Upgrade:
    return upgrade_create(
        pool=pool,
        component="gpu-driver",
        version="560.35.03",
        reason="rollout",
        max_failures=max_failures,
        phases=phases,
    )


CANARY_THEN_REST = [{"name": "canary", "domain": "rack-0001"}, {"name": "rest", "percent": 100, "min_successes": 0}]


def in_phase(pool: Pool, upgrade: Upgrade, position: int) -> None:
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=upgrade.pk).current_phase == position)
    upgrade.refresh_from_db()


def canary_fails_late(train: Train, upgrade: Upgrade, host: Host, at: dt.datetime | None = None) -> None:
    """A catch-up of the canary phase (catch_up.py links it to the phase its visit planned) fails now
    (or `at`)."""
    canary_visit = Visit.objects.filter(train=train, domain__name="rack-0001").order_by("id").first()
    assert canary_visit is not None
    plan = UpgradePlan(upgrade=upgrade, phase=phase_of(upgrade, 0), allowed=set())
    visit_steps_submit(train, canary_visit, [Step(plan=plan, hosts={host.pk}, work_s=60)], joined=False, catch_up=True)
    task = HostTask.objects.get(host=host, operation__visit_link__catch_up=True, state=TaskState.PENDING)
    HostTask.objects.filter(pk=task.pk).update(
        state=TaskState.FAILED,
        failure_code=FailureCode.EXECUTE_FAILED,
        failure_reason="the installer exited 1",
        finished_at=at or clock.now(),
    )
    # As the tick records it: the invariants (checked while driving on) want the event.
    event_record(
        kind="task.state_changed",
        subject=task,
        pool_id=task.pool_id,
        host_id=host.pk,
        reason="the installer exited 1",
        data={"from": TaskState.PENDING, "to": TaskState.FAILED},
    )


def canary_hosts(hosts: list[Host]) -> list[Host]:
    return [h for h in hosts if h.domain.name == "rack-0001"]


def test_it_shows_a_late_canary_failure_once_against_the_phase_in_force(client) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = rollout(pool, max_failures=1, phases=CANARY_THEN_REST)
    in_phase(pool, upgrade, 1)
    canary_fails_late(train, upgrade, canary_hosts(hosts)[0])
    train_tick(train_id=train.pk)  # within the policy's one failure: the rollout goes on
    upgrade.refresh_from_db()
    assert (upgrade.state, upgrade.current_phase) == (UpgradeState.ACTIVE, 1)
    counted = train_upgrades(train).failures[upgrade.pk]
    client.force_login(make_user(Role.OPERATOR))

    page = client.get(f"/trains/upgrades/{upgrade.pk}/").content.decode()

    assert counted == upgrade_phase_failures(upgrade, phase_of(upgrade, 1)) == 1
    assert shown_failures(page) == {0: 0, 1: counted}
    assert [p.failures for p in phases_with_counts([upgrade.pk])] == [0, 1]  # type: ignore[attr-defined]


def test_an_offboarded_upgrade_shows_its_late_canary_failure_only_in_the_phase_its_reason_names(client) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = rollout(pool, max_failures=0, phases=CANARY_THEN_REST)
    in_phase(pool, upgrade, 1)
    canary_fails_late(train, upgrade, canary_hosts(hosts)[0])
    train_tick(train_id=train.pk)
    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.OFFBOARDED
    assert upgrade.state_reason.startswith("1 hosts failed in phase rest, more than the 0 its policy allows")
    client.force_login(make_user(Role.VIEWER))

    page = client.get("/trains/upgrades/").content.decode()

    assert shown_failures(page) == {0: 0, 1: 1}


def test_each_phase_shows_the_failures_the_policy_counted_while_it_was_in_force() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    phases = [
        {"name": "canary", "domain": "rack-0001"},
        {"name": "second", "domain": "rack-0002"},
        {"name": "rest", "percent": 100, "min_successes": 0},
    ]
    upgrade = rollout(pool, max_failures=1, phases=phases)
    first, second = canary_hosts(hosts)
    counted = {0: upgrade_phase_failures(upgrade, phase_of(upgrade, 0))}
    in_phase(pool, upgrade, 1)
    canary_fails_late(train, upgrade, first)  # while phase second is in force
    counted[1] = upgrade_phase_failures(upgrade, phase_of(upgrade, 1))
    in_phase(pool, upgrade, 2)
    canary_fails_late(train, upgrade, second)  # while phase rest is in force
    counted[2] = upgrade_phase_failures(upgrade, phase_of(upgrade, 2))
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.ACTIVE
    assert counted == {0: 0, 1: 1, 2: 1}

    shown = {p.position: p.failures for p in phases_with_counts([upgrade.pk])}  # type: ignore[attr-defined]

    # Each failure once, where the policy counted it (before: 2, 2, 1).
    assert shown == counted


def test_a_canary_failure_as_it_graduated_shows_in_the_next_phase_and_one_before_in_the_canary() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    upgrade = rollout(pool, max_failures=1, phases=CANARY_THEN_REST)
    in_phase(pool, upgrade, 1)
    canary = phase_of(upgrade, 0)
    started_at, graduated_at = canary.started_at, canary.graduated_at
    assert started_at is not None
    assert graduated_at is not None
    assert graduated_at == phase_of(upgrade, 1).started_at
    before, at = canary_hosts(hosts)
    # While the canary was in force (it ran for well under a second of the wall clock here).
    canary_fails_late(train, upgrade, before, at=started_at + (graduated_at - started_at) / 2)
    # The instant the next phase started: it counts there (finished_at >= its started_at).
    canary_fails_late(train, upgrade, at, at=graduated_at)

    shown = {p.position: p.failures for p in phases_with_counts([upgrade.pk])}  # type: ignore[attr-defined]

    assert upgrade_phase_failures(upgrade, phase_of(upgrade, 1)) == 1
    assert shown == {0: 1, 1: 1}  # before: {0: 2, 1: 1}
