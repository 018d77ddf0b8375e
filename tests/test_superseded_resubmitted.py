"""Nothing lost when the version that superseded an operator's ad-hoc upgrade is withdrawn after it
was applied: the rollback takes the host to what it ran before N+1, below the N the operator asked
for, so the withdrawal resubmits N for that host (an ad-hoc operation linked to the original, with an
event saying why), applied after the rollback in the same drain. Once per superseded task, not for
an operation the operator cancelled, and not for an N withdrawn since, even in the same fleet file
apply, nor on a host that may no longer take it (an alert names those; the other hosts still get it)."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.db.models import F

from fleet.fleetfile import fleet_apply
from fleet.fleetfile.export import fleet_export_document
from fleet.fleetfile.schema import fleet_spec_from_document
from fleet.models import Component, ComponentVersion, Host, Pool
from fleet.services import installed_version_set
from fleet.services.catalogue import component_version_release, component_version_withdraw
from fleet.services.host_changes import host_retire
from fleet.services.inventory import compatibility_rule_create
from opsplanner.models import Event, HostTask, Operation, OperationSource, TaskState
from opsplanner.models.operations import FailureCode
from opsplanner.services.approvals import approval_decide
from opsplanner.services.operation_cancel import operation_cancel
from tests.builders import make_fleet, make_version
from tests.driving import drive, instant_simulator
from tests.test_offboard_rollback import bios_fix_then_newer_bios
from tests.test_superseded_versions import bios, bios_on, bios_upgrade
from tests.trains_builders import make_user
from trains.models import Upgrade, UpgradeState
from trains.services.offboarding import upgrade_offboard
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def superseded(operation: Operation, host: Host) -> bool:
    task = operation.tasks.get(host=host)
    return (task.state, task.failure_code) == (TaskState.CANCELLED, FailureCode.SUPERSEDED)


def n_superseded_by_an_applied_n_plus_one(hosts: int = 1, **n_fields: object) -> tuple[Operation, list[Host]]:
    """Hosts on bios 2.14.0 (one by default) asked for 2.16.0 (N) by an operator, then for 2.18.0
    (N+1): they got 2.18.0 directly and the 2.16.0 tasks ended superseded. The operation to 2.16.0
    and the hosts."""
    instant_simulator()
    pool, fleet = make_fleet(domains=1, hosts_per_domain=hosts)
    wanted = bios_upgrade(fleet, "2.16.0", **n_fields)
    bios_upgrade(fleet, "2.18.0")
    drive(pool)
    assert [bios_on(host) for host in fleet] == ["2.18.0"] * hosts
    assert all(superseded(wanted, host) for host in fleet)
    return wanted, fleet


def withdraw_n_plus_one() -> None:
    component_version_withdraw(version_id=bios("2.18.0").pk, reason="bricks NICs", actor="op2")


def fleet_file_withdrawing(pool: Pool, reasons: dict[str, str]) -> None:
    """Apply the pool's exported fleet file with these bios versions withdrawn ({version: why})."""
    document = fleet_export_document(pool=pool.name)
    bios_entry = next(c for c in document["components"] if c["name"] == "bios")
    bios_entry["versions"] = [
        {"version": v, "withdrawn": reasons[v]} if isinstance(v, str) and v in reasons else v
        for v in bios_entry["versions"]
    ]
    fleet_apply(spec=fleet_spec_from_document(document))


def cuda_on_one_host_that_bars(host: Host, version: str) -> None:
    """The host alone now runs cuda-runtime 12.6.0, which works only with bios below `version`."""
    cuda = make_version(Component.objects.get(name="cuda-runtime"), "12.6.0")
    installed_version_set(host=host, version=cuda)
    compatibility_rule_create(job_facing_version=cuda, lower_component=bios(version).component, max_version="2.15.0")


def resubmissions_of(operation: Operation) -> list[Operation]:
    return list(Operation.objects.filter(resubmission_of=operation))


def drains_of(host: Host) -> int:
    return HostTask.objects.filter(host=host, drain_key=F("id")).count()


def test_an_n_superseded_by_an_n_plus_one_withdrawn_after_it_was_applied_is_installed_after_the_rollback() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one(priority=80, needs_drain=True)
    drains_before = drains_of(hosts[0])

    withdraw_n_plus_one()
    drive(hosts[0].pool)

    assert bios_on(hosts[0]) == "2.16.0"  # not left on 2.14.0, where the rollback takes it
    [again] = resubmissions_of(wanted)
    assert (again.source, again.component_version, again.priority, again.needs_drain) == (
        OperationSource.AD_HOC, bios("2.16.0"), 80, True,
    )  # fmt: skip
    assert again.tasks.get().state == TaskState.DONE
    rollback = HostTask.objects.get(operation__source=OperationSource.REPAIR, host=hosts[0])
    assert rollback.state == TaskState.HANDED_OVER  # the rollback first, then 2.16.0, in one drain
    assert drains_of(hosts[0]) == drains_before + 1
    event = Event.objects.get(kind="operation.resubmitted")
    assert (event.subject_id, event.data["original"], event.data["hosts"]) == (again.pk, wanted.pk, [hosts[0].pk])
    assert "2.18.0" in event.reason


def test_an_n_superseded_by_an_n_plus_one_whose_upgrade_is_offboarded_is_resubmitted() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()
    upgrade = upgrade_create(pool=hosts[0].pool, component="bios", version="2.18.0", reason="the rest of the pool")

    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")
    drive(hosts[0].pool)

    assert bios_on(hosts[0]) == "2.16.0"
    assert len(resubmissions_of(wanted)) == 1
    offboarded = Event.objects.get(kind="upgrade.offboarded")
    assert offboarded.data["resubmitted"] == [resubmissions_of(wanted)[0].pk]


def test_a_resubmission_finds_nothing_to_do_once_the_n_plus_one_is_re_onboarded_before_the_host_left_it() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()
    upgrade = upgrade_create(pool=hosts[0].pool, component="bios", version="2.18.0", reason="the rest of the pool")
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bricks NICs")
    drains_before = drains_of(hosts[0])

    approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="the vendor fixed it", actor=make_user())
    approval_decide(approval_id=approval.pk, approve=True, reason="fix verified", actor=make_user())
    drive(hosts[0].pool)

    assert bios_on(hosts[0]) == "2.18.0"  # not taken back down to 2.16.0
    [again] = resubmissions_of(wanted)
    assert again.tasks.get().state == TaskState.DONE
    assert drains_of(hosts[0]) == drains_before


def test_withdrawing_again_after_a_release_resubmits_nothing_twice() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()
    withdraw_n_plus_one()
    component_version_release(version_id=bios("2.18.0").pk, reason="false alarm", actor="op2")

    withdraw_n_plus_one()  # before any tick: the host still runs 2.18.0
    drive(hosts[0].pool)

    assert len(resubmissions_of(wanted)) == 1
    assert bios_on(hosts[0]) == "2.16.0"


def test_a_resubmission_the_operator_cancelled_is_not_made_again_by_the_next_withdrawal() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()
    withdraw_n_plus_one()
    [again] = resubmissions_of(wanted)
    operation_cancel(operation_id=again.pk, reason="2.16.0 is not wanted after all", actor="op")
    component_version_release(version_id=bios("2.18.0").pk, reason="false alarm", actor="op2")

    withdraw_n_plus_one()
    drive(hosts[0].pool)

    assert resubmissions_of(wanted) == [again]
    assert bios_on(hosts[0]) == "2.14.0"


def test_an_n_withdrawn_itself_is_not_resubmitted_and_an_alert_says_so() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()
    component_version_withdraw(version_id=bios("2.16.0").pk, reason="leaks memory", actor="op2")

    withdraw_n_plus_one()
    drive(hosts[0].pool)

    assert resubmissions_of(wanted) == []
    assert bios_on(hosts[0]) == "2.14.0"
    alert = Event.objects.get(kind="alert.resubmission_refused")
    assert (alert.subject_id, alert.data["hosts"]) == (wanted.pk, [hosts[0].pk])
    assert alert.data["refusal"] == "bios 2.16.0 is withdrawn: leaks memory"


def test_an_n_the_fleet_file_withdraws_with_the_n_plus_one_that_superseded_it_is_not_resubmitted() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()

    fleet_file_withdrawing(hosts[0].pool, {"2.16.0": "leaks memory", "2.18.0": "bricks NICs"})
    drive(hosts[0].pool)

    assert resubmissions_of(wanted) == []  # none left waiting, refused, for ever
    assert bios_on(hosts[0]) == "2.14.0"
    alert = Event.objects.get(kind="alert.resubmission_refused")
    assert (alert.subject_id, alert.data["hosts"]) == (wanted.pk, [hosts[0].pk])
    assert alert.data["refusal"] == "bios 2.16.0 is withdrawn: leaks memory"


def test_an_n_now_incompatible_is_not_resubmitted_and_an_alert_says_so() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one()
    cuda = ComponentVersion.objects.get(component__name="cuda-runtime", version="12.4.1")
    compatibility_rule_create(job_facing_version=cuda, lower_component=bios("2.16.0").component, max_version="2.15.0")

    withdraw_n_plus_one()
    drive(hosts[0].pool)

    assert resubmissions_of(wanted) == []
    assert bios_on(hosts[0]) == "2.14.0"  # the rollback, still compatible, ran
    alert = Event.objects.get(kind="alert.resubmission_refused")
    assert (alert.subject_id, alert.data["hosts"]) == (wanted.pk, [hosts[0].pk])
    assert "would break a compatibility rule" in alert.data["refusal"]


def test_a_host_now_incompatible_with_n_does_not_cost_the_other_hosts_their_resubmission() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one(hosts=2)
    cuda_on_one_host_that_bars(hosts[1], "2.16.0")

    withdraw_n_plus_one()
    drive(hosts[0].pool)

    [again] = resubmissions_of(wanted)
    assert list(again.tasks.values_list("host_id", flat=True)) == [hosts[0].pk]
    assert [bios_on(host) for host in hosts] == ["2.16.0", "2.14.0"]
    alert = Event.objects.get(kind="alert.resubmission_refused")
    assert (alert.subject_id, alert.data["hosts"]) == (wanted.pk, [hosts[1].pk])
    assert list(alert.data["refused"]) == [hosts[1].hostname]
    assert "bios 2.16.0 does not work with cuda-runtime 12.6.0" in alert.data["refusal"]


def test_a_host_retired_since_does_not_cost_the_other_hosts_their_resubmission() -> None:
    wanted, hosts = n_superseded_by_an_applied_n_plus_one(hosts=3)
    host_retire(hostname=hosts[2].hostname, reason="leaves the fleet", actor="op")

    withdraw_n_plus_one()
    drive(hosts[0].pool)

    [again] = resubmissions_of(wanted)
    assert sorted(again.tasks.values_list("host_id", flat=True)) == [hosts[0].pk, hosts[1].pk]
    assert [bios_on(host) for host in hosts[:2]] == ["2.16.0", "2.16.0"]
    alert = Event.objects.get(kind="alert.resubmission_refused")
    assert (alert.data["hosts"], list(alert.data["refused"])) == ([hosts[2].pk], [hosts[2].hostname])
    assert hosts[2].hostname in alert.reason
    assert "retired" in alert.data["refusal"]


def test_an_operation_the_operator_cancelled_is_not_resubmitted() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    bios_upgrade(hosts[:1], "2.18.0")  # first in the queue: the one host the buffer lets out
    wanted = bios_upgrade(hosts, "2.16.0")
    drive(pool, until=lambda: superseded(wanted, hosts[0]), check=False)
    operation_cancel(operation_id=wanted.pk, reason="not needed any more", actor="op")
    drive(pool)

    withdraw_n_plus_one()
    drive(pool)

    assert resubmissions_of(wanted) == []
    assert bios_on(hosts[0]) == "2.14.0"


def test_a_host_that_asked_for_nothing_below_the_withdrawn_version_gets_only_its_rollback() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    bios_upgrade(hosts, "2.18.0")
    drive(pool)

    withdraw_n_plus_one()
    drive(pool)

    assert not Event.objects.filter(kind="operation.resubmitted").exists()
    assert Operation.objects.filter(source=OperationSource.AD_HOC).count() == 1
    assert bios_on(hosts[0]) == "2.14.0"


def test_a_fleet_file_withdrawing_a_completed_fix_with_the_version_that_superseded_it_does_not_reopen_it() -> None:
    # The train's side of the above: the fix to a version the same apply withdraws was made active
    # again, an upgrade to a withdrawn version (helper-54).
    pool, _, fix, _ = bios_fix_then_newer_bios(newer_at_once=True)

    fleet_file_withdrawing(pool, {"2.16.0": "leaks memory", "2.17.0": "bricks NICs"})

    assert Upgrade.objects.get(pk=fix.pk).state == UpgradeState.COMPLETED
    [alert] = Event.objects.filter(kind="alert.upgrade_fallen_back", subject_id=fix.pk)
    assert "bios 2.16.0 is withdrawn: leaks memory: not made active again" in alert.reason
