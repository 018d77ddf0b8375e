"""The demo comes alive (trains/demo.py, `manage.py demo_alive`): trains on every pool, upgrades in
flight, an approval waiting, an opt-out that makes a train skip a rack, a reservation, a broken host."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from fleet.models import CapacityReservation, Host, HostState, OptOutWindow, Pool
from opsplanner.demo_users import demo_users_ensure
from opsplanner.models import Approval, ApprovalState, Operation, OperationKind, SimulatorProfile
from tests.driving import drive_trains, instant_simulator
from trains.demo import DEMO_SPEED, DOOMED, OPTED_OUT_SERVICE
from trains.models import Train, TrainState, Upgrade, UpgradeState, Visit, VisitState

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _debug(settings, tmp_path) -> None:
    settings.DEBUG = True  # the demo logins exist only in DEBUG
    settings.VAR_DIR = tmp_path


def _alive_demo(hosts: int = 400) -> str:  # web-central gets two racks
    call_command("seed_demo", hosts=hosts, stdout=io.StringIO(), stderr=io.StringIO())
    demo_users_ensure()
    out = io.StringIO()
    call_command("demo_alive", stdout=out)
    return out.getvalue()


def test_it_puts_a_train_with_an_upgrade_on_every_pool_and_leaves_an_approval_waiting() -> None:
    said = _alive_demo()
    pools = set(Pool.objects.values_list("name", flat=True))
    regular = Train.objects.filter(emergency=False)
    assert {train.pool.name for train in regular} == pools
    assert all(train.state == TrainState.RUNNING for train in regular)
    assert set(Upgrade.objects.filter(emergency=False).values_list("pool__name", flat=True)) == pools
    phased = Upgrade.objects.get(pool__name="ai-train-east", emergency=False)
    assert [phase.name for phase in phased.phases.order_by("position")] == ["canary", "quarter", "rest"]
    waiting = Approval.objects.get(state=ApprovalState.PENDING)
    assert waiting.kind == "emergency_train"
    assert "4 trains, 4 upgrades, an emergency train waiting for approval" in said


def test_the_hardware_runs_at_demo_speed_and_one_release_candidate_is_doomed() -> None:
    _alive_demo()
    profile = SimulatorProfile.current()
    assert {name: getattr(profile, name) for name in DEMO_SPEED} == DEMO_SPEED
    assert profile.execute_by_kind[f"upgrade:{DOOMED[0]}:{DOOMED[1]}"]["failure_rate"] > 0.5
    # No host ran the doomed version before: offboarding it (which withdraws it) strands no host.
    doomed = Upgrade.objects.get(component_version__version=DOOMED[1])
    assert not Host.objects.filter(installed_versions__version=doomed.component_version).exists()


def test_a_service_opts_out_of_exactly_one_web_rack_and_a_reservation_holds_inference_capacity() -> None:
    _alive_demo()
    window = OptOutWindow.objects.get(service__name=OPTED_OUT_SERVICE)
    racks = set(window.service.hosts.values_list("domain__name", flat=True))
    assert len(racks) == 1
    assert set(window.service.hosts.values_list("pool__name", flat=True)) == {"web-central"}
    reservation = CapacityReservation.objects.get()
    assert reservation.pool.name == "ai-infer-west"
    assert reservation.min_hosts_in_service < Host.objects.filter(pool=reservation.pool).count()


def test_a_storage_host_is_broken_and_gets_a_repair() -> None:
    said = _alive_demo()
    repair = Operation.objects.get(kind=OperationKind.REPAIR)
    broken = repair.tasks.get().host
    assert broken.pool.name == "storage-north"
    assert broken.state != HostState.IN_SERVICE
    assert f"{broken.hostname} broken and in repair" in said


def test_the_trains_move_skip_the_opted_out_rack_and_the_doomed_upgrade_is_offboarded() -> None:
    _alive_demo()
    web = Train.objects.get(pool__name="web-central", emergency=False)
    window = OptOutWindow.objects.get(service__name=OPTED_OUT_SERVICE)
    opted_out = window.service.hosts.values_list("domain_id", flat=True).first()
    doomed = Upgrade.objects.get(component_version__version=DOOMED[1])
    # Demo speed is seconds of wall time per step; in-process driving runs the same outcomes instantly.
    instant_simulator(execute_by_kind=SimulatorProfile.current().execute_by_kind)
    drive_trains(
        *Pool.objects.all(),
        until=lambda: (
            Visit.objects.filter(train=web, state=VisitState.DONE).exclude(domain_id=opted_out).exists()
            and Visit.objects.filter(train=web, domain_id=opted_out, skips__gte=1).exists()
            and Upgrade.objects.get(pk=doomed.pk).state == UpgradeState.OFFBOARDED
        ),
    )
    skipped = Visit.objects.get(train=web, domain_id=opted_out)
    assert skipped.state == VisitState.PLANNED  # waits out the window while the train visits the other rack
    assert skipped.skips >= 1
    assert OPTED_OUT_SERVICE in skipped.skip_reason


def test_a_second_run_changes_nothing_and_without_an_operator_it_refuses() -> None:
    _alive_demo()
    trains = Train.objects.count()
    out = io.StringIO()
    call_command("demo_alive", stdout=out)
    assert "already has trains; nothing changed" in out.getvalue()
    assert Train.objects.count() == trains
    Train.objects.all().delete()
    with pytest.raises(CommandError, match="no active user 'nobody'"):
        call_command("demo_alive", operator="nobody")
