"""Interrupted jobs: a job is interrupted when its first host leaves service and runs again once all
its hosts are back. A host of it leaving at the very instant the last one came back (the next domain
of a train drained in the same tick the previous one returned) leaves it no time to run: it is the
same interruption, not a second one."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fleet.models import HostState
from opsplanner.models import Event
from simulation.config import SimulationConfig
from simulation.engine import RunLog, Sample
from simulation.measure import run_measure
from simulation.policies import Policy, Rollout
from simulation.world import SimPool, World

pytestmark = pytest.mark.django_db

CONFIG = SimulationConfig(hosts=4, pools=1, hosts_per_domain=2, days=1)
POOL_ID = 1
JOB = 100
HOSTS = [11, 12, 13, 14]  # the job runs on the first two


class Idle(Policy):
    """A policy that did nothing: the measures read only the events a test writes."""

    def rollouts(self) -> list[Rollout]:
        return []


def at(minutes: float) -> dt.datetime:
    return CONFIG.start + dt.timedelta(minutes=minutes)


def moved(host: int, minutes: float, before: str, after: str) -> None:
    """A host's state change, as the tick records it (events of one instant in the order written)."""
    Event.objects.create(
        created_at=at(minutes), kind="host.state_changed", actor="simulator", subject_type="fleet.host",
        subject_id=host, pool_id=POOL_ID, host_id=host, data={"from": before, "to": after},
    )  # fmt: skip


def drained(host: int, minutes: float) -> None:
    moved(host, minutes, HostState.IN_SERVICE, HostState.DRAINING)


def broke(host: int, minutes: float) -> None:
    moved(host, minutes, HostState.IN_SERVICE, HostState.FAILED)


def returned(host: int, minutes: float) -> None:
    moved(host, minutes, HostState.RETURNING, HostState.IN_SERVICE)


def interruptions() -> dict[str, Any]:
    world = World(pools=[SimPool(id=POOL_ID, name="sim-00", number=0, host_ids=HOSTS, domain_ids=[])])
    world.jobs = {JOB: HOSTS[:2]}
    # The capacity measure integrates the samples from the first one: the pool whole at the start.
    samples = [Sample(at=CONFIG.start, counts={POOL_ID: (len(HOSTS), 0, 0)})]
    (pool,) = run_measure(CONFIG, RunLog(policy=Idle(CONFIG, world), world=world, samples=samples))["pools"]
    return {key: pool[key] for key in ("jobs", "drains", "interrupted_by_drains", "interrupted_by_failures")}


def test_a_job_drained_again_in_the_instant_its_hosts_came_back_is_interrupted_once() -> None:
    drained(11, 0)
    returned(11, 60)
    drained(12, 60)  # the next domain, admitted in the tick that returned the previous one
    returned(12, 120)

    assert interruptions() == {"jobs": 1, "drains": 2, "interrupted_by_drains": 1, "interrupted_by_failures": 0}


def test_a_job_whose_host_breaks_in_the_instant_its_hosts_came_back_is_not_counted_again_for_the_failure() -> None:
    drained(11, 0)
    returned(11, 60)
    broke(12, 60)

    assert interruptions() == {"jobs": 1, "drains": 1, "interrupted_by_drains": 1, "interrupted_by_failures": 0}


def test_the_order_of_the_events_within_one_instant_does_not_change_the_count() -> None:
    drained(11, 0)
    drained(12, 60)  # written before the return of the same instant: the job never had all its hosts
    returned(11, 60)
    returned(12, 120)

    assert interruptions()["interrupted_by_drains"] == 1


def test_a_job_that_ran_again_between_two_drains_is_interrupted_twice() -> None:
    drained(11, 0)
    returned(11, 60)
    drained(12, 65)  # one tick later: the job had its hosts back and ran
    returned(12, 120)
    broke(11, 180)

    assert interruptions() == {"jobs": 1, "drains": 2, "interrupted_by_drains": 2, "interrupted_by_failures": 1}
