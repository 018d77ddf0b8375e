"""The simulator lets a policy act again at the instant it changed something, as its next beat would
seconds later: no train or rolling queue sits idle with work waiting for the next arrival."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from opsplanner.models import Operation
from simulation.config import SimulationConfig
from simulation.engine import policy_run
from simulation.world import workload_draw
from trains.models import Cycle, Upgrade

pytestmark = pytest.mark.django_db

# Four domains, an upgrade every few hours: some arrive after their domain's visit, so a cycle ends
# with work left for the next one.
BUSY = SimulationConfig(
    hosts=40,
    pools=1,
    hosts_per_domain=10,
    days=3,
    upgrades_per_week=21,
    upgrades_at_start=1,
    host_failures_per_day=0,
    upgrade_failure_rate=0,
    verify_failure_rate=0,
    optout_windows_per_week=0,
    cycle_slo_hours=24,
    seed=3,
)


def active_at(at: dt.datetime) -> bool:
    """Some upgrade had arrived by `at` and had not reached every host."""
    return any(
        created <= at and (finished is None or finished > at)
        for created, finished in Upgrade.objects.values_list("created_at", "finished_at")
    )


def test_a_train_that_ends_its_cycle_with_work_left_opens_the_next_at_the_same_instant() -> None:
    policy_run(BUSY, workload_draw(BUSY), "trains")

    cycles = list(Cycle.objects.order_by("number").values_list("started_at", "ended_at"))
    follow_ons = [
        (ended, next_started)
        for (_, ended), (next_started, _) in itertools.pairwise(cycles)
        if ended is not None and active_at(ended)
    ]
    assert follow_ons, f"no cycle ended with work left; the test proves nothing: {cycles}"
    assert all(started == ended for ended, started in follow_ons), follow_ons


def test_a_rolling_queue_starts_its_next_upgrade_at_the_instant_the_previous_finished() -> None:
    log = policy_run(BUSY, workload_draw(BUSY), "rolling")

    finished = sorted(((r.finished, r) for r in log.policy.rollouts() if r.finished is not None), key=lambda p: p[0])
    first_operation = dict(Operation.objects.order_by("-created_at").values_list("reason", "created_at"))
    waiting = [
        (done, first_operation[f"{log.policy.label}: {nxt.component} {nxt.version}"])
        for (done, _), (_, nxt) in itertools.pairwise(finished)
        if nxt.arrived <= done
    ]
    assert waiting, "no upgrade waited for the one before it; the test proves nothing"
    assert all(started == finished for finished, started in waiting), waiting
