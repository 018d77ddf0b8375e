"""A fleet file's plan counts what its withdrawals will set off beyond the version itself: the hosts
rolled back, the completed upgrades made active again (or left so, with an alert), and the ad-hoc
work asked for again, each counted by the selector the apply acts on, so the apply then does exactly
what the plan said; and the plan, a dry run, writes nothing."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from django.apps import apps

from fleet.fleetfile import fleet_apply
from fleet.fleetfile.export import fleet_export_document
from fleet.fleetfile.plan import FleetPlan
from fleet.fleetfile.schema import fleet_spec_from_document
from fleet.models import ComponentVersion, Host, Pool
from opsplanner.models import Event, HostTask, Operation, OperationSource
from opsplanner.roles import Role
from tests.api_helpers import role_client
from tests.driving import drive
from tests.test_offboard_rollback import bios_fix_then_newer_bios
from tests.test_superseded_resubmitted import superseded
from tests.test_superseded_versions import bios_on, bios_upgrade
from trains.models import Upgrade, UpgradeState

pytestmark = pytest.mark.django_db


class World:
    """A bios fix (2.16.0) completed on rack-0001, whose hosts then got 2.17.0 from the newer bios'
    canary; and on one host of rack-0002 an operator's ad-hoc 2.16.0 superseded by an ad-hoc 2.17.0."""

    def __init__(self, *, newer_still_active: bool) -> None:
        self.pool, self.rack_1, self.fix, self.newer = bios_fix_then_newer_bios(newer_at_once=True)
        self.host = Host.objects.filter(pool=self.pool, domain__name="rack-0002").order_by("pk").first()
        assert self.host is not None
        self.wanted = bios_upgrade([self.host], "2.16.0")
        bios_upgrade([self.host], "2.17.0")
        drive(self.pool)
        assert superseded(self.wanted, self.host)
        if not newer_still_active:  # withdrawing its version is then the file's alone, and offboards nothing
            Upgrade.objects.filter(pk=self.newer.pk).update(state=UpgradeState.CANCELLED)

    def file_withdrawing(self, reasons: dict[str, str], *, newest_first: bool = False) -> dict[str, Any]:
        """The pool's exported file with these bios versions withdrawn ({version: why}); the apply
        withdraws them in the file's order (`newest_first`: its versions listed the other way)."""
        document = fleet_export_document(pool=self.pool.name)
        bios_entry = next(c for c in document["components"] if c["name"] == "bios")
        bios_entry["versions"] = [
            {"version": v, "withdrawn": reasons[v]} if isinstance(v, str) and v in reasons else v
            for v in bios_entry["versions"]
        ]
        if newest_first:
            bios_entry["versions"].reverse()
        return document

    def first_host_on_2_18(self) -> None:
        """One host of rack-0001 goes on from 2.17.0 to 2.18.0 (ad hoc): 2.17.0 is what it ran before."""
        host = Host.objects.get(pk=self.rack_1[0])
        bios_upgrade([host], "2.18.0")
        drive(self.pool)
        assert bios_on(host) == "2.18.0"


def apply(document: dict[str, Any], *, dry_run: bool = False) -> FleetPlan:
    return fleet_apply(spec=fleet_spec_from_document(copy.deepcopy(document)), dry_run=dry_run)


def withdrawal_of(plan: FleetPlan, version: str) -> dict[str, Any]:
    [change] = [c for c in plan.of("version", "update") if c.name == f"bios {version}"]
    assert change.withdrawal is not None
    return change.withdrawal


def rows_of_every_table() -> dict[str, int]:
    return {
        model._meta.label: model._base_manager.count()
        for model in apps.get_models()
        if model._meta.app_label in ("fleet", "opsplanner", "trains")
    }


def rollback_hosts() -> int:
    return HostTask.objects.filter(operation__source=OperationSource.REPAIR).count()


@pytest.mark.parametrize("newer_still_active", [True, False], ids=["offboarding", "no-upgrade-active"])
def test_the_plan_counts_the_reopenings_and_resubmissions_a_withdrawal_makes_and_the_apply_makes_them(
    newer_still_active: bool,
) -> None:
    world = World(newer_still_active=newer_still_active)
    document = world.file_withdrawing({"2.17.0": "bricks NICs"})

    said = withdrawal_of(apply(document, dry_run=True), "2.17.0")

    assert said["offboards"] == ([world.newer.pk] if newer_still_active else [])
    assert said["reopens"] == [world.fix.pk]
    assert (said["resubmits_operations"], said["resubmits_hosts"], said["rolls_back_hosts"]) == (1, 1, 3)
    (change,) = apply(document, dry_run=True).of("version", "update")
    assert f"reopens upgrade #{world.fix.pk}; resubmits 1 operations for 1 hosts" in change.note

    apply(document)

    assert list(Event.objects.filter(kind="upgrade.reopened").values_list("subject_id", flat=True)) == said["reopens"]
    assert Upgrade.objects.get(pk=world.fix.pk).state == UpgradeState.ACTIVE
    resubmitted = Operation.objects.filter(resubmission_of=world.wanted)
    assert resubmitted.count() == said["resubmits_operations"]
    assert HostTask.objects.filter(operation__in=resubmitted).count() == said["resubmits_hosts"]
    assert rollback_hosts() == said["rolls_back_hosts"]


def test_a_plan_of_a_file_withdrawing_the_version_asked_for_too_counts_the_alerts_instead() -> None:
    world = World(newer_still_active=False)
    document = world.file_withdrawing({"2.16.0": "leaks memory", "2.17.0": "bricks NICs"})

    said = withdrawal_of(apply(document, dry_run=True), "2.17.0")

    assert (said["reopens"], said["fallen_back_alerts"]) == ([], [world.fix.pk])
    assert (said["resubmits_operations"], said["resubmission_refused_hosts"]) == (0, 1)

    apply(document)

    alerted = Event.objects.filter(kind="alert.upgrade_fallen_back").values_list("subject_id", flat=True)
    assert list(alerted) == said["fallen_back_alerts"]
    assert not Operation.objects.filter(resubmission_of=world.wanted).exists()
    [refused] = Event.objects.filter(kind="alert.resubmission_refused")
    assert refused.data["hosts"] == [world.host.pk]


def test_the_plan_of_a_withdrawal_writes_nothing() -> None:
    world = World(newer_still_active=True)
    before = rows_of_every_table()
    states = dict(Upgrade.objects.values_list("pk", "state"))

    plan = apply(world.file_withdrawing({"2.17.0": "bricks NICs"}), dry_run=True)

    assert withdrawal_of(plan, "2.17.0")["reopens"] == [world.fix.pk]
    assert rows_of_every_table() == before
    assert dict(Upgrade.objects.values_list("pk", "state")) == states
    assert Pool.objects.get(pk=world.pool.pk).planned_buffer_hosts == 3


def test_the_api_answers_the_same_counts_with_the_plan() -> None:
    world = World(newer_still_active=True)
    document = world.file_withdrawing({"2.17.0": "bricks NICs"})

    response = role_client(Role.OPERATOR).post("/api/fleet/apply/?dry_run=true", document, format="json")

    assert response.status_code == 200, response.content
    [change] = [c for c in response.json()["changes"] if c["kind"] == "version"]
    assert change["withdrawal"] == withdrawal_of(apply(document, dry_run=True), "2.17.0")
    assert (change["withdrawal"]["reopens"], change["withdrawal"]["resubmits_hosts"]) == ([world.fix.pk], 1)
    assert Event.objects.filter(kind__in=["upgrade.reopened", "operation.resubmitted"]).count() == 0


TOTALS = ("rolls_back_hosts", "cancels_tasks", "stops_installs", "resubmits_operations", "resubmits_hosts",
          "resubmission_refused_hosts")  # fmt: skip


def said_by_the_plan(plan: FleetPlan) -> dict[str, Any]:
    """What the plan says its withdrawals will do, all versions together; the reopenings, alerts
    and refused rollbacks by the version whose withdrawal makes them."""
    said: dict[str, Any] = {
        "offboards": [],
        "reopens": [],
        "fallen_back_alerts": [],
        "rollback_refused_hosts": Counter(),
    }
    said |= dict.fromkeys(TOTALS, 0)
    for change in plan.of("version", "update"):
        if (withdrawal := change.withdrawal) is None:
            continue
        said["offboards"] = sorted(said["offboards"] + withdrawal["offboards"])
        said["reopens"] = sorted(said["reopens"] + [(change.name, pk) for pk in withdrawal["reopens"]])
        alerts = [(change.name, pk) for pk in withdrawal["fallen_back_alerts"]]
        said["fallen_back_alerts"] = sorted(said["fallen_back_alerts"] + alerts)
        said["rollback_refused_hosts"][change.name] += withdrawal["rollback_refused_hosts"]
        for name in TOTALS:
            said[name] += withdrawal[name]
    return said | {"rollback_refused_hosts": +said["rollback_refused_hosts"]}


def done_by_the_apply() -> dict[str, Any]:
    """What the apply did, read from its events, operations and tasks, in the plan's terms."""

    def events(kind: str) -> list[Event]:
        return list(Event.objects.filter(kind=kind).order_by("id"))

    names = {pk: str(v) for pk, v in ComponentVersion.objects.select_related("component").in_bulk().items()}
    targets = {pk: names[version_id] for pk, version_id in Upgrade.objects.values_list("pk", "component_version_id")}
    withdrawals = [e.data for e in events("component_version.updated") if "pending_tasks_cancelled" in e.data]
    resubmitted = Operation.objects.filter(resubmission_of__isnull=False)
    resubmission_refusals = events("alert.resubmission_refused")
    refused_rollbacks = [(names[e.subject_id], e) for e in events("component_version.rollback_refused")]
    refused_rollbacks += [(targets[e.subject_id], e) for e in events("upgrade.rollback_refused")]
    return {
        "offboards": sorted(e.subject_id for e in events("upgrade.offboarded")),
        "rolls_back_hosts": rollback_hosts(),
        "rollback_refused_hosts": Counter(version for version, e in refused_rollbacks for _ in e.data["hosts"]),
        "cancels_tasks": sum(data["pending_tasks_cancelled"] for data in withdrawals),
        "stops_installs": sum(data["installs_stopped"] for data in withdrawals),
        "reopens": sorted((e.data["withdrawn"], e.subject_id) for e in events("upgrade.reopened")),
        "fallen_back_alerts": sorted((e.data["withdrawn"], e.subject_id) for e in events("alert.upgrade_fallen_back")),
        "resubmits_operations": resubmitted.count(),
        "resubmits_hosts": HostTask.objects.filter(operation__in=resubmitted).count(),
        "resubmission_refused_hosts": sum(len(e.data["hosts"]) for e in resubmission_refusals),
    }


@pytest.mark.parametrize(
    ("withdrawn", "newest_first", "newer_still_active"),
    [
        (("2.17.0", "2.18.0"), False, False),
        (("2.17.0", "2.18.0"), True, False),
        (("2.16.0", "2.17.0", "2.18.0"), False, False),
        (("2.17.0", "2.18.0"), False, True),
    ],
    ids=["two", "two-newest-first", "three", "two-offboarding"],
)
def test_a_file_withdrawing_several_versions_at_once_has_the_plan_its_apply_does(
    withdrawn: tuple[str, ...], newest_first: bool, newer_still_active: bool
) -> None:
    world = World(newer_still_active=newer_still_active)
    world.first_host_on_2_18()
    document = world.file_withdrawing({v: f"bad {v}" for v in withdrawn}, newest_first=newest_first)

    said = said_by_the_plan(apply(document, dry_run=True))
    apply(document)

    assert said == done_by_the_apply()


def test_a_fix_two_withdrawn_versions_took_hosts_below_is_reopened_once_by_the_first_withdrawn() -> None:
    world = World(newer_still_active=False)
    world.first_host_on_2_18()
    document = world.file_withdrawing({"2.17.0": "bricks NICs", "2.18.0": "worse"}, newest_first=True)

    plan = apply(document, dry_run=True)

    assert (withdrawal_of(plan, "2.18.0")["reopens"], withdrawal_of(plan, "2.17.0")["reopens"]) == ([world.fix.pk], [])


def test_the_plan_counts_as_refused_the_rollback_to_a_version_the_file_withdraws_too() -> None:
    world = World(newer_still_active=False)
    world.first_host_on_2_18()
    document = world.file_withdrawing({"2.17.0": "bricks NICs", "2.18.0": "worse"})

    plan = apply(document, dry_run=True)

    said = withdrawal_of(plan, "2.18.0")
    assert (said["rolls_back_hosts"], said["rollback_refused_hosts"]) == (0, 1)
    [change] = [c for c in plan.of("version", "update") if c.name == "bios 2.18.0"]
    assert "refuses the rollback of the 1 hosts whose previous version is withdrawn" in change.note


# --- a version offboarded in several pools at once ----------------------------------------------------
def a_second_pool_upgrading_to(version: str) -> Upgrade:
    """Another pool, whose own train has yet to take its hosts to this bios version: its upgrade."""
    from tests.builders import make_fleet
    from tests.trains_builders import make_train
    from trains.services.upgrades import upgrade_create

    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    make_train(pool)
    return upgrade_create(pool=pool, component="bios", version=version, reason="new bios here too")


def operator_withdraws(version: str, reason: str) -> None:
    from fleet.services.catalogue import component_version_withdraw

    bios = ComponentVersion.objects.get(component__name="bios", version=version)
    component_version_withdraw(version_id=bios.pk, reason=reason, actor="op")


@pytest.mark.parametrize("by", ["operator", "fleet file"])
def test_a_version_offboarded_in_two_pools_at_once_alerts_once_for_what_its_rollback_takes_below(by: str) -> None:
    world = World(newer_still_active=True)
    other = a_second_pool_upgrading_to("2.17.0")
    reasons = {"2.16.0": "leaks memory", "2.17.0": "bricks NICs"}  # the fix's own version withdrawn first

    if by == "operator":
        for version, reason in reasons.items():
            operator_withdraws(version, reason)
    else:
        document = world.file_withdrawing(reasons)
        said = said_by_the_plan(apply(document, dry_run=True))
        apply(document)
        assert said == done_by_the_apply()

    offboarded = Event.objects.filter(kind="upgrade.offboarded")
    assert sorted(offboarded.values_list("subject_id", flat=True)) == [world.newer.pk, other.pk]
    fallen_back = Event.objects.filter(kind="alert.upgrade_fallen_back")
    assert list(fallen_back.values_list("subject_id", flat=True)) == [world.fix.pk]
    [refused] = Event.objects.filter(kind="alert.resubmission_refused")
    assert refused.data["hosts"] == [world.host.pk]


def test_the_first_upgrade_offboarded_of_a_version_withdrawn_in_two_pools_says_what_was_asked_again() -> None:
    world = World(newer_still_active=True)
    other = a_second_pool_upgrading_to("2.17.0")

    operator_withdraws("2.17.0", "bricks NICs")

    [resubmission] = Operation.objects.filter(resubmission_of=world.wanted).values_list("pk", flat=True)
    said = {
        e.subject_id: (e.data["reopened"], e.data["resubmitted"])
        for e in Event.objects.filter(kind="upgrade.offboarded")
    }
    assert said == {world.newer.pk: ([world.fix.pk], [resubmission]), other.pk: ([], [])}
    assert Event.objects.filter(kind="upgrade.reopened").count() == 1


def test_a_version_offboarded_in_two_pools_at_once_refuses_a_hosts_rollback_once() -> None:
    # 2.17.0 has an active upgrade in two pools; rack-0001's hosts on it ran 2.14.0 before, which the
    # same file withdraws: their rollback is refused once, not once per upgrade offboarded.
    world = World(newer_still_active=True)
    a_second_pool_upgrading_to("2.17.0")
    world.first_host_on_2_18()
    document = world.file_withdrawing({"2.14.0": "old", "2.17.0": "bricks NICs"})
    said = said_by_the_plan(apply(document, dry_run=True))

    apply(document)

    assert said == done_by_the_apply()
    assert Event.objects.filter(kind="upgrade.rollback_refused").count() == 1


def test_re_onboarding_the_second_pools_upgrade_cancels_the_rollbacks_the_first_pools_offboarding_queued() -> None:
    # One withdrawal offboards 2.17.0 in two pools; the first offboarding rolls it back everywhere and
    # the second's event names no rollback. Released and re-onboarded from the second pool, the
    # version may serve again: its rollbacks not started are cancelled, as from the first pool.
    from fleet.services.catalogue import component_version_release
    from opsplanner.models import Approval, OperationState, TaskState
    from opsplanner.services.approvals import approval_decide
    from tests.trains_builders import make_user
    from trains.services.reonboarding import upgrade_reonboard_request

    world = World(newer_still_active=True)
    other = a_second_pool_upgrading_to("2.17.0")
    operator_withdraws("2.17.0", "bricks NICs")
    [first] = Event.objects.filter(kind="upgrade.offboarded", subject_id=world.newer.pk).values_list("data", flat=True)
    rollbacks = Operation.objects.filter(pk__in=first["rollbacks"], tasks__state=TaskState.PENDING).distinct()
    assert rollbacks.exists()
    bios = ComponentVersion.objects.get(component__name="bios", version="2.17.0")
    component_version_release(version_id=bios.pk, reason="false alarm", actor="op")

    requester, approver = make_user(), make_user()
    upgrade_reonboard_request(upgrade_id=other.pk, reason="false alarm", actor=requester)
    approval = Approval.objects.get(subject_type="trains.upgrade", subject_id=other.pk)
    approval_decide(approval_id=approval.pk, approve=True, reason="agreed", actor=approver)

    assert Upgrade.objects.get(pk=other.pk).state == UpgradeState.ACTIVE
    assert not Operation.objects.filter(pk__in=first["rollbacks"], tasks__state=TaskState.PENDING).exists()
    assert set(Operation.objects.filter(pk__in=first["rollbacks"]).values_list("state", flat=True)) == {
        OperationState.CANCELLED
    }
    [reonboarded] = Event.objects.filter(kind="upgrade.reonboarded", subject_id=other.pk)
    assert reonboarded.data["cancelled_rollback_tasks"] > 0
