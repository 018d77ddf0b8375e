"""A completed upgrade left below its target by a withdrawn version's rollback (an emergency one, which
no train takes up again) is alerted for once per withdrawn version: a later offboarding of the same
version in another pool, its hosts still on it, says it not again; another version's withdrawal, or
the upgrade completed again since, or a host no alert named (the version released and withdrawn
again), still does. The fleet file's plan counts them by the same rule."""

from __future__ import annotations

import pytest
from django.db import transaction

from fleet.models import ComponentVersion, InstalledVersion
from fleet.services.catalogue import component_version_release, component_version_withdraw
from opsplanner import clock
from opsplanner.events import event_record
from opsplanner.models import Event
from tests.test_fleet_plan_withdrawal_effects import a_second_pool_upgrading_to
from tests.test_offboard_rollback import bios_fix_then_newer_bios
from trains.models import Upgrade
from trains.services.offboarding import upgrade_offboard, upgrades_fallen_back

pytestmark = pytest.mark.django_db


def an_emergency_fix_completed_through_2_17_with_2_17_upgrading_in_two_pools() -> tuple[Upgrade, Upgrade, Upgrade]:
    """The emergency bios fix (2.16.0) rack-0001 completed through 2.17.0, the newer bios' upgrade in
    its pool, and another pool's upgrade to 2.17.0."""
    _, _, fix, newer = bios_fix_then_newer_bios(newer_at_once=True)
    Upgrade.objects.filter(pk=fix.pk).update(emergency=True)  # its emergency train has finished
    return Upgrade.objects.get(pk=fix.pk), newer, a_second_pool_upgrading_to("2.17.0")


def offboard(upgrade: Upgrade) -> None:
    with transaction.atomic():
        assert upgrade_offboard(upgrade=Upgrade.objects.get(pk=upgrade.pk), reason="bad bios")


def alerts_for(upgrade: Upgrade) -> list[Event]:
    return list(Event.objects.filter(kind="alert.upgrade_fallen_back", subject_id=upgrade.pk).order_by("pk"))


def test_a_second_offboarding_of_the_version_in_another_pool_alerts_not_again_for_the_same_upgrade() -> None:
    fix, newer, other = an_emergency_fix_completed_through_2_17_with_2_17_upgrading_in_two_pools()
    offboard(newer)
    first = alerts_for(fix)

    offboard(other)  # later, its own pool's tick: the fix's hosts still run 2.17.0

    assert len(first) == 1
    assert alerts_for(fix) == first
    assert first[0].data["withdrawn_id"] == newer.component_version_id
    [fallen] = upgrades_fallen_back(ComponentVersion.objects.get(pk=newer.component_version_id))
    assert (fallen.upgrade.pk, fallen.alerted, fallen.alert) == (fix.pk, True, False)  # what the plan counts too


def test_an_alert_for_another_withdrawn_version_does_not_keep_this_ones() -> None:
    fix, newer, _ = an_emergency_fix_completed_through_2_17_with_2_17_upgrading_in_two_pools()
    another = ComponentVersion.objects.get(component__name="bios", version="2.14.0")
    event_record(kind="alert.upgrade_fallen_back", subject=fix, reason="earlier", data={"withdrawn_id": another.pk})

    offboard(newer)

    assert [alert.data.get("withdrawn_id") for alert in alerts_for(fix)] == [another.pk, newer.component_version_id]


def test_an_upgrade_completed_again_since_the_alert_is_alerted_for_again() -> None:
    fix, newer, other = an_emergency_fix_completed_through_2_17_with_2_17_upgrading_in_two_pools()
    offboard(newer)
    Upgrade.objects.filter(pk=fix.pk).update(finished_at=clock.now())  # completed again since, as if reopened

    offboard(other)

    assert len(alerts_for(fix)) == 2


def test_a_host_no_alert_named_falling_back_on_a_later_withdrawal_is_alerted_for() -> None:
    # Released between the withdrawals: a host of the fix reached the version again (from 2.14.0, as a
    # new train's canary would take it), and the second withdrawal takes it below the fix too.
    fix, newer, _ = an_emergency_fix_completed_through_2_17_with_2_17_upgrading_in_two_pools()
    bios = ComponentVersion.objects.get(pk=newer.component_version_id)
    older = ComponentVersion.objects.get(component__name="bios", version="2.14.0")
    [(kept, back)] = [fallen.hosts for fallen in upgrades_fallen_back(bios)]
    InstalledVersion.objects.filter(host_id=back, component=bios.component).update(version=older, previous_version=None)
    component_version_withdraw(version_id=bios.pk, reason="bad bios", actor="op")
    component_version_release(version_id=bios.pk, reason="a false alarm", actor="op")
    InstalledVersion.objects.filter(host_id=back, component=bios.component).update(version=bios, previous_version=older)
    [fallen] = upgrades_fallen_back(bios)
    assert (fallen.hosts, fallen.alerted, fallen.alert) == ([kept, back], False, True)  # what the plan counts too

    component_version_withdraw(version_id=bios.pk, reason="bad bios after all", actor="op")

    assert [alert.data["hosts"] for alert in alerts_for(fix)] == [[kept], [kept, back]]
