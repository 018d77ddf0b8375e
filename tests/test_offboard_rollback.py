"""Offboarding an upgrade: no host serves its withdrawn version, wherever the host was at that moment."""

from __future__ import annotations

import pytest
from django.db import transaction

from fleet.models import Component, ComponentVersion, Host, HostState, InstalledVersion, Pool
from fleet.services import installed_version_set
from fleet.services.catalogue import versions_withdrawal_apply
from opsplanner.models import Event, HostTask, Operation, OperationSource, TaskState, WorkItem
from opsplanner.services.operations import operation_submit
from tests.builders import make_fleet, make_version
from tests.driving import busy, drive, drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import Upgrade, UpgradeState
from trains.services.offboarding import upgrade_offboard
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def hosts_running(version_id: int, state: HostState) -> set[int]:
    return set(
        InstalledVersion.objects.filter(version_id=version_id, host__state=state).values_list("host_id", flat=True)
    )


def rollout_until_a_host_returns(*, domains: int, hosts_per_domain: int) -> tuple[Pool, Upgrade, set[int]]:
    """A train rolls out the new driver until a host has passed the pre-return gate with it and is
    on its way back: the pool, the upgrade and the hosts returning."""
    instant_simulator()
    pool, _ = make_fleet(domains=domains, hosts_per_domain=hosts_per_domain)
    make_train(pool)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    drive_trains(pool, until=lambda: bool(hosts_running(upgrade.component_version_id, HostState.RETURNING)))
    return pool, upgrade, hosts_running(upgrade.component_version_id, HostState.RETURNING)


def test_a_host_past_the_pre_return_gate_when_its_upgrade_is_offboarded_is_rolled_back_once_in_service() -> None:
    pool, upgrade, returning = rollout_until_a_host_returns(domains=2, hosts_per_domain=3)
    target = upgrade.component_version_id
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")

    drive_trains(pool, until=lambda: not busy([pool]))

    assert not hosts_running(target, HostState.IN_SERVICE), "a host serves the withdrawn driver"
    rolled_back = HostTask.objects.filter(
        operation__source=OperationSource.REPAIR,
        operation__component_version__version="550.127.05",
        state=TaskState.DONE,
    )
    assert returning <= set(rolled_back.values_list("host_id", flat=True))
    assert set(Host.objects.filter(pk__in=returning).values_list("state", flat=True)) == {HostState.IN_SERVICE}


def test_a_host_the_gate_already_put_right_ends_its_rollback_with_nothing_to_do() -> None:
    pool, upgrade, returning = rollout_until_a_host_returns(domains=1, hosts_per_domain=2)
    # Something else (an operator, a repair) put the driver back before the rollback is admitted.
    old = InstalledVersion.objects.get(host_id=next(iter(returning)), component__name="gpu-driver").previous_version
    with transaction.atomic():
        upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")
    InstalledVersion.objects.filter(host_id__in=returning, component__name="gpu-driver").update(version=old)

    drive_trains(pool, until=lambda: not busy([pool]))

    rollbacks = Operation.objects.filter(source=OperationSource.REPAIR, component_version__version="550.127.05")
    tasks = HostTask.objects.filter(operation__in=rollbacks, host_id__in=returning)
    assert set(tasks.values_list("state", flat=True)) == {TaskState.DONE}
    assert not tasks.filter(drain_key__isnull=False).exists(), "a host was drained for nothing"


def test_a_host_draining_with_the_withdrawn_version_whose_drain_fails_is_rolled_back_after_it_returns() -> None:
    instant_simulator(refusing_host_fraction=1.0)
    pool, hosts = make_fleet(domains=1, hosts_per_domain=1)
    new_driver = ComponentVersion.objects.get(component__name="gpu-driver", version="560.35.03")
    installed_version_set(host=hosts[0], version=new_driver)  # an earlier drain gave it the new driver
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")
    scope = f"hosts: {hosts[0].hostname}"
    operation_submit(kind="upgrade", scope=scope, component="bios", version="2.16.0", reason="bios", actor="op")
    drive(pool, until=lambda: Host.objects.get(pk=hosts[0].pk).state == HostState.DRAINING)
    assert WorkItem.objects.get(host_task__operation__component_version__component__name="bios").state == "failed"
    with transaction.atomic():
        upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")
    instant_simulator()  # the drainer takes the host again, once the refused drain has brought it back

    drive(pool)

    assert not hosts_running(new_driver.pk, HostState.IN_SERVICE)
    assert InstalledVersion.objects.get(host=hosts[0], component__name="gpu-driver").version.version == "550.127.05"


def test_re_onboarding_cancels_the_rollbacks_not_started_so_hosts_keep_the_version_it_brings_back() -> None:
    from opsplanner.models import Event
    from opsplanner.services.approvals import approval_decide
    from tests.trains_builders import make_user
    from trains.models import UpgradeState
    from trains.services.reonboarding import upgrade_reonboard_request

    pool, upgrade, _ = rollout_until_a_host_returns(domains=2, hosts_per_domain=3)
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")
    rollbacks = HostTask.objects.filter(
        operation__source=OperationSource.REPAIR, operation__component_version__version="550.127.05"
    )
    pending = set(rollbacks.filter(state=TaskState.PENDING).values_list("id", flat=True))
    assert pending, "the offboarding queued rollbacks that have not started"

    approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="the vendor fixed it", actor=make_user())
    approval_decide(approval_id=approval.pk, approve=True, reason="fix verified", actor=make_user())

    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.ACTIVE
    cancelled = HostTask.objects.filter(pk__in=pending)
    assert set(cancelled.values_list("state", flat=True)) == {TaskState.CANCELLED}
    why = Event.objects.filter(kind="task.state_changed", subject_id__in=pending, data__to=TaskState.CANCELLED)
    assert {e.reason for e in why} == {
        f"upgrade #{upgrade.pk} re-onboarded: gpu-driver 560.35.03 is no longer withdrawn"
    }
    assert Event.objects.get(kind="upgrade.reonboarded").data == {"cancelled_rollback_tasks": len(pending)}
    assert not Host.objects.filter(pool=pool, state=HostState.ESCALATED).exists()


def a_trains_driver_upgrade() -> Upgrade:
    """An upgrade of the GPU driver in a small pool with a train."""
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    make_train(pool)
    return upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="rollout")


def _reonboard(upgrade: Upgrade) -> None:
    """One operator asks, another approves (the two-person rule)."""
    from opsplanner.services.approvals import approval_decide
    from tests.trains_builders import make_user
    from trains.services.reonboarding import upgrade_reonboard_request

    approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="the vendor fixed it", actor=make_user())
    approval_decide(approval_id=approval.pk, approve=True, reason="fix verified", actor=make_user())


def test_re_onboarding_lifts_the_withdrawal_its_offboarding_made() -> None:
    from trains.models import UpgradeState

    upgrade = a_trains_driver_upgrade()
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")
    version = ComponentVersion.objects.get(pk=upgrade.component_version_id)
    assert (version.withdrawn_by, version.withdrawn_reason) == (
        "offboarding",
        f"upgrade #{upgrade.pk} offboarded: bad driver",
    )

    _reonboard(upgrade)

    version.refresh_from_db()
    assert (version.withdrawn_at, version.withdrawn_by, version.withdrawn_reason) == (None, "", "")
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.ACTIVE


def test_re_onboarding_is_refused_while_an_operator_keeps_the_version_withdrawn_and_changes_nothing() -> None:
    from django.core.exceptions import ValidationError

    from fleet.services.catalogue import component_version_withdraw
    from opsplanner.models import Approval
    from trains.models import UpgradeState

    upgrade = a_trains_driver_upgrade()
    component_version_withdraw(version_id=upgrade.component_version_id, reason="bricks the GPU", actor="op")
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED  # the withdrawal offboarded it

    with pytest.raises(ValidationError) as refused:
        _reonboard(upgrade)

    assert refused.value.messages == [
        "gpu-driver 560.35.03 is withdrawn (bricks the GPU) and re-onboarding does not release it: an operator "
        "withdrew it: release it through the API (versions/…/release/), then re-onboard."
    ]
    assert not Approval.objects.exists()
    version = ComponentVersion.objects.get(pk=upgrade.component_version_id)
    assert (version.withdrawn_by, version.withdrawn_reason) == ("operator", "bricks the GPU")
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED


def test_an_operator_releases_their_withdrawal_and_then_the_upgrade_is_re_onboarded() -> None:
    from fleet.services.catalogue import component_version_release, component_version_withdraw
    from opsplanner.models import Event
    from trains.models import UpgradeState

    upgrade = a_trains_driver_upgrade()
    component_version_withdraw(version_id=upgrade.component_version_id, reason="bricks the GPU", actor="op")

    component_version_release(version_id=upgrade.component_version_id, reason="vendor fix verified", actor="op")

    version = ComponentVersion.objects.get(pk=upgrade.component_version_id)
    assert (version.withdrawn_at, version.withdrawn_by, version.withdrawn_reason) == (None, "", "")
    released = Event.objects.get(kind="component_version.released")
    assert (released.reason, released.data["was_withdrawn_for"]) == ("vendor fix verified", "bricks the GPU")
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED  # re-onboarded on its own
    _reonboard(upgrade)
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.ACTIVE


def test_a_release_is_refused_where_the_withdrawal_was_not_an_operators_and_says_where_it_is_released() -> None:
    from django.core.exceptions import ValidationError

    from fleet.services.catalogue import component_version_release

    upgrade = a_trains_driver_upgrade()
    with pytest.raises(ValidationError, match=r"gpu-driver 560\.35\.03 is not withdrawn\."):
        component_version_release(version_id=upgrade.component_version_id, reason="why not", actor="op")
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")

    with pytest.raises(ValidationError) as refused:
        component_version_release(version_id=upgrade.component_version_id, reason="fixed", actor="op")

    assert refused.value.messages == [
        "gpu-driver 560.35.03 is not released here: the offboarding of its upgrade withdrew it: re-onboard that "
        "upgrade (an approval)."
    ]
    assert ComponentVersion.objects.get(pk=upgrade.component_version_id).withdrawn_by == "offboarding"


def test_an_approval_given_after_an_operator_withdrew_the_version_is_refused_and_rolls_back() -> None:
    from django.core.exceptions import ValidationError

    from fleet.services.catalogue import component_version_withdraw
    from opsplanner.models import Approval, ApprovalState
    from opsplanner.services.approvals import approval_decide
    from tests.trains_builders import make_user
    from trains.models import UpgradeState
    from trains.services.reonboarding import upgrade_reonboard_request

    upgrade = a_trains_driver_upgrade()
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad driver")
    approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="the vendor fixed it", actor=make_user())
    # Meanwhile an operator withdraws the version for good: the withdrawal becomes theirs, with their
    # reason, and what the offboarding did stands (no second round of rollbacks).
    rollbacks = Operation.objects.count()
    component_version_withdraw(version_id=upgrade.component_version_id, reason="bricks the GPU", actor="op")
    assert Operation.objects.count() == rollbacks

    with (
        pytest.raises(ValidationError, match="re-onboarding does not release it: an operator withdrew it"),
        transaction.atomic(),
    ):
        approval_decide(approval_id=approval.pk, approve=True, reason="fix verified", actor=make_user())

    assert Approval.objects.get(pk=approval.pk).state == ApprovalState.PENDING
    version = ComponentVersion.objects.get(pk=upgrade.component_version_id)
    assert (version.withdrawn_by, version.withdrawn_reason) == ("operator", "bricks the GPU")
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED


def test_offboarding_an_upgrade_keeps_an_operators_withdrawal_and_its_reason() -> None:
    upgrade = a_trains_driver_upgrade()
    ComponentVersion.objects.filter(pk=upgrade.component_version_id).update(
        withdrawn_at="2030-01-01T00:00Z", withdrawn_reason="bricks the GPU", withdrawn_by="operator"
    )
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="too many failures")
    version = ComponentVersion.objects.get(pk=upgrade.component_version_id)
    assert (version.withdrawn_by, version.withdrawn_reason) == ("operator", "bricks the GPU")


def test_an_operator_withdrawing_a_version_an_offboarding_withdrew_offboards_its_other_upgrades() -> None:
    from fleet.services.catalogue import component_version_withdraw
    from trains.models import UpgradeState

    first = a_trains_driver_upgrade()
    other = a_trains_driver_upgrade()  # the same version in another pool
    assert first.pool_id != other.pool_id
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=first.pk), reason="bad driver")
    assert Upgrade.objects.get(pk=other.pk).state == UpgradeState.ACTIVE  # the withdrawal left it

    component_version_withdraw(version_id=first.component_version_id, reason="bricks the GPU", actor="op")

    other.refresh_from_db()
    assert (other.state, other.state_reason) == (UpgradeState.OFFBOARDED, "version withdrawn: bricks the GPU")
    version = ComponentVersion.objects.get(pk=first.component_version_id)
    assert (version.withdrawn_by, version.withdrawn_reason) == ("operator", "bricks the GPU")


# --- an older upgrade completed through the withdrawn version ---------------------------------------
def bios_fix_then_newer_bios(*, newer_at_once: bool) -> tuple[Pool, list[int], Upgrade, Upgrade]:
    """A bios fix (2.16.0) for the hosts of rack-0001 and a newer bios (2.17.0) whose canary is
    rack-0001 (soaking for a day: the rollout goes no further). Created at once, the canary's visit
    gives rack-0001 the newer bios directly; otherwise only once the fix completed on its own.
    The pool, rack-0001's hosts, the fix and the newer bios."""
    instant_simulator()
    # Room for the rollbacks' drains and a visit: counted as other work, they autostopped the train.
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=3, failure_buffer_hosts=0)
    make_version(Component.objects.get(name="bios"), "2.17.0")
    make_train(pool)
    fix = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="fix", scope=f"domain {pool.name}/rack-0001"
    )
    rack_1 = [h.pk for h in hosts if h.domain.name == "rack-0001"]

    def newer_bios() -> Upgrade:
        canary = {"name": "canary", "domain": "rack-0001", "min_successes": 2, "soak_s": 86400}
        rest = {"name": "rest", "percent": 100, "min_successes": 0}
        return upgrade_create(pool=pool, component="bios", version="2.17.0", reason="new", phases=[canary, rest])

    newer = newer_bios() if newer_at_once else None
    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=fix.pk).state == UpgradeState.COMPLETED)
    newer = newer or newer_bios()
    drive_trains(pool, until=lambda: bios_of(rack_1) == {"2.17.0"} and not busy([pool]))
    return pool, rack_1, fix, newer


def bios_of(host_ids: list[int]) -> set[str]:
    return set(
        InstalledVersion.objects.filter(host_id__in=host_ids, component__name="bios").values_list(
            "version__version", flat=True
        )
    )


def test_an_older_upgrade_completed_through_the_withdrawn_version_is_active_again_and_completes_on_its_own() -> None:
    pool, rack_1, fix, newer = bios_fix_then_newer_bios(newer_at_once=True)
    assert InstalledVersion.objects.filter(host_id__in=rack_1, previous_version__version="2.14.0").count() == 2

    completed_at = Upgrade.objects.get(pk=fix.pk).finished_at
    assert completed_at is not None
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=newer.pk), reason="bad bios")

    fix.refresh_from_db()
    assert (fix.state, fix.finished_at) == (UpgradeState.ACTIVE, None)
    started_at = fix.phases.get().started_at
    assert started_at is not None
    assert started_at > completed_at  # its failures count afresh
    assert Event.objects.get(kind="upgrade.offboarded").data["reopened"] == [fix.pk]
    assert fix.state_reason.startswith(
        "active again: 2 hosts of its scope reached bios 2.16.0 only through bios 2.17.0"
    )
    (reopened,) = Event.objects.filter(kind="upgrade.reopened", subject_id=fix.pk)
    assert reopened.reason == fix.state_reason
    assert reopened.data == {
        "withdrawn": "bios 2.17.0", "withdrawn_id": newer.component_version_id, "offboarded": newer.pk,
        "hosts": sorted(rack_1),
    }  # fmt: skip

    drive_trains(pool, until=lambda: Upgrade.objects.get(pk=fix.pk).state == UpgradeState.COMPLETED)
    drive_trains(pool, until=lambda: not busy([pool]))
    assert bios_of(rack_1) == {"2.16.0"}


def test_a_completed_upgrade_whose_hosts_go_back_to_its_own_version_stays_completed() -> None:
    _, rack_1, fix, newer = bios_fix_then_newer_bios(newer_at_once=False)
    assert InstalledVersion.objects.filter(host_id__in=rack_1, previous_version__version="2.16.0").count() == 2

    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=newer.pk), reason="bad bios")

    assert Upgrade.objects.get(pk=fix.pk).state == UpgradeState.COMPLETED
    assert not Event.objects.filter(kind__in=["upgrade.reopened", "alert.upgrade_fallen_back"]).exists()


def test_an_emergency_upgrade_completed_through_the_withdrawn_version_stays_completed_and_an_alert_says_why() -> None:
    _, rack_1, fix, newer = bios_fix_then_newer_bios(newer_at_once=True)
    Upgrade.objects.filter(pk=fix.pk).update(emergency=True)  # its emergency train has finished

    with transaction.atomic():
        upgrade_offboard(upgrade=Upgrade.objects.get(pk=newer.pk), reason="bad bios")

    assert Upgrade.objects.get(pk=fix.pk).state == UpgradeState.COMPLETED  # no train would take it up
    (alert,) = Event.objects.filter(kind="alert.upgrade_fallen_back", subject_id=fix.pk)
    assert "2 hosts of its scope reached bios 2.16.0 only through bios 2.17.0" in alert.reason
    assert "request another emergency train" in alert.reason
    assert alert.data["hosts"] == sorted(rack_1)


def test_an_operators_withdrawal_of_the_newer_version_reopens_the_upgrade_its_hosts_skipped() -> None:
    _, rack_1, fix, newer = bios_fix_then_newer_bios(newer_at_once=True)
    # The newer bios' upgrade is no longer active (cancelled here): withdrawing its version is the
    # operator's or the fleet file's, and offboards nothing.
    Upgrade.objects.filter(pk=newer.pk).update(state=UpgradeState.CANCELLED)
    version = ComponentVersion.objects.get(component__name="bios", version="2.17.0")

    with transaction.atomic():
        versions_withdrawal_apply(version_ids=[version.pk], reason="vendor recall", actor="op")

    fix.refresh_from_db()
    assert fix.state == UpgradeState.ACTIVE
    (reopened,) = Event.objects.filter(kind="upgrade.reopened", subject_id=fix.pk)
    assert reopened.data == {
        "withdrawn": "bios 2.17.0", "withdrawn_id": version.pk, "offboarded": None, "hosts": sorted(rack_1),
    }  # fmt: skip
    assert "only through bios 2.17.0, withdrawn: vendor recall" in reopened.reason
