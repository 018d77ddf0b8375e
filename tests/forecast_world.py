"""A virtual clock that drives a pool's trains and simulated work, for tests that hold the
per-upgrade forecast against what the train's visits actually did."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.driving import instant_simulator
from trains.models import Cycle, Train, Upgrade
from trains.services.tick import trains_tick
from trains.services.upgrade_scopes import scope_host_ids
from trains.services.upgrades import hosts_below_target


class World:
    """Now, moved on by each tick (use under `clock.use_clock(lambda: world.now[0])`)."""

    def __init__(self) -> None:
        self.now = [timezone.now()]
        self.reached: dict[int, dt.datetime] = {}

    def tick(self, pool, rounds: int = 1, step_s: float = 1.0) -> None:
        for _ in range(rounds):
            trains_tick()
            pool_tick(pool_id=pool.pk, kick=False)
            simulated_work_step()
            self.now[0] += dt.timedelta(seconds=step_s)

    def until_every_host(
        self, pool, train: Train, upgrades: list[Upgrade], *, step_s: float, max_rounds: int = 3000
    ) -> dict[int, int]:
        """Tick until no host of each upgrade's scope is below its target: per upgrade, the cycle open
        when it got there (its time in `reached`)."""
        scopes = {u.pk: scope_host_ids(u) for u in upgrades}
        done: dict[int, int] = {}
        for _ in range(max_rounds):
            self.tick(pool, step_s=step_s)
            for upgrade in upgrades:
                if upgrade.pk not in done and not hosts_below_target(upgrade, scopes[upgrade.pk]).exists():
                    done[upgrade.pk] = newest_cycle(train)
                    self.reached[upgrade.pk] = self.now[0]
            if len(done) == len(upgrades):
                return done
        raise AssertionError(f"not on every host after {max_rounds} ticks: {done}")


def newest_cycle(train: Train) -> int:
    return Cycle.objects.filter(train=train).order_by("-number").values_list("number", flat=True).first() or 0


def timed_simulator(**by_kind: dict) -> None:
    """Simulated work that takes time: a drain, check and return of 600 s together (the overhead)."""
    instant_simulator(drain_seconds=500.0, verify_seconds=50.0, undrain_seconds=50.0, execute_by_kind=by_kind)
