"""Stranded host-hours: while a job is interrupted (at least one of its hosts out of service), the
host-hours of its hosts still in service, which run nothing for it. They are charged to what began
the interruption (a drain or a failure), as the interrupted jobs are counted; an interruption still
open when the run ends counts up to the end."""

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

CONFIG = SimulationConfig(hosts=6, pools=1, hosts_per_domain=2, days=1)
POOL_ID = 1
HOSTS = [11, 12, 13, 14, 15, 16]
PAIR = {100: [11, 12]}  # a job on two hosts; 13-16 run no job
TRIO = {100: [11, 12, 13]}


class Idle(Policy):
    """A policy that did nothing: the measures read only the events a test writes."""

    def rollouts(self) -> list[Rollout]:
        return []


def moved(host: int, hours: float, before: str, after: str) -> None:
    """A host's state change, as the tick records it (events of one instant in the order written)."""
    Event.objects.create(
        created_at=CONFIG.start + dt.timedelta(hours=hours), kind="host.state_changed", actor="simulator",
        subject_type="fleet.host", subject_id=host, pool_id=POOL_ID, host_id=host, data={"from": before, "to": after},
    )  # fmt: skip


def drained(host: int, hours: float) -> None:
    moved(host, hours, HostState.IN_SERVICE, HostState.DRAINING)


def broke(host: int, hours: float) -> None:
    moved(host, hours, HostState.IN_SERVICE, HostState.FAILED)


def returned(host: int, hours: float) -> None:
    moved(host, hours, HostState.RETURNING, HostState.IN_SERVICE)


def measured(jobs: dict[int, list[int]]) -> dict[str, Any]:
    world = World(pools=[SimPool(id=POOL_ID, name="sim-00", number=0, host_ids=HOSTS, domain_ids=[])])
    world.jobs = jobs
    samples = [Sample(at=CONFIG.start, counts={POOL_ID: (len(HOSTS), 0, 0)})]
    (pool,) = run_measure(CONFIG, RunLog(policy=Idle(CONFIG, world), world=world, samples=samples))["pools"]
    keys = ("interrupted_by_drains", "interrupted_by_failures")
    return {key: pool[key] for key in (*keys, "stranded_host_hours_by_drains", "stranded_host_hours_by_failures")}


def stranded(jobs: dict[int, list[int]]) -> tuple[float, float]:
    pool = measured(jobs)
    return pool["stranded_host_hours_by_drains"], pool["stranded_host_hours_by_failures"]


def test_a_job_on_two_hosts_one_drained_for_two_hours_strands_the_other_for_two_hours() -> None:
    drained(11, 1)
    returned(11, 3)

    assert stranded(PAIR) == (2.0, 0.0)


def test_hosts_out_at_once_strand_only_the_hosts_left_in_service() -> None:
    drained(11, 0)  # 0-1 h: 11 out, 12 and 13 idle (2 host-hours)
    drained(12, 1)  # 1-2 h: 11 and 12 out, 13 idle (1)
    returned(11, 2)  # 2-3 h: 12 out, 11 and 13 idle (2)
    returned(12, 3)

    assert stranded(TRIO) == (5.0, 0.0)


def test_a_job_with_every_host_out_strands_nothing() -> None:
    drained(11, 0)
    drained(12, 0)
    returned(11, 2)
    returned(12, 2)

    assert stranded(PAIR) == (0.0, 0.0)


def test_the_next_domain_drained_in_the_instant_the_last_came_back_continues_the_stranding() -> None:
    drained(11, 0)
    returned(11, 1)
    drained(12, 1)  # back to back: one interruption, 12 out for an hour after 11 was
    returned(12, 2)

    assert measured(PAIR) == {
        "interrupted_by_drains": 1, "interrupted_by_failures": 0,
        "stranded_host_hours_by_drains": 2.0, "stranded_host_hours_by_failures": 0.0,
    }  # fmt: skip


def test_the_time_a_job_ran_between_two_interruptions_is_not_stranded() -> None:
    drained(11, 0)
    returned(11, 1)
    drained(12, 1.5)  # the job had all its hosts for half an hour and ran
    returned(12, 2.5)

    assert measured(PAIR) == {
        "interrupted_by_drains": 2, "interrupted_by_failures": 0,
        "stranded_host_hours_by_drains": 2.0, "stranded_host_hours_by_failures": 0.0,
    }  # fmt: skip


def test_stranding_is_charged_to_what_began_the_interruption() -> None:
    broke(11, 0)  # a failure interrupts the job for an hour
    returned(11, 1)
    drained(12, 2)  # a drain, during which 11 breaks: still the drain's interruption
    broke(11, 2.5)
    returned(12, 3)  # 12 back; 11, broken, keeps the job out until it is repaired
    returned(11, 4)

    # failure: 12 idle 0-1 h (1); drain: 11 idle 2-2.5 h (0.5), none idle 2.5-3 h, 12 idle 3-4 h (1).
    assert stranded(PAIR) == (1.5, 1.0)


def test_an_interruption_still_open_at_the_end_is_counted_up_to_the_end() -> None:
    drained(11, 21.5)  # never returned in the one simulated day

    assert stranded(PAIR) == (2.5, 0.0)


def test_hosts_of_no_job_strand_nothing() -> None:
    drained(14, 0)
    returned(14, 5)

    assert stranded(PAIR) == (0.0, 0.0)
