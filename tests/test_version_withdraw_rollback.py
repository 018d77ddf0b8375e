"""Withdrawing a version rolls back the hosts that may serve with it, whether or not an upgrade to it
is active: by the API's service, by the fleet file, and once per host when two pools offboard theirs."""

from __future__ import annotations

import copy

import pytest
from django.db import transaction

from fleet.fleetfile import fleet_apply
from fleet.fleetfile.export import fleet_export_document
from fleet.fleetfile.schema import fleet_spec_from_document
from fleet.models import ComponentVersion, Host, HostState, InstalledVersion, Pool
from fleet.services import installed_version_set
from fleet.services.catalogue import component_version_withdraw, versions_withdrawal_apply
from opsplanner.models import Event, HostTask, Operation, OperationSource, OperationState, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

NEW, OLD = "560.35.03", "550.127.05"


def driver(version: str) -> ComponentVersion:
    return ComponentVersion.objects.get(component__name="gpu-driver", version=version)


def running(version: str) -> set[int]:
    return set(InstalledVersion.objects.filter(version=driver(version)).values_list("host_id", flat=True))


def pool_running_the_new_driver(*, hosts: int = 3) -> tuple[Pool, list[Host]]:
    """A pool whose hosts were given the new driver by hand (an earlier ad-hoc operation, say): no
    upgrade to it is active."""
    pool, members = make_fleet(domains=1, hosts_per_domain=hosts)
    for host in members:
        installed_version_set(host=host, version=driver(NEW))
    return pool, members


def rollback_tasks() -> list[int]:
    """The hosts of every rollback task, one entry per task."""
    return sorted(
        HostTask.objects.filter(
            operation__source=OperationSource.REPAIR, operation__component_version=driver(OLD)
        ).values_list("host_id", flat=True)
    )


def test_withdrawing_a_version_no_upgrade_targets_rolls_back_the_hosts_running_it() -> None:
    instant_simulator()
    pool, hosts = pool_running_the_new_driver()

    component_version_withdraw(version_id=driver(NEW).pk, reason="hangs under NCCL", actor="op")
    drive(pool)

    assert running(NEW) == set()
    assert running(OLD) == {h.pk for h in hosts}
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
    event = Event.objects.get(kind="component_version.withdrawn")
    assert (event.data["offboarded_upgrades"], len(event.data["rollbacks"])) == (0, 1)


def test_a_host_with_nothing_recorded_before_the_version_is_counted_not_rolled_back() -> None:
    _, hosts = pool_running_the_new_driver(hosts=2)
    InstalledVersion.objects.filter(host=hosts[0], component__name="gpu-driver").update(previous_version=None)

    component_version_withdraw(version_id=driver(NEW).pk, reason="hangs under NCCL", actor="op")

    assert rollback_tasks() == [hosts[1].pk]
    assert Event.objects.get(kind="component_version.withdrawn").data["hosts_without_previous"] == 1


def test_offboarding_one_versions_upgrades_in_two_pools_rolls_each_host_back_once() -> None:
    given = []
    for _ in range(2):  # each pool: one host already given the new driver, one still to upgrade
        pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
        installed_version_set(host=hosts[0], version=driver(NEW))
        upgrade_create(pool=pool, component="gpu-driver", version=NEW, reason="rollout")
        given.append(hosts[0].pk)

    with transaction.atomic():
        withdrawal = versions_withdrawal_apply(version_ids=[driver(NEW).pk], reason="bad driver", actor="op")

    assert withdrawal.offboarded == 2
    assert rollback_tasks() == sorted(given)


def test_a_fleet_file_that_withdraws_a_version_says_it_rolls_back_its_hosts_and_does() -> None:
    pool, hosts = pool_running_the_new_driver(hosts=2)
    document = fleet_export_document(pool=pool.name)
    component = next(c for c in document["components"] if c["name"] == "gpu-driver")
    component["versions"] = [
        v if v != NEW else {"version": v, "withdrawn": "breaks NCCL"} for v in component["versions"]
    ]

    plan = fleet_apply(spec=fleet_spec_from_document(copy.deepcopy(document)))

    assert [c.line() for c in plan.changes] == [
        f"~ version gpu-driver {NEW}: withdrawn False -> True, withdrawn_reason none -> breaks NCCL "
        "(rolls back the 2 hosts running it)"
    ]
    assert rollback_tasks() == sorted(h.pk for h in hosts)
    said = Event.objects.get(kind="component_version.updated").data
    assert (said["offboarded_upgrades"], len(said["rollbacks"]), said["hosts_without_previous"]) == (0, 1, 0)


def test_a_rollback_to_a_version_withdrawn_too_is_refused_with_the_reason_and_the_hosts() -> None:
    _, hosts = pool_running_the_new_driver(hosts=2)
    component_version_withdraw(version_id=driver(OLD).pk, reason="leaks memory", actor="op")

    component_version_withdraw(version_id=driver(NEW).pk, reason="hangs under NCCL", actor="op")

    assert rollback_tasks() == []
    refused = Event.objects.get(kind="component_version.rollback_refused")
    assert "leaks memory" in refused.reason
    assert refused.data["hosts"] == sorted(h.pk for h in hosts)


def test_withdrawing_the_target_of_a_pending_rollback_cancels_it_instead_of_leaving_it_waiting() -> None:
    _, hosts = pool_running_the_new_driver(hosts=2)
    component_version_withdraw(version_id=driver(NEW).pk, reason="hangs under NCCL", actor="op")
    (rollback,) = Operation.objects.filter(source=OperationSource.REPAIR, component_version=driver(OLD))

    component_version_withdraw(version_id=driver(OLD).pk, reason="leaks memory", actor="op")

    rollback.refresh_from_db()
    assert rollback.state == OperationState.CANCELLED
    tasks = HostTask.objects.filter(operation=rollback)
    assert set(tasks.values_list("state", "failure_code")) == {(TaskState.CANCELLED, FailureCode.CANCELLED)}
    said = Event.objects.filter(kind="task.state_changed", data__to="cancelled", host_id__in=[h.pk for h in hosts])
    assert set(said.values_list("reason", flat=True)) == {"version withdrawn: leaks memory"}
    event = Event.objects.filter(kind="component_version.withdrawn").latest("id")
    assert event.data["pending_tasks_cancelled"] == 2
    states = Host.objects.filter(pk__in=[h.pk for h in hosts]).values_list("state", flat=True)
    assert set(states) == {HostState.IN_SERVICE}, "the hosts stay in service, running the withdrawn driver"


def test_the_rollbacks_a_withdrawal_submits_are_not_cancelled_by_it() -> None:
    pool_running_the_new_driver(hosts=2)

    component_version_withdraw(version_id=driver(NEW).pk, reason="hangs under NCCL", actor="op")

    assert Event.objects.get(kind="component_version.withdrawn").data["pending_tasks_cancelled"] == 0
    rollbacks = HostTask.objects.filter(operation__source=OperationSource.REPAIR)
    assert list(rollbacks.values_list("state", flat=True)) == [TaskState.PENDING] * 2


def a_file_withdrawing(pool: Pool, reasons: dict[str, str]) -> dict:
    """The pool's exported file with these driver versions withdrawn ({version: why})."""
    document = fleet_export_document(pool=pool.name)
    component = next(c for c in document["components"] if c["name"] == "gpu-driver")
    component["versions"] = [
        {"version": v, "withdrawn": reasons[v]} if isinstance(v, str) and v in reasons else v
        for v in component["versions"]
    ]
    return document


def a_file_withdrawing_the_new_driver(pool: Pool) -> dict:
    return a_file_withdrawing(pool, {NEW: "breaks NCCL"})


def test_a_fleet_file_withdrawing_a_version_and_the_one_before_it_refuses_the_rollback_as_the_api_does() -> None:
    pool, hosts = pool_running_the_new_driver(hosts=2)

    fleet_apply(spec=fleet_spec_from_document(a_file_withdrawing(pool, {OLD: "leaks memory", NEW: "breaks NCCL"})))

    assert rollback_tasks() == []  # not a rollback left waiting, refused, for ever
    refused = Event.objects.get(kind="component_version.rollback_refused")
    assert "leaks memory" in refused.reason
    assert refused.data["hosts"] == sorted(h.pk for h in hosts)


def test_a_fleet_files_plan_says_how_many_pending_tasks_of_other_operations_its_withdrawal_cancels() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3)
    upgrade_create(pool=pool, component="gpu-driver", version=NEW, reason="rollout")  # offboarded, not counted
    ad_hoc = operation_submit(
        kind="upgrade",
        scope=f"hosts: {hosts[0].hostname}, {hosts[1].hostname}",
        component="gpu-driver",
        version=NEW,
        reason="early adopters",
    )
    document = a_file_withdrawing_the_new_driver(pool)

    dry = fleet_apply(spec=fleet_spec_from_document(copy.deepcopy(document)), dry_run=True)

    (change,) = dry.changes
    assert change.note.endswith("; cancels the 2 pending tasks of other operations aimed at it"), change.note
    assert change.note.startswith("offboards upgrade #")
    assert HostTask.objects.filter(operation=ad_hoc, state=TaskState.PENDING).count() == 2, "a dry run cancels nothing"

    fleet_apply(spec=fleet_spec_from_document(copy.deepcopy(document)))

    cancelled = HostTask.objects.filter(operation=ad_hoc).values_list("state", flat=True)
    assert list(cancelled) == [TaskState.CANCELLED] * 2, "the plan counted what the withdrawal cancelled"
    said = Event.objects.get(kind="component_version.updated").data
    assert (said["offboarded_upgrades"], said["pending_tasks_cancelled"]) == (1, 2), said
    assert said["changed_fields"] == ["withdrawn", "withdrawn_reason"]


def test_a_withdrawal_with_nothing_else_aimed_at_the_version_says_nothing_of_cancelling() -> None:
    pool, _ = pool_running_the_new_driver(hosts=2)

    plan = fleet_apply(spec=fleet_spec_from_document(a_file_withdrawing_the_new_driver(pool)), dry_run=True)

    assert [c.note for c in plan.changes] == ["rolls back the 2 hosts running it"]
