"""Submitting operations: scopes are resolved by the planner; bad input is refused and writes nothing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Host
from opsplanner.models import Event, HostTask, Operation
from opsplanner.scopes import parse_scope, resolve_scope
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import OperationRequest, operation_submit, operations_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import drive, instant_simulator

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    return make_fleet(domains=2, hosts_per_domain=5, planned_buffer_hosts=3, pool_name="train")


def refused(message: str, **fields) -> None:
    events = Event.objects.count()
    fields.setdefault("reason", "because")
    with pytest.raises(ValidationError) as caught:
        operation_submit(**fields)
    assert message in " ".join(caught.value.messages), caught.value.messages
    assert not Operation.objects.exists()
    assert not HostTask.objects.exists()
    assert Event.objects.count() == events


def test_an_upgrade_of_ten_percent_of_a_pool_gets_one_task_per_host(fleet) -> None:
    pool, _hosts = fleet
    operation = operation_submit(
        kind="upgrade",
        component="gpu-driver",
        version="560.35.03",
        scope="10% of pool train",
        reason="canary",
        priority=500,
    )
    assert operation.tasks.count() == 1
    task = operation.tasks.get()
    assert (task.state, task.pool_id, task.priority) == ("pending", pool.pk, 500)
    assert operation.needs_drain is True
    event = Event.objects.get(kind="operation.submitted")
    assert event.data["hosts"] == 1
    assert event.data["target"] == "gpu-driver 560.35.03"


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("pool train", 10),
        ("POOL  train", 10),
        ("50% of pool train", 5),
        ("domain train/rack-0002", 5),
        ("hosts running gpu-driver below 560", 10),
        ("hosts running gpu-driver below 550.127.05 in pool train", 0),
    ],
)
def test_selectors_resolve_to_the_hosts_they_name(fleet, scope, expected) -> None:
    if expected == 0:
        with pytest.raises(ValidationError, match="The scope matches no host"):
            resolve_scope(parse_scope(scope))
    else:
        assert len(resolve_scope(parse_scope(scope))) == expected


def test_a_host_list_resolves_in_the_order_given_and_names_unknown_hosts(fleet) -> None:
    _, hosts = fleet
    names = [hosts[3].hostname, hosts[1].hostname]
    assert resolve_scope(parse_scope("hosts: " + ", ".join(names))) == [hosts[3].pk, hosts[1].pk]
    with pytest.raises(ValidationError, match="Unknown hosts: ghost-1, ghost-2"):
        resolve_scope(parse_scope(f"hosts: {names[0]}, ghost-1, ghost-2"))


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ("", "The scope is empty"),
        ("everything", "Cannot read the scope 'everything'"),
        ("0% of pool train", "The percentage must be above 0 and at most 100"),
        ("150% of pool train", "The percentage must be above 0 and at most 100"),
        ("pool nowhere", "There is no pool named 'nowhere'."),
        ("domain train/rack-9999", "Pool train has no domain named 'rack-9999'."),
        ("hosts running flux-capacitor below 2", "There is no component named 'flux-capacitor'."),
        ("hosts running gpu-driver below newest", "'newest' is not a version"),
        ("hosts: Bad_Name", "Host names are lowercase"),
        ("x" * 501, "longer than 500 characters"),
    ],
)
def test_a_bad_scope_is_refused_with_the_reason(fleet, scope, message) -> None:
    refused(message, kind="reboot", scope=scope)


def test_an_upgrade_that_would_break_compatibility_is_refused_naming_the_rule(fleet) -> None:
    refused(
        "gpu-driver 535.183.01 would break a compatibility rule on 10 of 10 hosts, e.g. ",
        kind="upgrade",
        component="gpu-driver",
        version="535.183.01",
        scope="pool train",
    )
    refused(
        "(needs [550.54.14, any])", kind="upgrade", component="gpu-driver", version="535.183.01", scope="pool train"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "upgrade", "scope": "pool train"}, "An upgrade needs a component and a target version."),
        (
            {"kind": "upgrade", "component": "gpu-driver", "version": "999.1", "scope": "pool train"},
            "gpu-driver has no version '999.1' in the catalogue.",
        ),
        ({"kind": "reboot", "component": "bios", "scope": "pool train"}, "A reboot operation takes no component"),
        ({"kind": "reflash", "scope": "pool train"}, "'reflash' is not one of"),
        ({"kind": "reboot", "scope": "pool train", "priority": 5000}, "Priority must be a whole number from 0"),
        ({"kind": "reboot", "scope": "pool train", "reason": " "}, "Say why this operation is needed."),
        ({"kind": "reboot", "scope": "pool train", "drainer": "agent"}, "'agent' is not a drainer; choose one of"),
        (
            {"kind": "reboot", "scope": "pool train", "executor": "magic"},
            "'magic' is not an executor; choose one of: simulated, external, agent, ssh",
        ),
        ({"kind": "reboot", "scope": "pool train", "gang": True}, "can never fit in pool train's planned buffer"),
        (
            {"kind": "reboot", "scope": "pool train", "override_buffers": True},
            "Only an approved emergency may override the buffers.",
        ),
    ],
)
def test_bad_operations_are_refused_with_the_reason(fleet, fields, message) -> None:
    refused(message, **fields)


def test_a_gang_must_stay_inside_one_pool(fleet) -> None:
    _, hosts = fleet
    _, others = make_fleet(domains=1, hosts_per_domain=1, pool_name="other")
    refused(
        "A gang operation must stay inside one pool",
        kind="reboot",
        gang=True,
        scope=f"hosts: {hosts[0].hostname}, {others[0].hostname}",
    )


def test_cancelling_an_operation_cancels_its_pending_tasks_with_events(fleet) -> None:
    operation = operation_submit(kind="reboot", scope="pool train", reason="r")
    assert operation_cancel(operation_id=operation.pk, reason="wrong pool") == 10
    assert set(operation.tasks.values_list("state", flat=True)) == {"cancelled"}
    assert Operation.objects.get(pk=operation.pk).state == "cancelled"
    assert Event.objects.filter(kind="task.state_changed", data__to="cancelled").count() == 10
    with pytest.raises(ValidationError, match="is cancelled; only open operations can be cancelled"):
        operation_cancel(operation_id=operation.pk, reason="again")


def test_an_operation_cancelled_with_tasks_under_way_ends_cancelled_once_they_finish(fleet) -> None:
    pool, _hosts = fleet
    instant_simulator()
    operation = operation_submit(kind="reboot", scope="pool train", reason="r")
    pool_tick(pool_id=pool.pk)  # admits up to the planned buffer: 3 tasks under way, 7 pending
    under_way = operation.tasks.exclude(state="pending").count()
    assert under_way == 3
    assert operation_cancel(operation_id=operation.pk, reason="wrong pool", actor="ops") == 7
    cancelling = Operation.objects.get(pk=operation.pk)
    assert (cancelling.state, cancelling.cancelled_at is not None) == ("open", True)
    assert Event.objects.filter(kind="operation.cancelling", subject_id=operation.pk).count() == 1
    operation_cancel(operation_id=operation.pk, reason="still the wrong pool")  # a second cancel keeps the date
    assert Operation.objects.get(pk=operation.pk).cancelled_at == cancelling.cancelled_at

    drive(pool)

    closed = Operation.objects.get(pk=operation.pk)
    assert (closed.state, closed.closed_at is not None) == ("cancelled", True)
    assert operation.tasks.filter(state="done").count() == under_way, "the tasks under way still finished"
    kinds = set(
        Event.objects.filter(subject_id=operation.pk, kind__startswith="operation.").values_list("kind", flat=True)
    )
    assert kinds == {"operation.submitted", "operation.cancelling", "operation.cancelled"}
    assert not Host.objects.exclude(state="in_service").exists(), "every host came back"


def test_the_sweep_closes_a_cancelled_operation_cancelled_and_an_uncancelled_one_completed(fleet) -> None:
    from opsplanner.services.tick.closing import operations_close_finished

    cancelled = operation_submit(kind="reboot", scope="pool train", reason="r")
    completed = operation_submit(kind="reboot", scope="pool train", reason="r", priority=50)
    Operation.objects.filter(pk=cancelled.pk).update(cancelled_at=cancelled.created_at)
    HostTask.objects.update(state="done")  # as two ticks in two pools left them
    assert operations_close_finished() == 2
    assert Operation.objects.get(pk=cancelled.pk).state == "cancelled"
    assert Operation.objects.get(pk=completed.pk).state == "completed"
    assert Event.objects.filter(kind="operation.cancelled", subject_id=cancelled.pk).exists()
    assert Event.objects.filter(kind="operation.completed", subject_id=completed.pk).exists()


def test_percent_scopes_take_whole_hosts_rounding_up(fleet) -> None:
    assert len(resolve_scope(parse_scope("1% of pool train"))) == 1
    assert parse_scope("12.5 % of pool train").percent == Decimal("12.5")
    assert Host.objects.count() == 10


def _upgrade(host: Host, component: str, version: str) -> OperationRequest:
    return OperationRequest(
        kind="upgrade", component=component, version=version, scope="a train's host", host_ids=[host.pk], reason="r"
    )


def test_a_batch_writes_each_operation_with_its_tasks_and_events_in_order(fleet) -> None:
    _, hosts = fleet
    operations = operations_submit(
        requests=[
            _upgrade(hosts[0], "gpu-driver", "560.35.03"),
            _upgrade(hosts[1], "bios", "2.16.0"),
            OperationRequest(kind="reboot", scope="domain train/rack-0002", reason="r"),
        ],
        actor="train-scheduler",
    )
    assert [o.pk for o in operations] == sorted(o.pk for o in operations)
    assert [str(o.component_version) for o in operations] == ["gpu-driver 560.35.03", "bios 2.16.0", "None"]
    assert [list(o.tasks.values_list("host_id", flat=True)) for o in operations[:2]] == [[hosts[0].pk], [hosts[1].pk]]
    assert operations[2].tasks.count() == 5
    events = list(Event.objects.filter(kind="operation.submitted").order_by("id"))
    assert [(e.subject_id, e.data["hosts"], e.actor) for e in events] == [
        (operations[0].pk, 1, "train-scheduler"),
        (operations[1].pk, 1, "train-scheduler"),
        (operations[2].pk, 5, "train-scheduler"),
    ]


def test_a_batch_with_one_incompatible_upgrade_is_refused_whole_naming_it(fleet) -> None:
    _, hosts = fleet
    events = Event.objects.count()
    with pytest.raises(ValidationError) as caught:
        operations_submit(
            requests=[_upgrade(hosts[0], "bios", "2.16.0"), _upgrade(hosts[1], "gpu-driver", "535.183.01")]
        )
    assert "gpu-driver 535.183.01 would break a compatibility rule on 1 of 1 hosts, e.g. " in caught.value.messages[0]
    assert (Operation.objects.count(), HostTask.objects.count(), Event.objects.count()) == (0, 0, events)


def test_a_batch_refuses_an_unknown_host_or_version_and_writes_nothing(fleet) -> None:
    _, hosts = fleet
    good = _upgrade(hosts[0], "bios", "2.16.0")
    with pytest.raises(ValidationError, match=r"bios has no version '9\.9' in the catalogue"):
        operations_submit(requests=[good, _upgrade(hosts[1], "bios", "9.9")])
    unknown = OperationRequest(kind="reboot", scope="gone", host_ids=[max(h.pk for h in hosts) + 1000], reason="r")
    with pytest.raises(ValidationError, match="There is no host with id"):
        operations_submit(requests=[good, unknown])
    assert not Operation.objects.exists()
    assert not HostTask.objects.exists()


def test_a_batch_costs_the_same_queries_for_two_upgrades_as_for_eight(fleet) -> None:
    _, hosts = fleet

    def queries(n: int) -> int:
        versions = ["560.35.03", "2.16.0"]
        requests = [_upgrade(hosts[i], ("gpu-driver", "bios")[i % 2], versions[i % 2]) for i in range(n)]
        with CaptureQueriesContext(connection) as captured:
            operations_submit(requests=requests)
        return len(captured.captured_queries)

    assert queries(2) == queries(8)
