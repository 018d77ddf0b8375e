"""A host escalated to a human (out of the pool's service until a person returns it, often for days)
cannot give a phase its evidence: a fixed phase short of successes without it holds and says so
(an operator may skip it), an 'any' phase picks another host, rather than wait silently for it."""

from __future__ import annotations

import pytest

from fleet.models import Host, HostState, InstalledVersion
from opsplanner.events import event_record
from tests.builders import make_fleet
from tests.driving import busy, drive_trains, instant_simulator
from tests.trains_builders import make_train
from trains.models import UpgradePhase
from trains.models.upgrades import PhaseHoldCode
from trains.services.tick import train_tick
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


def escalate(host: Host) -> None:
    """As three failed repairs leave a host: out, waiting for a human (with the event that says so)."""
    Host.objects.filter(pk=host.pk).update(state=HostState.ESCALATED)
    event_record(
        kind="host.state_changed", subject=host, reason="three repairs failed", pool_id=host.pool_id,
        host_id=host.pk, data={"from": HostState.IN_SERVICE, "to": HostState.ESCALATED},
    )  # fmt: skip


def runs_bios_2_16(host: Host) -> bool:
    return InstalledVersion.objects.filter(host=host, component__name="bios", version__version="2.16.0").exists()


@pytest.mark.parametrize("selection", ["fixed", "any"])
def test_it_does_not_wait_for_an_escalated_host_to_give_a_phase_its_evidence(selection: str) -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=3, hosts_per_domain=2)
    train = make_train(pool)
    canary = [h for h in hosts if h.domain.name == "rack-0001"]
    upgrade = upgrade_create(
        pool=pool, component="bios", version="2.16.0", reason="rollout",
        phases=[
            {"name": "canary", "domain": "rack-0001", "min_successes": 2, "selection": selection},
            {"name": "rest", "percent": 100, "min_successes": 0},
        ],
    )  # fmt: skip
    escalate(canary[0])

    # The canary's other host is upgraded and back: 1 success of the 2 the phase needs.
    drive_trains(pool, until=lambda: runs_bios_2_16(canary[1]) and not busy([pool]))
    for _ in range(3):
        train_tick(train_id=train.pk)

    phase = UpgradePhase.objects.get(upgrade=upgrade, position=0)
    if selection == "fixed":
        assert phase.held_code == PhaseHoldCode.TOO_FEW_HOSTS  # an operator can skip it now
        assert "has 0 more hosts that still need bios 2.16.0 (1 more escalated to a human" in phase.held_reason
    else:
        assert len(phase.picked_hosts) == 1  # another host of the pool gives the second success
        assert canary[0].pk not in phase.picked_hosts
