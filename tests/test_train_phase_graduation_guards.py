"""A phase graduates on its own evidence only, with every host of it finished.

Two ways the train tick graduated a phase without that: an upgrade graduating as it joins a running
visit late saw its next phase judged, in the same tick, on the previous phase's successes; and a
stopped sliding train graduated its canary while its visit still had canary hosts to release.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import transaction
from django.db.models import QuerySet

from fleet.models import Host, Pool
from opsplanner.adapters import Adapter
from opsplanner.models import Event, HostTask, TaskState
from opsplanner.services.approvals import approval_decide
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.trains_builders import make_train, make_user
from trains.models import STOPPED_TRAIN_STATES, Pace, Train, Upgrade, UpgradePhase, Visit, VisitState
from trains.services.offboarding import upgrade_offboard
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.tick import train_tick
from trains.services.trains import train_pause, train_resume
from trains.services.upgrades import upgrade_create, upgrade_phase_successes
from trains.services.visits import unreleased_hosts

pytestmark = pytest.mark.django_db

CANARY_HALF_REST = [
    {"name": "canary", "domain": "rack-0001", "min_successes": 1},
    {"name": "half", "percent": 50, "min_successes": 1, "soak_s": 3600},
    {"name": "rest", "percent": 100, "min_successes": 0},
]


def _pool_ticks_until(pool: Pool, condition: Callable[[], bool], rounds: int = 60) -> None:
    """The core alone works (no train tick): the train sees the outcome all at once, later."""
    for _ in range(rounds):
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
        if condition():
            return
    raise AssertionError(f"not reached in {rounds} rounds")


def _all_done(tasks: QuerySet[HostTask]) -> Callable[[], bool]:
    return lambda: set(tasks.values_list("state", flat=True)) == {TaskState.DONE}


def _bios_reonboarded_while_a_visit_runs(scope_racks: set[str], phases: list[dict]) -> tuple[Train, Upgrade]:
    """bios over the hosts of `scope_racks` in `phases`: its canary succeeds on rack-0001, it is
    offboarded before the train graduates it, a visit for a driver starts on rack-0002, and bios is
    re-onboarded (two operators) while that visit runs: the next train tick has it join that visit
    late and graduate its canary."""
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2, planned_buffer_hosts=4)
    train = make_train(pool, visit_concurrency=2)
    bios = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="rollout", max_failures=0, phases=phases,
        scope="hosts: " + ",".join(h.hostname for h in hosts if h.domain.name in scope_racks),
    )  # fmt: skip
    train_tick(train_id=train.pk)  # the canary visit, on rack-0001
    _pool_ticks_until(pool, _all_done(HostTask.objects.filter(operation__visit_link__upgrade=bios)))
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=bios.pk), reason="vendor bug")
    train_tick(train_id=train.pk)  # the canary visit ends
    rack2 = Host.objects.filter(pool=pool, domain__name="rack-0002").order_by("hostname")
    upgrade_create(
        pool=pool, component="gpu-driver", version="560.35.03", reason="driver",
        scope="hosts: " + ",".join(h.hostname for h in rack2),
    )  # fmt: skip
    train_tick(train_id=train.pk)  # the driver's visit, on rack-0002, without bios
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.domain.name == "rack-0002"
    assert bios.pk not in visit.plan["considered"]
    approval = upgrade_reonboard_request(upgrade_id=bios.pk, reason="vendor fixed it", actor=make_user())
    approval_decide(approval_id=approval.pk, approve=True, reason="verified", actor=make_user())
    assert upgrade_phase_successes(bios, 0) == 2
    return train, bios


def _said(kind: str, upgrade: Upgrade) -> list[str]:
    return list(Event.objects.filter(kind=kind, subject_id=upgrade.pk).order_by("id").values_list("reason", flat=True))


def test_an_upgrade_graduating_as_it_joins_a_visit_late_does_not_soak_its_next_phase_on_the_canarys_successes() -> None:
    train, bios = _bios_reonboarded_while_a_visit_runs({"rack-0001", "rack-0002", "rack-0003"}, CANARY_HALF_REST)

    train_tick(train_id=train.pk)

    bios.refresh_from_db()
    half = UpgradePhase.objects.get(upgrade=bios, position=1)
    assert bios.current_phase == 1
    assert upgrade_phase_successes(bios, 1) == 0
    assert half.successes_reached_at is None
    assert not [reason for reason in _said("upgrade.phase_succeeded", bios) if reason.startswith("phase half")]


def test_an_upgrade_graduating_as_it_joins_a_visit_late_graduates_one_phase_in_that_tick_not_two() -> None:
    phases = [{**phase, "soak_s": 0} for phase in CANARY_HALF_REST]
    phases[1]["percent"] = 75  # 'half' opens hosts of rack-0003, none in the running visit's domain
    train, bios = _bios_reonboarded_while_a_visit_runs({"rack-0001", "rack-0003"}, phases)

    train_tick(train_id=train.pk)

    bios.refresh_from_db()
    assert bios.current_phase == 1
    assert len(_said("upgrade.phase_graduated", bios)) == 1
    assert upgrade_phase_successes(bios, 1) == 0


def _sliding_canary_with_one_host_done(planned_buffer_hosts: int = 1) -> tuple[Pool, Train, Upgrade, Visit]:
    """A sliding train releases the canary domain's three hosts one at a time (planned buffer 1):
    the first is done, the other two wait to be released."""
    instant_simulator()
    pool, _ = make_fleet(domains=3, hosts_per_domain=3, planned_buffer_hosts=planned_buffer_hosts)
    train = make_train(pool, pace=Pace.SLIDING)
    bios = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="rollout",
        phases=[{"name": "canary", "domain": "rack-0001", "min_successes": 1},
                {"name": "rest", "percent": 100, "min_successes": 0}],
    )  # fmt: skip
    train_tick(train_id=train.pk)
    visit = Visit.objects.get(train=train, state=VisitState.RUNNING)
    assert visit.plan["released"] == 1
    assert len(unreleased_hosts(visit)) == 2
    _pool_ticks_until(pool, _all_done(HostTask.objects.filter(operation__visit_link__upgrade=bios)))
    return pool, train, bios, visit


def _paused(pool: Pool, train: Train) -> None:
    train_pause(train_id=train.pk, reason="change freeze", actor=None)


def _autostopped(pool: Pool, train: Train) -> None:
    """Other work (a reboot whose external drainer has not started) fills the planned buffer: the
    next train tick autostops the train, and goes on with its upgrades."""
    outside = Host.objects.filter(pool=pool, domain__name="rack-0003").order_by("pk").first()
    assert outside is not None
    operation_submit(kind="reboot", scope="x", host_ids=[outside.pk], reason="kernel", drainer=Adapter.EXTERNAL)
    pool_tick(pool_id=pool.pk, kick=False)


@pytest.mark.parametrize("stop", [_paused, _autostopped], ids=["paused", "autostopped"])
def test_a_stopped_sliding_train_does_not_graduate_its_canary_while_canary_hosts_wait_to_be_released(
    stop: Callable[[Pool, Train], None],
) -> None:
    pool, train, bios, visit = _sliding_canary_with_one_host_done()
    stop(pool, train)

    train_tick(train_id=train.pk)

    train.refresh_from_db()
    visit.refresh_from_db()
    bios.refresh_from_db()
    assert train.state in STOPPED_TRAIN_STATES
    assert len(unreleased_hosts(visit)) == 2
    assert bios.current_phase == 0
    assert not _said("upgrade.phase_graduated", bios)


def test_a_resumed_sliding_train_graduates_its_canary_once_every_canary_host_was_released_and_done() -> None:
    pool, train, bios, visit = _sliding_canary_with_one_host_done()
    train_pause(train_id=train.pk, reason="change freeze", actor=None)
    train_tick(train_id=train.pk)
    train_resume(train_id=train.pk, reason="freeze over", actor=make_user())
    canary_tasks = HostTask.objects.filter(operation__visit_link__visit=visit)

    for _ in range(2):  # the two canary hosts left, one at a time
        train_tick(train_id=train.pk)
        _pool_ticks_until(pool, _all_done(canary_tasks))
        bios.refresh_from_db()
        assert bios.current_phase == 0
    visit.refresh_from_db()
    assert not unreleased_hosts(visit)
    assert canary_tasks.count() == 3

    train_tick(train_id=train.pk)

    bios.refresh_from_db()
    assert bios.current_phase == 1
    assert [reason.split(";")[0] for reason in _said("upgrade.phase_graduated", bios)] == [
        "phase canary graduated with 3 successes after its soak"
    ]
